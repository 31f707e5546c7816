// The packed products in a build that cannot run them (not for x86-64, or without OpenMP; CMake passes the
// reason): model.cpu_kernels = auto takes another kind, and packed is refused with the reason.
#include <stdexcept>

#include "models/packed_gemm.h"

namespace ddp::models {

std::string packed_gemm_missing() {
  return DDPTRAIN_PACKED_GEMM_MISSING;
}

bool cpu_has_avx512() {
  return false;
}

PackedTiles best_packed_tiles() {
  return PackedTiles::kAvx2;
}

void PackedMatrix::pack(bool /*trans*/, int /*k*/, int /*n*/, const float* /*b*/, int /*ldb*/, int /*rows*/,
                        PackedTiles /*tiles*/) {
  throw std::runtime_error(packed_gemm_missing());
}

void packed_gemm(bool /*trans_a*/, int /*m*/, const float* /*a*/, int /*lda*/, const PackedMatrix& /*b*/,
                 bool /*accumulate*/, float* /*c*/, int /*ldc*/) {
  throw std::runtime_error(packed_gemm_missing());
}

}  // namespace ddp::models

#include <cblas.h>

#include <cstdlib>

#include "models/blas_threads.h"

namespace ddp::models {

bool set_blas_threads(int threads) {
  openblas_set_num_threads(threads);
  return true;
}

std::string blas_description() {
  return openblas_get_config();
}

std::string blas_kernels_hint() {
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  return openblas_core_hint(openblas_get_corename(), avx2_fma, avx512, coretype != nullptr ? coretype : "");
}

}  // namespace ddp::models

// The FMA kernels in a build for another architecture than x86-64: scalar only (no vector width is known).
#include "models/fma_rate.h"

namespace ddp::models {

FmaWidth widest_fma() {
  return FmaWidth::kScalar;
}

int fma_lanes(FmaWidth /*width*/) {
  return 1;
}

float fma_rounds(FmaWidth /*width*/, long rounds) {
  return detail::fma_rounds_scalar(rounds);
}

bool avx512_fma_outpaces_avx2() {
  return false;
}

void settle_avx512_fma_outpaces_avx2(bool /*verdict*/) {}

std::optional<bool> known_avx512_fma_verdict() {
  return std::nullopt;
}

}  // namespace ddp::models

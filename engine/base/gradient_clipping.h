// Clipping by the global norm (train.clip_norm): the scale every gradient is multiplied by, from the squared
// L2 norm of the whole averaged gradient, shared by the all-reduce step and the parameter server's owners
// (which add up their shards' squares) so that both clip alike.
#pragma once

#include <cmath>

namespace ddp {

// clip_norm / norm where the norm exceeds clip_norm, else 1 (and 1 with clipping off, clip_norm <= 0).
inline float clipping_scale(double squared_norm, double clip_norm) {
  if (clip_norm <= 0) return 1.0f;
  const double norm = std::sqrt(squared_norm);
  return norm > clip_norm ? static_cast<float>(clip_norm / norm) : 1.0f;
}

}  // namespace ddp

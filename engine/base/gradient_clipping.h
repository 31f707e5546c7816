// Clipping by the global norm (train.clip_norm): the scale every gradient is multiplied by, from the squared
// L2 norm of the whole averaged gradient, shared by the all-reduce step (on the host or the GPU) and the
// parameter server's owners (which add up their shards' squares) so that all clip alike.
#pragma once

#include <cmath>
#include <cstddef>

#include "engine/base/host_device.h"

namespace ddp {

// The order of the squared norm's sum, which the host loop and the GPU kernel both follow so that every
// rank of an all-reduce job, CPU or GPU, gets the same norm to the bit (and so the same update): lane l adds
// g[i]^2 for i = l, l + kNormLanes, ... in increasing i, in double, each product and sum rounded on its own;
// then the lanes are added in order. Skipping elements that are exactly zero changes nothing (+0 adds
// exactly), so a sparse gradient may leave its untouched rows out.
constexpr std::size_t kNormLanes = 2048;

DDP_HOST_DEVICE double add_square(double sum, float g) {
  const double x = static_cast<double>(g);
  return sum + x * x;
}

// clip_norm / norm where the norm exceeds clip_norm, else 1 (and 1 with clipping off, clip_norm <= 0).
DDP_HOST_DEVICE float clipping_scale(double squared_norm, double clip_norm) {
  if (clip_norm <= 0) return 1.0f;
  const double norm = ::sqrt(squared_norm);
  return norm > clip_norm ? static_cast<float>(clip_norm / norm) : 1.0f;
}

}  // namespace ddp

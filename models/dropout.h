// Dropout masks from a counter rather than a generator's state: element i of a draw depends only on the
// draw's stream (from the run's key and the draw's number) and i, so a mask is the same on any thread count,
// in float and double, and after a resume that sets the same key. Inverted dropout: a kept element is scaled
// by 1 / (1 - rate), so evaluation (which drops nothing) needs no rescaling.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/base/host_device.h"

namespace ddp::models {

// splitmix64's finalizer.
DDP_HOST_DEVICE uint64_t dropout_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The stream of draw number `draw` under `key`.
DDP_HOST_DEVICE uint64_t dropout_stream(uint64_t key, uint64_t draw) {
  return dropout_mix(key ^ dropout_mix(draw));
}

// The key of a training step's masks: the run's seed, the rank (each its own masks) and the step.
DDP_HOST_DEVICE uint64_t dropout_step_key(uint64_t seed, int rank, int64_t step) {
  return dropout_mix(dropout_mix(seed ^ 0xD209A7C0ULL) ^
                     dropout_mix(static_cast<uint64_t>(rank) << 40 ^ static_cast<uint64_t>(step)));
}

// Element i's mask value: 0 with probability rate (to 2^-24), else 1 / (1 - rate).
template <typename Scalar>
DDP_HOST_DEVICE Scalar dropout_mask_value(uint64_t stream, std::size_t i, double rate) {
  const auto threshold = static_cast<uint64_t>(rate * 16777216.0);
  return (dropout_mix(stream + i) >> 40) >= threshold ? static_cast<Scalar>(1.0 / (1.0 - rate)) : Scalar(0);
}

}  // namespace ddp::models

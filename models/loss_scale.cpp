#include "models/loss_scale.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "models/replica.h"

namespace ddp::models {

void LossScale::update(bool applied) {
  if (!applied) {
    ++skipped_;
    scale_ = std::max(kSmallest, scale_ * 0.5f);
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ < kGrowthInterval) return;
  scale_ = std::min(kLargest, scale_ * 2.0f);
  clean_steps_ = 0;
}

std::string LossScale::invalid(const State& state) {
  int exponent = 0;
  const bool power_of_two = std::frexp(state.scale, &exponent) == 0.5f;
  if (!(state.scale >= kSmallest && state.scale <= kLargest) || !power_of_two)
    return fmt::format("loss scale {} is not a power of two in [{}, {}]", state.scale, kSmallest, kLargest);
  if (state.clean_steps < 0 || state.clean_steps >= kGrowthInterval)
    return fmt::format("{} clean steps is outside [0, {})", state.clean_steps, kGrowthInterval);
  if (state.skipped < 0) return fmt::format("{} skipped steps is negative", state.skipped);
  return "";
}

void LossScale::restore(const State& state) {
  if (const std::string why = invalid(state); !why.empty()) throw std::invalid_argument("LossScale: " + why);
  scale_ = state.scale;
  clean_steps_ = state.clean_steps;
  skipped_ = state.skipped;
}

// Host memory: a scan. The GPU replica counts on its stream instead.
bool Replica::gradients_finite() {
  const std::span<const float> grads = this->grads();
  return std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
}

}  // namespace ddp::models

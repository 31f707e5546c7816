#include "models/loss_scale.h"

#include <algorithm>
#include <cmath>

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

// Host memory: a scan. The GPU replica counts on its stream instead.
bool Replica::gradients_finite() {
  const std::span<const float> grads = this->grads();
  return std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); });
}

}  // namespace ddp::models

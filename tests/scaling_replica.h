// A replica that scales its loss as fp16 does (models/loss_scale.h), with a backward that overflows wherever
// the scale is above `fits`: the first steps are skipped, halving the scale each time, until it fits. The
// gradients themselves are the wrapped replica's; only the verdict on them and the scale are emulated.
#pragma once

#include <memory>
#include <optional>
#include <utility>

#include "models/loss_scale.h"
#include "tests/forwarding_replica.h"

namespace ddp::testing {

class ReplicaThatScalesItsLoss final : public ForwardingReplica {
 public:
  ReplicaThatScalesItsLoss(std::unique_ptr<models::Replica> inner, float fits,
                           float initial_scale = models::LossScale::kInitial)
      : ForwardingReplica(std::move(inner)), fits_(fits) {
    scale_.restore({initial_scale, 0, 0});
  }

  bool gradients_finite() override { return scale_.scale() <= fits_; }
  void after_update(bool applied) override { scale_.update(applied); }
  std::optional<models::LossScale::State> loss_scaling() const override { return scale_.state(); }
  void restore_loss_scale(const models::LossScale::State& state) override { scale_.restore(state); }

 private:
  float fits_;
  models::LossScale scale_;
};

}  // namespace ddp::testing

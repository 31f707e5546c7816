// Dynamic loss scaling for model.precision = fp16, as mixed-precision training does it (PyTorch's GradScaler,
// Apex): IEEE half holds magnitudes from 6e-8 to 65504, and small gradients would vanish below it. So the
// replica multiplies the loss gradient by a power of two S before its half-precision backward and divides
// S out of every gradient in float32 (exact). A step whose averaged gradient is not finite overflowed
// somewhere on some rank: every rank skips its update (they all see the same average) and halves S; after
// kGrowthInterval applied steps in a row S doubles again, so it stays near the largest scale that fits.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::models {

class LossScale {
 public:
  static constexpr float kInitial = 65536.0f;     // 2^16, PyTorch's init_scale
  static constexpr float kLargest = 16777216.0f;  // 2^24: past it every half gradient would overflow anyway
  static constexpr float kSmallest = 1.0f;
  static constexpr int64_t kGrowthInterval = 2000;  // PyTorch's growth_interval

  // What a checkpoint keeps, so that a resumed run scales (and skips) as the uninterrupted one would.
  struct State {
    float scale = kInitial;
    int64_t clean_steps = 0;  // applied steps since the scale last changed, below kGrowthInterval
    int64_t skipped = 0;      // steps skipped so far
  };

  float scale() const { return scale_; }
  // After a step: `applied` false when its averaged gradient was not finite (the update was skipped).
  void update(bool applied);
  int64_t skipped() const { return skipped_; }
  State state() const { return {scale_, clean_steps_, skipped_}; }
  void restore(const State& state);
  // Why `state` is none that update() could reach (a power of two in [kSmallest, kLargest], clean steps in
  // [0, kGrowthInterval), skipped >= 0), or "" where it is one.
  static std::string invalid(const State& state);

 private:
  float scale_ = kInitial;
  int64_t clean_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace ddp::models

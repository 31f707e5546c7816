#include "engine/optimizer.h"

#include <cmath>

#include "engine/errors.h"

namespace ddp::engine {
namespace {

void expect_buffers(const OptimizerState& state, const std::vector<std::string>& names, std::size_t size,
                    const std::string& optimizer) {
  bool ok = state.buffers.size() == names.size();
  for (std::size_t i = 0; ok && i < names.size(); ++i) {
    ok = state.buffers[i].first == names[i] && state.buffers[i].second.size() == size;
  }
  if (!ok) throw UserError("checkpoint: optimizer state does not match train.optimizer = " + optimizer);
}

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerSettings& s, std::size_t size) : s_(s), m_(size, 0.0f), v_(size, 0.0f) {}

  void step(std::span<float> params, std::span<const float> grads) override {
    DDP_CHECK(params.size() == m_.size() && grads.size() == m_.size());
    ++iterations_;
    const double t = static_cast<double>(iterations_);
    const float lr_t = static_cast<float>(s_.learning_rate * std::sqrt(1.0 - std::pow(s_.beta2, t)) /
                                          (1.0 - std::pow(s_.beta1, t)));
    const float b1 = static_cast<float>(s_.beta1);
    const float b2 = static_cast<float>(s_.beta2);
    const float eps = static_cast<float>(s_.epsilon);
    float* __restrict p = params.data();
    const float* __restrict g = grads.data();
    float* __restrict m = m_.data();
    float* __restrict v = v_.data();
    const std::size_t n = m_.size();
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }

  OptimizerState state() const override { return {iterations_, {{"m", m_}, {"v", v_}}}; }
  void load_state(const OptimizerState& state) override {
    expect_buffers(state, {"m", "v"}, m_.size(), "adam");
    iterations_ = state.iterations;
    m_ = state.buffers[0].second;
    v_ = state.buffers[1].second;
  }
  std::string name() const override { return "adam"; }

 private:
  OptimizerSettings s_;
  int64_t iterations_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerSettings& s, std::size_t size) : s_(s), velocity_(size, 0.0f) {}

  void step(std::span<float> params, std::span<const float> grads) override {
    DDP_CHECK(params.size() == velocity_.size() && grads.size() == velocity_.size());
    ++iterations_;
    const float lr = static_cast<float>(s_.learning_rate);
    const float mu = static_cast<float>(s_.momentum);
    float* __restrict p = params.data();
    const float* __restrict g = grads.data();
    float* __restrict vel = velocity_.data();
    for (std::size_t i = 0; i < velocity_.size(); ++i) {
      vel[i] = mu * vel[i] - lr * g[i];
      p[i] += vel[i];
    }
  }

  OptimizerState state() const override { return {iterations_, {{"velocity", velocity_}}}; }
  void load_state(const OptimizerState& state) override {
    expect_buffers(state, {"velocity"}, velocity_.size(), "sgd");
    iterations_ = state.iterations;
    velocity_ = state.buffers[0].second;
  }
  std::string name() const override { return "sgd"; }

 private:
  OptimizerSettings s_;
  int64_t iterations_ = 0;
  std::vector<float> velocity_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSettings& settings, std::size_t size) {
  if (settings.name == "adam") return std::make_unique<Adam>(settings, size);
  if (settings.name == "sgd") return std::make_unique<Sgd>(settings, size);
  throw UserError("train.optimizer = " + settings.name + ": expected adam or sgd");
}

}  // namespace ddp::engine

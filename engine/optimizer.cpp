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

}  // namespace

void Optimizer::step(std::span<float> params, std::span<const float> grads, const SparseRows* sparse) {
  DDP_CHECK(params.size() == size() && grads.size() == size());
  begin_step();
  if (!lazy_rows_ || sparse == nullptr) {
    update_range(params.data(), grads.data(), 0, size());
    return;
  }
  DDP_CHECK(sparse->offset + sparse->count * sparse->width <= size());
  update_range(params.data(), grads.data(), 0, sparse->offset);
  for (const int32_t row : sparse->rows) {
    const std::size_t begin = sparse->offset + static_cast<std::size_t>(row) * sparse->width;
    update_range(params.data(), grads.data(), begin, begin + sparse->width);
  }
  update_range(params.data(), grads.data(), sparse->offset + sparse->count * sparse->width, size());
}

namespace {

class Adam final : public Optimizer {
 public:
  Adam(const OptimizerSettings& s, std::size_t size)
      : Optimizer(s.lazy_rows), s_(s), m_(size, 0.0f), v_(size, 0.0f) {}

 protected:
  void begin_step() override {
    ++iterations_;
    const double t = static_cast<double>(iterations_);
    lr_t_ = static_cast<float>(s_.learning_rate * std::sqrt(1.0 - std::pow(s_.beta2, t)) /
                               (1.0 - std::pow(s_.beta1, t)));
  }

  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    const float b1 = static_cast<float>(s_.beta1);
    const float b2 = static_cast<float>(s_.beta2);
    const float eps = static_cast<float>(s_.epsilon);
    const float lr_t = lr_t_;
    float* __restrict p = params;
    const float* __restrict g = grads;
    float* __restrict m = m_.data();
    float* __restrict v = v_.data();
    for (std::size_t i = begin; i < end; ++i) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  std::size_t size() const override { return m_.size(); }

 public:
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
  float lr_t_ = 0;
  std::vector<float> m_;
  std::vector<float> v_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerSettings& s, std::size_t size) : Optimizer(s.lazy_rows), s_(s), velocity_(size, 0.0f) {}

 protected:
  void begin_step() override { ++iterations_; }
  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    const float lr = static_cast<float>(s_.learning_rate);
    const float mu = static_cast<float>(s_.momentum);
    float* __restrict p = params;
    const float* __restrict g = grads;
    float* __restrict vel = velocity_.data();
    for (std::size_t i = begin; i < end; ++i) {
      vel[i] = mu * vel[i] - lr * g[i];
      p[i] += vel[i];
    }
  }
  std::size_t size() const override { return velocity_.size(); }

 public:
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

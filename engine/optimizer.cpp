#include "engine/optimizer.h"

#include <cmath>

#include "engine/base/errors.h"
#include "engine/optimizer_math.h"
#include "models/fast_math.h"

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

// The update loops are memory-bound over millions of elements: compiled for AVX2 too (chosen at load time),
// and vectorizable because the build does not keep errno for sqrt (-fno-math-errno). The element-wise math
// is the CUDA kernels' (optimizer_math.h).
DDP_VECTOR_CLONES void adam_update(float* __restrict p, const float* __restrict g, float* __restrict m,
                                   float* __restrict v, std::size_t n, AdamCoefficients c) {
  for (std::size_t i = 0; i < n; ++i) adam_update_one(p[i], g[i], m[i], v[i], c);
}

DDP_VECTOR_CLONES void sgd_update(float* __restrict p, const float* __restrict g, float* __restrict velocity,
                                  std::size_t n, float lr, float momentum) {
  for (std::size_t i = 0; i < n; ++i) sgd_update_one(p[i], g[i], velocity[i], lr, momentum);
}

}  // namespace

namespace {

// An optimizer over host memory: one element-wise update, applied to the whole buffer or, with lazy rows, to
// all but the untouched rows of the sparse matrix.
class HostOptimizer : public Optimizer {
 public:
  void step(std::span<float> params, std::span<const float> grads, const TouchedRows* sparse) final {
    DDP_CHECK(params.size() == size() && grads.size() == size());
    begin_step();
    if (!lazy_update_ || sparse == nullptr) {
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

 protected:
  explicit HostOptimizer(bool lazy_update) : lazy_update_(lazy_update) {}
  // Called once per step before update_range().
  virtual void begin_step() = 0;
  // Updates elements [begin, end) of the flat buffer.
  virtual void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) = 0;
  virtual std::size_t size() const = 0;

 private:
  bool lazy_update_;
};

class Adam final : public HostOptimizer {
 public:
  Adam(const OptimizerSettings& s, std::size_t size)
      : HostOptimizer(s.lazy_update), s_(s), m_(size, 0.0f), v_(size, 0.0f) {}

 protected:
  void begin_step() override { coefficients_ = adam_coefficients(s_, ++iterations_); }

  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    adam_update(params + begin, grads + begin, m_.data() + begin, v_.data() + begin, end - begin,
                coefficients_);
  }
  std::size_t size() const override { return m_.size(); }

 public:
  OptimizerState state() const override { return {iterations_, {{"m", m_}, {"v", v_}}}; }
  int64_t iterations() const override { return iterations_; }
  void visit_state(const StateBufferVisitor& visit) const override {
    visit("m", m_);
    visit("v", v_);
  }
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
  AdamCoefficients coefficients_{};
  std::vector<float> m_;
  std::vector<float> v_;
};

class Sgd final : public HostOptimizer {
 public:
  Sgd(const OptimizerSettings& s, std::size_t size)
      : HostOptimizer(s.lazy_update), s_(s), velocity_(size, 0.0f) {}

 protected:
  void begin_step() override { ++iterations_; }
  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    sgd_update(params + begin, grads + begin, velocity_.data() + begin, end - begin,
               static_cast<float>(s_.learning_rate), static_cast<float>(s_.momentum));
  }
  std::size_t size() const override { return velocity_.size(); }

 public:
  OptimizerState state() const override { return {iterations_, {{"velocity", velocity_}}}; }
  int64_t iterations() const override { return iterations_; }
  void visit_state(const StateBufferVisitor& visit) const override { visit("velocity", velocity_); }
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

void Optimizer::visit_state(const StateBufferVisitor& visit) const {
  for (const auto& [name, buffer] : state().buffers) visit(name, buffer);
}

AdamCoefficients adam_coefficients(const OptimizerSettings& s, int64_t iteration) {
  const double t = static_cast<double>(iteration);
  const double lr_t = s.learning_rate * std::sqrt(1.0 - std::pow(s.beta2, t)) / (1.0 - std::pow(s.beta1, t));
  return {static_cast<float>(s.beta1), static_cast<float>(s.beta2), static_cast<float>(s.epsilon),
          static_cast<float>(lr_t)};
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerSettings& settings, std::size_t size) {
  if (settings.name == "adam") return std::make_unique<Adam>(settings, size);
  if (settings.name == "sgd") return std::make_unique<Sgd>(settings, size);
  throw UserError("train.optimizer = " + settings.name + ": expected adam or sgd");
}

void check_optimizer_state(const OptimizerSettings& settings, std::size_t size, const OptimizerState& state,
                           const std::string& source) {
  // The optimizer names its own buffers; an empty one lists them.
  const OptimizerState expected = make_optimizer(settings, 0)->state();
  bool ok = state.buffers.size() == expected.buffers.size();
  for (std::size_t i = 0; ok && i < state.buffers.size(); ++i) {
    ok = state.buffers[i].first == expected.buffers[i].first && state.buffers[i].second.size() == size;
  }
  if (!ok) {
    std::string names;
    for (const auto& buffer : expected.buffers) names += (names.empty() ? "" : ", ") + buffer.first;
    throw UserError(source + ": the optimizer state does not match train.optimizer = " + settings.name +
                    " (expected the buffers " + names + " of " + std::to_string(size) + " values each)");
  }
}

}  // namespace ddp::engine

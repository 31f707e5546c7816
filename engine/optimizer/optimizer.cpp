#include "engine/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/fast_math.h"
#include "engine/base/parallel_loops.h"
#include "engine/optimizer/optimizer_math.h"

namespace ddp::optim {
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

DDP_VECTOR_CLONES void adam_decay(float* __restrict p, float* __restrict m, float* __restrict v,
                                  std::size_t n, AdamCoefficients c) {
  for (std::size_t i = 0; i < n; ++i) adam_decay_one(p[i], m[i], v[i], c);
}

DDP_VECTOR_CLONES void sgd_update(float* __restrict p, const float* __restrict g, float* __restrict velocity,
                                  std::size_t n, SgdCoefficients c) {
  for (std::size_t i = 0; i < n; ++i) sgd_update_one(p[i], g[i], velocity[i], c);
}

DDP_VECTOR_CLONES void sgd_decay(float* __restrict p, float* __restrict velocity, std::size_t n,
                                 SgdCoefficients c) {
  for (std::size_t i = 0; i < n; ++i) sgd_decay_one(p[i], velocity[i], c);
}

// Below this many elements a loop is not worth a second thread (the pool's wake-up costs microseconds).
constexpr std::size_t kMinElementsPerThread = 1 << 16;

}  // namespace

namespace {

// An optimizer over host memory: one element-wise update over the flat buffer, split among the rank's
// compute threads. A sparse matrix's rows that had no gradient this step are left alone (lazy updates) or
// decayed without reading their gradient (dense: the same bits as the full update with g = 0, less memory
// traffic).
class HostOptimizer : public Optimizer {
 public:
  void step(std::span<float> params, std::span<const float> grads, const TouchedRows* sparse,
            float gradient_scale) final {
    DDP_CHECK(params.size() == size() && grads.size() == size());
    DDP_CHECK(sparse == nullptr || sparse->offset + sparse->count * sparse->width <= size());
    begin_step(gradient_scale);
    parallel_ranges(size(), /*align=*/16, kMinElementsPerThread, [&](std::size_t begin, std::size_t end) {
      if (sparse == nullptr) {
        update_range(params.data(), grads.data() + begin, begin, end);
      } else {
        update_with_rows(params.data(), grads.data(), begin, end, *sparse);
      }
    });
  }

  void step_pieces(std::span<float> params, std::span<const GradientPiece> pieces,
                   float gradient_scale) final {
    DDP_CHECK(params.size() == size());
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      DDP_CHECK(pieces[i].offset + pieces[i].values.size() <= size());
      DDP_CHECK(i == 0 || pieces[i - 1].offset + pieces[i - 1].values.size() <= pieces[i].offset);
    }
    begin_step(gradient_scale);
    parallel_ranges(size(), /*align=*/16, kMinElementsPerThread, [&](std::size_t begin, std::size_t end) {
      update_with_pieces(params.data(), pieces, begin, end);
    });
  }

 protected:
  explicit HostOptimizer(bool lazy_update) : lazy_update_(lazy_update) {}
  // Called once per step before update_range().
  virtual void begin_step(float gradient_scale) = 0;
  // Updates elements [begin, end) of the flat buffer; `grads` points at element begin's gradient.
  virtual void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) = 0;
  // Updates elements [begin, end) as if their gradient were zero.
  virtual void decay_range(float* params, std::size_t begin, std::size_t end) = 0;
  virtual std::size_t size() const = 0;

 private:
  // [begin, end) of the flat buffer, in which only `sparse`'s rows of its matrix had a gradient.
  void update_with_rows(float* params, const float* grads, std::size_t begin, std::size_t end,
                        const TouchedRows& sparse) {
    const std::size_t matrix_begin = sparse.offset, matrix_end = sparse.offset + sparse.count * sparse.width;
    if (begin < std::min(end, matrix_begin))
      update_range(params, grads + begin, begin, std::min(end, matrix_begin));
    const std::size_t inside_begin = std::max(begin, matrix_begin), inside_end = std::min(end, matrix_end);
    if (inside_begin < inside_end) update_matrix_rows(params, grads, inside_begin, inside_end, sparse);
    const std::size_t after = std::max(begin, matrix_end);
    if (after < end) update_range(params, grads + after, after, end);
  }

  // [begin, end) of the flat buffer, whose gradient is `pieces` and zero elsewhere.
  void update_with_pieces(float* params, std::span<const GradientPiece> pieces, std::size_t begin,
                          std::size_t end) {
    std::size_t at = begin;  // everything before `at` is done
    auto piece = std::lower_bound(
        pieces.begin(), pieces.end(), begin,
        [](const GradientPiece& p, std::size_t x) { return p.offset + p.values.size() <= x; });
    for (; piece != pieces.end() && piece->offset < end; ++piece) {
      const std::size_t from = std::max(at, piece->offset);
      const std::size_t to = std::min(end, piece->offset + piece->values.size());
      if (from >= to) continue;  // an empty piece
      if (at < from) decay_range(params, at, from);
      update_range(params, piece->values.data() + (from - piece->offset), from, to);
      at = to;
    }
    if (at < end) decay_range(params, at, end);
  }

  // [begin, end) inside `sparse`'s matrix.
  void update_matrix_rows(float* params, const float* grads, std::size_t begin, std::size_t end,
                          const TouchedRows& sparse) {
    auto row_start = [&](int32_t row) {
      return sparse.offset + static_cast<std::size_t>(row) * sparse.width;
    };
    std::size_t at = begin;  // everything before `at` is done
    auto first =
        std::lower_bound(sparse.rows.begin(), sparse.rows.end(), at,
                         [&](int32_t row, std::size_t x) { return row_start(row) + sparse.width <= x; });
    for (auto row = first; row != sparse.rows.end() && row_start(*row) < end; ++row) {
      // The touched rows' gradients are scattered over the matrix, each read in a few cache lines that the
      // hardware's stream prefetchers never see coming: ask for the next row's while this gap decays (it
      // halved what the touched rows added to dense Adam over the IMDB embedding).
      if (row + 1 != sparse.rows.end()) {
        const float* next = grads + row_start(*(row + 1));
        for (std::size_t k = 0; k < sparse.width; k += 64 / sizeof(float)) __builtin_prefetch(next + k);
      }
      const std::size_t row_begin = std::max(at, row_start(*row));
      const std::size_t row_end = std::min(end, row_start(*row) + sparse.width);
      if (!lazy_update_ && at < row_begin) decay_range(params, at, row_begin);
      update_range(params, grads + row_begin, row_begin, row_end);
      at = row_end;
    }
    if (!lazy_update_ && at < end) decay_range(params, at, end);
  }

  bool lazy_update_;
};

class Adam final : public HostOptimizer {
 public:
  Adam(const OptimizerSettings& s, std::size_t size)
      : HostOptimizer(s.lazy_update), s_(s), m_(size, 0.0f), v_(size, 0.0f) {}

 protected:
  void begin_step(float gradient_scale) override {
    coefficients_ = adam_coefficients(s_, ++iterations_, gradient_scale);
  }

  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    adam_update(params + begin, grads, m_.data() + begin, v_.data() + begin, end - begin, coefficients_);
  }
  void decay_range(float* params, std::size_t begin, std::size_t end) override {
    adam_decay(params + begin, m_.data() + begin, v_.data() + begin, end - begin, coefficients_);
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
  void begin_step(float gradient_scale) override {
    coefficients_ = sgd_coefficients(s_, ++iterations_, gradient_scale);
  }
  void update_range(float* params, const float* grads, std::size_t begin, std::size_t end) override {
    sgd_update(params + begin, grads, velocity_.data() + begin, end - begin, coefficients_);
  }
  void decay_range(float* params, std::size_t begin, std::size_t end) override {
    sgd_decay(params + begin, velocity_.data() + begin, end - begin, coefficients_);
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
  SgdCoefficients coefficients_{};
  std::vector<float> velocity_;
};

}  // namespace

void Optimizer::step_pieces(std::span<float> /*params*/, std::span<const GradientPiece> /*pieces*/,
                            float /*gradient_scale*/) {
  throw std::logic_error("the " + name() + " optimizer in device memory takes dense gradients only");
}

void Optimizer::prepare_step() {
  throw std::logic_error("the " + name() + " optimizer does not split its steps");
}

void Optimizer::enqueue_step(std::span<float> /*params*/, std::span<const float> /*grads*/,
                             double /*clip_norm*/) {
  throw std::logic_error("the " + name() + " optimizer does not split its steps");
}

void Optimizer::visit_state(const StateBufferVisitor& visit) const {
  for (const auto& [name, buffer] : state().buffers) visit(name, buffer);
}

double learning_rate_at(const OptimizerSettings& s, int64_t iteration) {
  const int64_t step = std::max<int64_t>(iteration, 1) - 1;  // 0 for the first update
  // Linear warm-up: (step + 1) / warmup of the rate, reaching it at the last warm-up step.
  if (step < s.warmup_steps) {
    return s.learning_rate * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const int64_t after = step - s.warmup_steps;
  if (s.schedule == "step" && s.decay_steps > 0) {
    return s.learning_rate * std::pow(s.decay_rate, static_cast<double>(after / s.decay_steps));
  }
  if (s.schedule == "cosine" && s.total_steps > s.warmup_steps) {
    const double span = static_cast<double>(s.total_steps - s.warmup_steps);
    const double progress = std::min(1.0, static_cast<double>(after) / span);
    return s.learning_rate * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  }
  return s.learning_rate;
}

AdamCoefficients adam_coefficients(const OptimizerSettings& s, int64_t iteration, float gradient_scale) {
  const double t = static_cast<double>(iteration);
  const double lr = learning_rate_at(s, iteration);
  const double lr_t = lr * std::sqrt(1.0 - std::pow(s.beta2, t)) / (1.0 - std::pow(s.beta1, t));
  return {static_cast<float>(s.beta1),
          static_cast<float>(s.beta2),
          static_cast<float>(s.epsilon),
          static_cast<float>(lr_t),
          static_cast<float>(lr * s.weight_decay),
          gradient_scale};
}

SgdCoefficients sgd_coefficients(const OptimizerSettings& s, int64_t iteration, float gradient_scale) {
  const double lr = learning_rate_at(s, iteration);
  return {static_cast<float>(lr), static_cast<float>(s.momentum), static_cast<float>(lr * s.weight_decay),
          gradient_scale};
}

double squared_norm(std::span<const float> grads, const TouchedRows* sparse) {
  std::vector<double> lanes(kNormLanes, 0.0);
  auto add = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i)
      lanes[i % kNormLanes] = add_square(lanes[i % kNormLanes], grads[i]);
  };
  if (sparse == nullptr) {
    add(0, grads.size());
  } else {
    add(0, sparse->offset);
    for (const int32_t row : sparse->rows) {
      const std::size_t begin = sparse->offset + static_cast<std::size_t>(row) * sparse->width;
      add(begin, begin + sparse->width);
    }
    add(sparse->offset + sparse->count * sparse->width, grads.size());
  }
  double sum = 0;
  for (const double lane : lanes) sum += lane;
  return sum;
}

void Optimizer::step_clipped(std::span<float> params, std::span<const float> grads, const TouchedRows* sparse,
                             double clip_norm) {
  step(params, grads, sparse, clipping_scale(squared_norm(grads, sparse), clip_norm));
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

}  // namespace ddp::optim

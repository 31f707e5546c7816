// The host optimizers and gradient clipping (engine/optimizer/optimizer.h): formulas, rounding, lazy rows,
// state.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/parallel_loops.h"
#include "engine/optimizer/optimizer.h"

namespace ddp::engine {
namespace {

TEST(Optimizer, AdamMatchesKerasFormulaInDouble) {
  optim::OptimizerSettings s;
  s.learning_rate = 0.01;
  auto adam = optim::make_optimizer(s, 3);
  std::vector<float> p{1.0f, -2.0f, 0.5f};
  std::vector<double> ref(p.begin(), p.end()), m(3, 0), v(3, 0);
  const std::vector<std::vector<float>> grads{{0.1f, -0.2f, 0.0f}, {0.3f, 0.1f, -1.0f}, {-0.05f, 0.2f, 0.4f}};
  for (std::size_t t = 1; t <= grads.size(); ++t) {
    adam->step(p, grads[t - 1]);
    const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      ref[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-7);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], ref[i], 1e-6) << i;
  EXPECT_EQ(adam->state().iterations, 3);
}

TEST(Optimizer, SgdMomentum) {
  optim::OptimizerSettings s;
  s.name = "sgd";
  s.learning_rate = 0.1;
  s.momentum = 0.9;
  auto sgd = optim::make_optimizer(s, 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{1.0f};
  sgd->step(p, g);  // v = -0.1, p = 0.9
  sgd->step(p, g);  // v = -0.09 - 0.1 = -0.19, p = 0.71
  EXPECT_NEAR(p[0], 0.71f, 1e-6);
}

TEST(Optimizer, StateRoundTripContinuesIdentically) {
  optim::OptimizerSettings s;
  auto a = optim::make_optimizer(s, 4);
  std::vector<float> pa{1, 2, 3, 4};
  const std::vector<float> g{0.1f, -0.3f, 0.2f, 0.0f};
  a->step(pa, g);
  auto b = optim::make_optimizer(s, 4);
  b->load_state(a->state());
  std::vector<float> pb = pa;
  a->step(pa, g);
  b->step(pb, g);
  EXPECT_EQ(pa, pb);
  optim::OptimizerSettings sgd = s;
  sgd.name = "sgd";
  EXPECT_THROW(optim::make_optimizer(sgd, 4)->load_state(a->state()), UserError);
}

// Every operation of the update rounded to float on its own, as the CUDA kernels do with their _rn
// intrinsics: a volatile store keeps the compiler from fusing a multiply and an add here.
float rounded(float x) {
  volatile float r = x;
  return r;
}

// The host optimizers round each operation separately (no multiply-add contracted into an FMA, whatever the
// CPU's vector clone), so that CPU and GPU replicas applying the same gradient keep the same parameters to
// the last bit. An odd size runs the vector loops' tails too.
// visit_state hands a checkpoint each buffer of the state: a host optimizer its own memory, any other (the
// CUDA optimizer) through the default, which copies state(). Both must give state()'s buffers in order.
TEST(Optimizer, VisitStateGivesTheStateBuffersInOrder) {
  // An optimizer that keeps the default visit_state, as the CUDA one does.
  class StateOnly final : public optim::Optimizer {
   public:
    explicit StateOnly(std::unique_ptr<optim::Optimizer> inner) : inner_(std::move(inner)) {}
    void step(std::span<float> p, std::span<const float> g, const optim::TouchedRows* t,
              float scale) override {
      inner_->step(p, g, t, scale);
    }
    OptimizerState state() const override { return inner_->state(); }
    void load_state(const OptimizerState& state) override { inner_->load_state(state); }
    int64_t iterations() const override { return inner_->iterations(); }
    std::string name() const override { return inner_->name(); }

   private:
    std::unique_ptr<optim::Optimizer> inner_;
  };
  for (const std::string name : {"adam", "sgd"}) {
    optim::OptimizerSettings s;
    s.name = name;
    s.momentum = 0.9;
    std::vector<float> params(17, 0.5f), grads(17);
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i) - 0.05f;
    auto host = optim::make_optimizer(s, params.size());
    StateOnly copying(optim::make_optimizer(s, params.size()));
    std::vector<float> other = params;
    for (int i = 0; i < 3; ++i) {
      host->step(params, grads);
      copying.step(other, grads, nullptr, 1.0f);
    }
    const OptimizerState expected = host->state();
    EXPECT_EQ(host->iterations(), 3);
    EXPECT_EQ(copying.iterations(), 3);
    for (const optim::Optimizer* optimizer :
         {static_cast<const optim::Optimizer*>(host.get()), static_cast<const optim::Optimizer*>(&copying)}) {
      std::vector<std::pair<std::string, std::vector<float>>> visited;
      optimizer->visit_state([&](const std::string& buffer, std::span<const float> values) {
        visited.emplace_back(buffer, std::vector<float>(values.begin(), values.end()));
      });
      EXPECT_EQ(visited, expected.buffers) << name;
    }
  }
}

TEST(Optimizer, UpdatesRoundEveryOperationLikeTheCudaKernels) {
  constexpr std::size_t n = 1003;
  std::vector<float> p(n), g(n);
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (std::size_t i = 0; i < n; ++i) p[i] = next();

  optim::OptimizerSettings adam_settings;
  adam_settings.learning_rate = 0.003;
  auto adam = optim::make_optimizer(adam_settings, n);
  std::vector<float> pa = p, ref = p, m(n, 0.0f), v(n, 0.0f);
  const auto b1 = static_cast<float>(adam_settings.beta1);
  const auto b2 = static_cast<float>(adam_settings.beta2);
  const auto eps = static_cast<float>(adam_settings.epsilon);
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = next() * 0.01f;
    adam->step(pa, g);
    const auto lr_t = static_cast<float>(adam_settings.learning_rate * std::sqrt(1.0 - std::pow(0.999, t)) /
                                         (1.0 - std::pow(0.9, t)));
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = rounded(rounded(b1 * m[i]) + rounded(rounded(1.0f - b1) * g[i]));
      v[i] = rounded(rounded(b2 * v[i]) + rounded(rounded(rounded(1.0f - b2) * g[i]) * g[i]));
      ref[i] = rounded(ref[i] - rounded(rounded(lr_t * m[i]) / rounded(rounded(std::sqrt(v[i])) + eps)));
    }
  }
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += pa[i] != ref[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "Adam: parameters that differ from the per-operation rounding";

  optim::OptimizerSettings sgd_settings;
  sgd_settings.name = "sgd";
  sgd_settings.learning_rate = 0.05;
  sgd_settings.momentum = 0.9;
  auto sgd = optim::make_optimizer(sgd_settings, n);
  std::vector<float> ps = p, velocity(n, 0.0f);
  ref = p;
  const auto lr = static_cast<float>(sgd_settings.learning_rate);
  const auto momentum = static_cast<float>(sgd_settings.momentum);
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = next();
    sgd->step(ps, g);
    for (std::size_t i = 0; i < n; ++i) {
      velocity[i] = rounded(rounded(momentum * velocity[i]) - rounded(lr * g[i]));
      ref[i] = rounded(ref[i] + velocity[i]);
    }
  }
  differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += ps[i] != ref[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "SGD: parameters that differ from the per-operation rounding";
}

// Lazy rows: a matrix at offset 2 of width 2 with 3 rows. A first step touches every row; then only row 1 has
// a gradient. Lazily, rows 0 and 2 keep the values of the first step; densely their moments keep moving them.
// Outside the matrix, and on row 1, both updates are the same.
TEST(Optimizer, LazyRowsLeaveUntouchedRowsAlone) {
  optim::OptimizerSettings dense_settings;
  optim::OptimizerSettings lazy_settings;
  lazy_settings.lazy_update = true;
  auto dense = optim::make_optimizer(dense_settings, 10);
  auto lazy = optim::make_optimizer(lazy_settings, 10);
  std::vector<float> pd{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> pl = pd;
  const std::vector<float> all{0.5f, -0.5f, 0.1f, 0.2f, 0.25f, 0.75f, -0.3f, 0.4f, 1, -1};
  const std::vector<int32_t> every_row{0, 1, 2};
  const optim::TouchedRows first{2, 2, 3, every_row};
  dense->step(pd, all, &first);
  lazy->step(pl, all, &first);
  const std::vector<float> after_first = pl;
  const std::vector<float> g{0.5f, -0.5f, 0, 0, 0.25f, 0.75f, 0, 0, 1, -1};
  const std::vector<int32_t> row_one{1};
  const optim::TouchedRows sparse{2, 2, 3, row_one};
  for (int i = 0; i < 3; ++i) {
    dense->step(pd, g, &sparse);  // dense settings ignore the rows
    lazy->step(pl, g, &sparse);
  }
  for (int i : {0, 1, 4, 5, 8, 9}) EXPECT_EQ(pl[i], pd[i]) << i;
  for (int i : {2, 3, 6, 7}) {
    EXPECT_EQ(pl[i], after_first[i]) << i;
    EXPECT_NE(pd[i], after_first[i]) << i;
  }
}

// Given the touched rows, a dense update decays the other rows without reading their (zero) gradient: the
// same bits as the full update, on one compute thread or several (the ranges the threads split the buffer
// into fall inside rows and between them). A lazy update gives the same bits on any number of threads too.
TEST(Optimizer, TouchedRowsChangeNoBitOfTheDenseUpdateOnAnyThreadCount) {
  const std::size_t width = 7, rows = 40000, offset = 1000, size = offset + width * rows + 333;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> start(size);
  for (float& p : start) p = u(rng);
  std::vector<int32_t> touched;
  for (int32_t row = 0; row < static_cast<int32_t>(rows); ++row)
    if (rng() % 9 == 0 || row == 0 || row + 1 == static_cast<int32_t>(rows)) touched.push_back(row);
  std::vector<float> grads(size, 0.0f);
  auto draw_gradient = [&] {
    std::fill(grads.begin(), grads.end(), 0.0f);
    for (std::size_t i = 0; i < offset; ++i) grads[i] = u(rng);
    for (const int32_t row : touched)
      for (std::size_t j = 0; j < width; ++j) grads[offset + row * width + j] = u(rng);
    for (std::size_t i = offset + width * rows; i < size; ++i) grads[i] = u(rng);
  };
  const optim::TouchedRows sparse{offset, width, rows, touched};
  for (const std::string name : {"adam", "sgd"}) {
    for (const bool lazy : {false, true}) {
      optim::OptimizerSettings settings;
      settings.name = name;
      settings.momentum = 0.9;
      settings.lazy_update = lazy;
      std::vector<std::vector<float>> results;
      for (const int threads : {1, 2, 3}) {
        set_loop_threads(threads);
        rng.seed(6);
        auto optimizer = optim::make_optimizer(settings, size);
        std::vector<float> params = start;
        for (int step = 0; step < 3; ++step) {
          draw_gradient();
          optimizer->step(params, grads, &sparse);
        }
        results.push_back(params);
        if (lazy) continue;
        // The reference: the full dense update, reading every gradient, on the calling thread.
        set_loop_threads(1);
        rng.seed(6);
        auto full = optim::make_optimizer(settings, size);
        std::vector<float> reference = start;
        for (int step = 0; step < 3; ++step) {
          draw_gradient();
          full->step(reference, grads);
        }
        EXPECT_EQ(0, std::memcmp(params.data(), reference.data(), size * sizeof(float)))
            << name << " " << threads;
      }
      set_loop_threads(1);
      for (const auto& r : results)
        EXPECT_EQ(0, std::memcmp(r.data(), results[0].data(), size * sizeof(float)))
            << name << " lazy " << lazy;
      if (lazy) {  // an untouched row kept its start
        int32_t untouched = 0;
        while (std::binary_search(touched.begin(), touched.end(), untouched)) ++untouched;
        EXPECT_EQ(results[0][offset + untouched * width], start[offset + untouched * width]) << name;
      }
    }
  }
}

// A gradient in pieces (the colocated parameter server's compact shard average) gives the dense update's
// bits: the pieces' elements updated, every other element decayed as with a zero gradient; on any number of
// threads, with a clipping scale and weight decay, pieces that split a thread's range, and an empty one.
TEST(Optimizer, PiecesChangeNoBitOfTheDenseUpdate) {
  const std::size_t size = 300000;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> start(size);
  for (float& p : start) p = u(rng);
  // Pieces of 1 to 300 floats with gaps of 0 to 2000, and one empty piece.
  std::vector<std::pair<std::size_t, std::size_t>> spans;  // offset, length
  for (std::size_t at = 5; at < size;) {
    const std::size_t length = std::min<std::size_t>(1 + rng() % 300, size - at);
    spans.emplace_back(at, length);
    at += length + rng() % 2001;
    if (spans.size() == 10) spans.emplace_back(at, 0);
  }
  for (const std::string name : {"adam", "sgd"}) {
    optim::OptimizerSettings settings;
    settings.name = name;
    settings.momentum = 0.9;
    settings.weight_decay = 0.01;
    for (const int threads : {1, 2, 3}) {
      set_loop_threads(threads);
      auto in_pieces = optim::make_optimizer(settings, size);
      auto dense = optim::make_optimizer(settings, size);
      std::vector<float> params = start, reference = start;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> values, grads(size, 0.0f);
        for (const auto& [offset, length] : spans)
          for (std::size_t i = 0; i < length; ++i) values.push_back(u(rng));
        std::vector<GradientPiece> pieces;
        std::size_t next = 0;
        for (const auto& [offset, length] : spans) {
          pieces.push_back({offset, std::span<const float>(values).subspan(next, length)});
          std::copy(values.begin() + static_cast<std::ptrdiff_t>(next),
                    values.begin() + static_cast<std::ptrdiff_t>(next + length),
                    grads.begin() + static_cast<std::ptrdiff_t>(offset));
          next += length;
        }
        in_pieces->step_pieces(params, pieces, 0.5f);
        dense->step(reference, grads, nullptr, 0.5f);
      }
      EXPECT_EQ(0, std::memcmp(params.data(), reference.data(), size * sizeof(float)))
          << name << " " << threads;
      EXPECT_NE(params, start);
    }
  }
  set_loop_threads(1);
}

TEST(Optimizer, LearningRateSchedulesWarmUpStepAndCosine) {
  optim::OptimizerSettings s;
  s.learning_rate = 0.1;
  EXPECT_EQ(optim::learning_rate_at(s, 1), 0.1);
  EXPECT_EQ(optim::learning_rate_at(s, 1000), 0.1);
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 1), 0.025);
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 2), 0.05);
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 4), 0.1);
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 5), 0.1);
  s.schedule = "step";
  s.decay_steps = 10;
  s.decay_rate = 0.5;
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 14), 0.1);    // the 10th update after warm-up
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 15), 0.05);   // the 11th
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 34), 0.025);  // the 30th: two decays
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 35), 0.0125);
  s.schedule = "cosine";
  s.total_steps = 104;
  EXPECT_DOUBLE_EQ(optim::learning_rate_at(s, 5), 0.1);
  EXPECT_NEAR(optim::learning_rate_at(s, 55), 0.05, 1e-12);  // half way: cos(pi/2)
  EXPECT_NEAR(optim::learning_rate_at(s, 105), 0.0, 1e-12);
  EXPECT_NEAR(optim::learning_rate_at(s, 500), 0.0, 1e-12);  // past the end it stays at 0
}

// AdamW's decoupled decay (p -= lr wd p before Adam's step) and clipping's scale (the gradient times it) in
// double against the float optimizer; a scale given to step() equals gradients multiplied by it beforehand,
// bit for bit.
TEST(Optimizer, WeightDecayAndGradientScaleFollowTheFormulas) {
  optim::OptimizerSettings s;
  s.learning_rate = 0.01;
  s.weight_decay = 0.1;
  auto adam = optim::make_optimizer(s, 3);
  std::vector<float> p{1.0f, -2.0f, 0.5f};
  const std::vector<float> g{0.3f, -0.1f, 0.0f};
  const float scale = 0.5f;
  adam->step(p, g, nullptr, scale);
  const double lr_t = 0.01 * std::sqrt(1 - 0.999) / (1 - 0.9);
  const std::vector<double> start{1.0, -2.0, 0.5};
  for (std::size_t i = 0; i < 3; ++i) {
    const double gs = static_cast<double>(g[i]) * scale;
    const double decayed = start[i] - 0.01 * 0.1 * start[i];
    const double m = 0.1 * gs, v = 0.001 * gs * gs;
    EXPECT_NEAR(p[i], decayed - lr_t * m / (std::sqrt(v) + 1e-7), 1e-6) << i;
  }
  for (const std::string name : {"adam", "sgd"}) {
    s.name = name;
    s.momentum = 0.9;
    auto scaled = optim::make_optimizer(s, 3), premultiplied = optim::make_optimizer(s, 3);
    std::vector<float> a{1.0f, 2.0f, 3.0f}, b = a;
    std::vector<float> gb = g;
    for (float& x : gb) x *= 0.25f;
    for (int i = 0; i < 3; ++i) {
      scaled->step(a, g, nullptr, 0.25f);
      premultiplied->step(b, gb);
    }
    EXPECT_EQ(a, b) << name;
  }
  EXPECT_EQ(clipping_scale(4.0, 0), 1.0f);    // off
  EXPECT_EQ(clipping_scale(4.0, 3.0), 1.0f);  // norm 2 is within 3
  EXPECT_FLOAT_EQ(clipping_scale(16.0, 1.0), 0.25f);
}

// The squared norm in gradient_clipping.h's order (which the GPU kernel follows too): the true sum to double
// rounding; a sparse gradient that leaves its zero rows out gets the same bits as the dense sum over them;
// step_clipped is step() with clipping_scale of that norm.
TEST(GradientClipping, TheNormHasOneOrderAndZeroRowsMaySkip) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t width = 7, rows = 1000, offset = 13, n = offset + width * rows + 5;
  std::vector<float> g(n, 0.0f);
  std::vector<int32_t> touched;
  for (std::size_t i = 0; i < offset; ++i) g[i] = normal(rng);
  for (std::size_t i = offset + width * rows; i < n; ++i) g[i] = normal(rng);
  for (int32_t r = 0; r < static_cast<int32_t>(rows); r += 3) {
    touched.push_back(r);
    for (std::size_t j = 0; j < width; ++j) g[offset + static_cast<std::size_t>(r) * width + j] = normal(rng);
  }
  long double exact = 0;
  for (const float x : g) exact += static_cast<long double>(x) * x;
  const double dense = optim::squared_norm(g, nullptr);
  EXPECT_NEAR(dense, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
  const optim::TouchedRows sparse{offset, width, rows, touched};
  EXPECT_EQ(optim::squared_norm(g, &sparse), dense);

  optim::OptimizerSettings s;
  s.learning_rate = 0.01;
  auto clipped = optim::make_optimizer(s, n), scaled = optim::make_optimizer(s, n);
  std::vector<float> a(n, 0.5f), b = a;
  clipped->step_clipped(a, g, nullptr, 2.0);
  scaled->step(b, g, nullptr, clipping_scale(dense, 2.0));
  EXPECT_LT(clipping_scale(dense, 2.0), 1.0f);
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace ddp::engine

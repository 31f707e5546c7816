// The CPU model: the parameter layout, Keras's initializers, gradients against finite differences, float
// against double, and the order in which gradients become ready (the replica contract:
// tests/replica_contract.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/fast_math.h"
#include "engine/base/parallel_loops.h"
#include "models/blas_threads.h"
#include "models/fma_rate.h"
#include "models/initializers.h"
#include "models/packed_gemm.h"
#include "models/param_layout.h"
#include "models/replica.h"
#include "models/rnn_classifier_cpu.h"
#include "tests/test_util.h"

namespace ddp::models {
namespace {

// OpenBLAS's run-time dispatch may fall back to its oldest kernels on a virtual CPU it does not recognise;
// the advice names the kernel set the CPU can run, and is silent where the kernels already use AVX2.
TEST(BlasKernelsHint, AdvisesWhereOpenBlasRunsKernelsOlderThanTheCpu) {
  const std::string on_avx512 = openblas_core_hint("Prescott", true, true, "");
  EXPECT_NE(on_avx512.find("Prescott kernels on a CPU with AVX-512"), std::string::npos) << on_avx512;
  EXPECT_NE(on_avx512.find("did not recognise the CPU's model"), std::string::npos) << on_avx512;
  EXPECT_NE(on_avx512.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos) << on_avx512;
  const std::string on_avx2 = openblas_core_hint("Sandybridge", true, false, "Sandybridge");
  EXPECT_NE(on_avx2.find("OPENBLAS_CORETYPE=Sandybridge asks for them"), std::string::npos) << on_avx2;
  EXPECT_NE(on_avx2.find("set OPENBLAS_CORETYPE=Haswell"), std::string::npos) << on_avx2;
  EXPECT_EQ(openblas_core_hint("Haswell", true, true, ""), "");  // AVX2 kernels on AVX-512: close enough
  EXPECT_EQ(openblas_core_hint("SkylakeX", true, true, ""), "");
  EXPECT_EQ(openblas_core_hint("Zen", true, false, ""), "");
  EXPECT_EQ(openblas_core_hint("Prescott", false, false, ""),
            "");  // a CPU without AVX2: nothing better to run
  // This machine's own BLAS gives advice only where the rule does.
  const std::string here = blas_kernels_hint();
  EXPECT_TRUE(here.empty() || here.find("OPENBLAS_CORETYPE=") != std::string::npos) << here;
}

struct Batch {
  std::vector<int32_t> tokens;  // [batch, seq]
  std::vector<float> labels;
  int batch = 0;
  int seq = 0;
};

// Random tokens (0 included: padding is an ordinary token for the model) and random labels.
Batch random_batch(int vocab, int batch, int seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch out{std::vector<int32_t>(static_cast<std::size_t>(batch * seq)),
            std::vector<float>(static_cast<std::size_t>(batch)), batch, seq};
  for (auto& t : out.tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  for (int b = 0; b < batch; ++b) out.tokens[static_cast<std::size_t>(b * seq)] = 0;  // left padding
  for (auto& y : out.labels) y = static_cast<float>(rng() % 2);
  return out;
}

template <typename Scalar>
std::vector<Scalar> labels_as(const Batch& batch) {
  return std::vector<Scalar>(batch.labels.begin(), batch.labels.end());
}

TEST(ParamLayout, SizeOffsetsAndSegments) {
  const ParamLayout layout(ModelShape{20000, 128, 128, 1});
  EXPECT_EQ(layout.total_size(), std::size_t{20000} * 128 + 4 * 128 * (128 + 128) + 8 * 128 + 128 + 1);

  for (const ModelShape shape : {ModelShape{20000, 128, 128, 1}, ModelShape{13, 5, 4, 3}}) {
    const ParamLayout l(shape);
    std::size_t next = 0;
    for (const auto& tensor : l.tensors()) {
      EXPECT_EQ(tensor.offset, next) << tensor.name;
      next += tensor.size();
    }
    EXPECT_EQ(next, l.total_size());

    const auto& segments = l.segments();
    ASSERT_EQ(segments.size(), static_cast<std::size_t>(shape.layers) + 2);
    EXPECT_EQ(segments.front().name, "embedding");
    EXPECT_EQ(segments.back().name, "dense");
    next = 0;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      if (s > 0 && s + 1 < segments.size()) {
        EXPECT_EQ(segments[s].name, "lstm.l" + std::to_string(s - 1));
      }
      EXPECT_EQ(segments[s].offset, next) << segments[s].name;
      EXPECT_GT(segments[s].size, 0u);
      next += segments[s].size;
    }
    EXPECT_EQ(next, l.total_size());
    EXPECT_EQ(
        l.tensor("lstm.l" + std::to_string(shape.layers - 1) + ".w_ih").shape,
        (std::vector<int64_t>{4 * shape.hidden, shape.layers > 1 ? shape.hidden : shape.embedding_dim}));
  }
}

// d(mean loss)/d(every parameter) against central differences, all in double.
void check_gradients(const ModelShape& shape) {
  const ParamLayout layout(shape);
  const std::vector<float> init = ddp::testing::test_params(layout, 7);
  CpuRnnClassifier<double> model(shape);
  std::copy(init.begin(), init.end(), model.params().begin());
  const Batch batch = random_batch(shape.vocab_size, 3, 6, 11);
  const std::vector<double> labels = labels_as<double>(batch);

  model.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());

  auto mean_loss = [&] {
    return model.evaluate(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {}).loss_sum /
           batch.batch;
  };
  const double eps = 1e-6;
  auto params = model.params();
  for (const auto& tensor : layout.tensors()) {
    double worst = 0;
    double largest = 0;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
      const double saved = params[i];
      params[i] = saved + eps;
      const double plus = mean_loss();
      params[i] = saved - eps;
      const double minus = mean_loss();
      params[i] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double a = analytic[i];
      // Central differences carry rounding noise of about ulp(loss) / eps ~ 1e-10, so a relative error is
      // only meaningful above that: the floor 1e-3 turns it into an absolute tolerance of 1e-9 for the many
      // components near zero (the first layer's gradients are ~1e-8 with Keras's small embeddings).
      worst = std::max(worst, std::abs(a - numeric) / std::max(1e-3, std::abs(a) + std::abs(numeric)));
      largest = std::max(largest, std::abs(a));
    }
    EXPECT_LT(worst, 1e-6) << tensor.name;
    EXPECT_GT(largest, 1e-4) << tensor.name << " has no gradient to check";
  }
}

TEST(CpuRnnClassifier, GradientsMatchFiniteDifferencesTwoLayers) {
  check_gradients(ModelShape{13, 5, 4, 2});
}

TEST(CpuRnnClassifier, GradientsMatchFiniteDifferencesOneLayer) {
  check_gradients(ModelShape{13, 5, 4, 1});
}

double relative_norm_difference(std::span<const float> f, std::span<const double> d) {
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < d.size(); ++i) {
    diff += (static_cast<double>(f[i]) - d[i]) * (static_cast<double>(f[i]) - d[i]);
    norm += d[i] * d[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

TEST(CpuRnnClassifier, FloatMatchesDouble) {
  const ModelShape shape{50, 16, 12, 1};
  const ParamLayout layout(shape);
  const std::vector<float> init = ddp::testing::test_params(layout, 3);
  CpuRnnClassifier<float> single(shape);
  CpuRnnClassifier<double> reference(shape);
  std::copy(init.begin(), init.end(), single.params().begin());
  std::copy(init.begin(), init.end(), reference.params().begin());
  const Batch batch = random_batch(shape.vocab_size, 8, 20, 5);
  const std::vector<double> labels = labels_as<double>(batch);

  const BatchStats fs =
      single.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
  const BatchStats ds = reference.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
  EXPECT_NEAR(fs.loss_sum, ds.loss_sum, 1e-5 * std::abs(ds.loss_sum));
  EXPECT_EQ(fs.count, ds.count);
  EXPECT_LT(relative_norm_difference(single.grads(), reference.grads()), 1e-4);
  for (const auto& tensor : layout.tensors()) {
    EXPECT_LT(relative_norm_difference(
                  single.grads().subspan(tensor.offset, tensor.size()),
                  std::span<const double>(reference.grads()).subspan(tensor.offset, tensor.size())),
              1e-4)
        << tensor.name;
  }
}

// The float path on oneDNN (model.cpu_kernels = onednn: its LSTM and linear-before-reset GRU) against the
// double reference, with one and two layers, over two batch sizes (each its own primitives) and two steps in
// a row; a wrong mapping of the weights, biases, gates or initial states (oneDNN's recurrent-weight gradient
// is wrong without explicit zero states) shows in some tensor's gradient.
TEST(CpuRnnClassifier, OnednnMatchesDouble) {
  if (const std::string why = onednn_missing(); !why.empty()) GTEST_SKIP() << why;
  for (const auto& [layers, cell] : {std::pair{1, Cell::kLstm}, std::pair{2, Cell::kLstm},
                                     std::pair{1, Cell::kGru}, std::pair{2, Cell::kGru}}) {
    ModelShape shape{50, 16, 12, layers};
    shape.cell = cell;
    const ParamLayout layout(shape);
    const std::vector<float> init = ddp::testing::test_params(layout, 3);
    CpuRnnClassifier<float> onednn(shape);
    onednn.use_onednn();
    CpuRnnClassifier<double> reference(shape);
    std::copy(init.begin(), init.end(), onednn.params().begin());
    std::copy(init.begin(), init.end(), reference.params().begin());
    for (const int batch_size : {8, 3, 8}) {
      const Batch batch = random_batch(shape.vocab_size, batch_size, 20, 5 + batch_size);
      const std::vector<double> labels = labels_as<double>(batch);
      const BatchStats fs =
          onednn.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
      const BatchStats ds =
          reference.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
      EXPECT_NEAR(fs.loss_sum, ds.loss_sum, 1e-5 * std::abs(ds.loss_sum)) << describe(shape);
      for (const auto& tensor : layout.tensors()) {
        EXPECT_LT(relative_norm_difference(
                      onednn.grads().subspan(tensor.offset, tensor.size()),
                      std::span<const double>(reference.grads()).subspan(tensor.offset, tensor.size())),
                  1e-4)
            << tensor.name << ", " << describe(shape) << ", batch " << batch_size;
      }
      const BatchStats again =
          onednn.evaluate(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
      EXPECT_NEAR(again.loss_sum, fs.loss_sum, 1e-6 * std::abs(fs.loss_sum)) << "evaluate and train disagree";
    }
  }
}

// The embedding's lookup and gradient run on the rank's compute threads (rows split for the lookup, columns
// for the gradient, whose repeated tokens must add in one order): any thread count gives the same bits, over
// two steps in a row (the rows the first touched and the second does not go back to zero). A batch of 6,
// which the recurrent layers keep on one thread (split, their products' rounding may depend on the rows a
// thread takes).
TEST(CpuRnnClassifier, EmbeddingOnMoreThreadsChangesNoBit) {
  ModelShape shape{40, 48, 8, 1};  // 48 columns: three cache lines of floats to split
  const ParamLayout layout(shape);
  const std::vector<float> init = ddp::testing::test_params(layout, 9);
  std::vector<std::vector<float>> grads_of_threads;
  for (const int threads : {1, 2, 3}) {
    set_loop_threads(threads);
    CpuRnnClassifier<float> model(shape);
    std::copy(init.begin(), init.end(), model.params().begin());
    std::vector<float> grads;
    for (const uint64_t seed : {21, 22}) {
      const Batch batch = random_batch(shape.vocab_size, 6, 120, seed);  // 720 rows, every token many times
      model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
      grads.insert(grads.end(), model.grads().begin(), model.grads().end());
    }
    grads_of_threads.push_back(grads);
  }
  set_loop_threads(1);
  for (std::size_t i = 1; i < grads_of_threads.size(); ++i) {
    EXPECT_TRUE(grads_of_threads[i] == grads_of_threads[0]) << i + 1 << " threads";
  }
}

TEST(CpuRnnClassifier, OnednnIsRefusedWhereTheBuildHasNone) {
  if (onednn_missing().empty()) {
    for (const int threads : {1, 2}) {
      KernelFacts facts;
      facts.have_onednn = true;
      facts.avx512 = onednn_runs_avx512();
      facts.have_packed = packed_gemm_missing().empty();
      facts.wide_fma_units = avx512_fma_outpaces_avx2();
      facts.threads = threads;
      EXPECT_EQ(parse_cpu_kernels("auto", {}, {}, threads), fastest_cpu_kernels(facts)) << threads;
    }
    EXPECT_EQ(parse_cpu_kernels("onednn"), CpuKernels::kOnednn);
    EXPECT_EQ(parse_cpu_kernels("onednn_gemm"), CpuKernels::kOnednnGemm);
  } else {
    // Without oneDNN an AVX-512 CPU keeps the builtin cells (OpenBLAS's AVX-512 kernels), others the tiles.
    EXPECT_EQ(parse_cpu_kernels("auto"), packed_gemm_missing().empty() && !cpu_has_avx512()
                                             ? CpuKernels::kPacked
                                             : CpuKernels::kBuiltin);
    EXPECT_THROW(parse_cpu_kernels("onednn"), UserError);
    EXPECT_THROW(parse_cpu_kernels("onednn_gemm"), UserError);
    CpuRnnClassifier<float> model({10, 4, 3, 1});
    EXPECT_THROW(model.use_onednn_products(), std::runtime_error);
  }
  EXPECT_EQ(parse_cpu_kernels("builtin"), CpuKernels::kBuiltin);
  EXPECT_THROW(parse_cpu_kernels("fast"), UserError);
  CpuRnnClassifier<double> reference({10, 4, 3, 1});
  EXPECT_THROW(reference.use_onednn(), std::runtime_error) << "the double reference stays the builtin";
  EXPECT_THROW(reference.use_onednn_products(), std::runtime_error);
  EXPECT_THROW(reference.use_packed_recurrent(), std::runtime_error);
}

// packed runs where the CPU has AVX2 and FMA, and is refused with the reason elsewhere.
TEST(CpuRnnClassifier, PackedIsRefusedWhereTheCpuCannotRunIt) {
  if (packed_gemm_missing().empty()) {
    EXPECT_EQ(parse_cpu_kernels("packed"), CpuKernels::kPacked);
    return;
  }
  try {
    parse_cpu_kernels("packed");
    ADD_FAILURE() << "packed accepted on a CPU that cannot run it";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("model.cpu_kernels = packed"), std::string::npos) << e.what();
  }
  CpuRnnClassifier<float> model({10, 4, 3, 1});
  EXPECT_THROW(model.use_packed_recurrent(), std::runtime_error);
}

// auto's rule: the packed tiles with oneDNN's sgemm wherever both run, but oneDNN's primitives on cores with
// two 512-bit FMA units and one thread per rank; without the tiles oneDNN's primitives on AVX-512 and our
// cells over its sgemm on AVX2; without oneDNN the tiles on AVX2, the builtin cells on AVX-512.
TEST(CpuRnnClassifier, AutoPicksTheFastestKernelsMeasured) {
  const auto pick = [](bool onednn, bool avx512, bool packed, bool wide, int threads) {
    return fastest_cpu_kernels({onednn, avx512, packed, wide, threads});
  };
  for (const int threads : {1, 2, 8}) {
    for (const bool wide : {false, true}) {
      const bool primitive_ahead = wide && threads == 1;
      EXPECT_EQ(pick(true, true, true, wide, threads),
                primitive_ahead ? CpuKernels::kOnednn : CpuKernels::kPacked);
      EXPECT_EQ(pick(true, false, true, wide, threads), CpuKernels::kPacked);
      EXPECT_EQ(pick(true, true, false, wide, threads), CpuKernels::kOnednn);
      EXPECT_EQ(pick(true, false, false, wide, threads), CpuKernels::kOnednnGemm);
      EXPECT_EQ(pick(false, true, true, wide, threads), CpuKernels::kBuiltin);
      EXPECT_EQ(pick(false, true, false, wide, threads), CpuKernels::kBuiltin);
      EXPECT_EQ(pick(false, false, true, wide, threads), CpuKernels::kPacked);
      EXPECT_EQ(pick(false, false, false, wide, threads), CpuKernels::kBuiltin);
    }
  }
}

// The FMA probe behind the rule: kernels at every width the CPU runs, and one answer per process.
TEST(FmaRate, MeasuresOnceAndRunsEveryWidthTheCpuHas) {
  const bool first = avx512_fma_outpaces_avx2();
  EXPECT_EQ(avx512_fma_outpaces_avx2(), first) << "a second ask measured again";
  if (widest_fma() != FmaWidth::kAvx512) {
    EXPECT_FALSE(first) << "no AVX-512, yet it outpaces AVX2";
  }
  // The job's agreement replaces the measured answer (on AVX-512 only), and auto follows it.
  for (const bool verdict : {!first, first}) {
    settle_avx512_fma_outpaces_avx2(verdict);
    EXPECT_EQ(avx512_fma_outpaces_avx2(), verdict && widest_fma() == FmaWidth::kAvx512) << verdict;
  }
  std::vector<FmaWidth> widths{FmaWidth::kScalar};
  if (widest_fma() != FmaWidth::kScalar) widths.push_back(FmaWidth::kAvx2);
  if (widest_fma() == FmaWidth::kAvx512) widths.push_back(FmaWidth::kAvx512);
  for (const FmaWidth width : widths) {
    // 12 accumulators a lane, from i * 1e-3, after 1000 rounds of x = 0.999999 x + 1e-7: 0.0671334 a lane.
    const double lanes = fma_lanes(width);
    EXPECT_NEAR(fma_rounds(width, 1000), 0.0671334 * lanes, 1e-5 * lanes) << static_cast<int>(width);
  }
}

// orthonormal_columns gives the q of a's QR with a positive diagonal of r (the only such q): q^T q = I, and
// r = q^T a upper triangular with a positive diagonal; for widths that are and are not whole blocks.
TEST(Initializers, OrthonormalColumnsAreTheQOfQr) {
  for (const auto& [rows, cols] :
       {std::pair<std::size_t, std::size_t>{8, 2}, {111, 37}, {280, 70}, {400, 100}}) {
    std::mt19937_64 engine(rows);
    std::vector<double> a(rows * cols);
    for (double& x : a) x = static_cast<double>(engine() >> 11) * 0x1.0p-53 - 0.5;
    std::vector<double> q = a;
    orthonormal_columns(q, rows, cols);
    double worst_orthonormal = 0;
    double worst_lower = 0;
    double smallest_diagonal = 1e300;
    for (std::size_t i = 0; i < cols; ++i) {
      for (std::size_t j = 0; j < cols; ++j) {
        double qq = 0;
        double qa = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          qq += q[r * cols + i] * q[r * cols + j];
          qa += q[r * cols + i] * a[r * cols + j];
        }
        worst_orthonormal = std::max(worst_orthonormal, std::abs(qq - (i == j ? 1.0 : 0.0)));
        if (i > j) worst_lower = std::max(worst_lower, std::abs(qa));
        if (i == j) smallest_diagonal = std::min(smallest_diagonal, qa);
      }
    }
    EXPECT_LT(worst_orthonormal, 1e-13) << rows << " x " << cols;
    EXPECT_LT(worst_lower, 1e-12) << rows << " x " << cols;
    EXPECT_GT(smallest_diagonal, 0.0) << rows << " x " << cols;
  }
  std::vector<double> wrong(5);
  EXPECT_THROW(orthonormal_columns(wrong, 3, 2), std::invalid_argument);
}

TEST(Initializers, KerasDistributions) {
  const ModelShape shape{300, 24, 16, 2};
  const ParamLayout layout(shape);
  std::vector<float> params(layout.total_size(), 123.0f);
  initialize_keras(layout, params, 42);
  const int h = shape.hidden;

  for (const auto& tensor : layout.tensors()) {
    const float* p = params.data() + tensor.offset;
    const std::size_t n = tensor.size();
    if (tensor.name == "embedding") {
      for (std::size_t i = 0; i < n; ++i) ASSERT_LE(std::abs(p[i]), 0.05f) << i;
    } else if (tensor.name.ends_with(".w_ih")) {
      const auto limit =
          static_cast<float>(std::sqrt(6.0 / static_cast<double>(tensor.shape[0] + tensor.shape[1])));
      float largest = 0;
      for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, std::abs(p[i]));
      EXPECT_LE(largest, limit) << tensor.name;
      EXPECT_GT(largest, 0.9f * limit) << tensor.name << " should fill its range";
    } else if (tensor.name.ends_with(".w_hh")) {
      // Columns orthonormal: W^T W = I for W [4H, H].
      const std::size_t rows = static_cast<std::size_t>(4 * h);
      const std::size_t cols = static_cast<std::size_t>(h);
      double worst = 0;
      for (std::size_t a = 0; a < cols; ++a) {
        for (std::size_t b = 0; b < cols; ++b) {
          double dot = 0;
          for (std::size_t r = 0; r < rows; ++r) {
            dot += static_cast<double>(p[r * cols + a]) * static_cast<double>(p[r * cols + b]);
          }
          worst = std::max(worst, std::abs(dot - (a == b ? 1.0 : 0.0)));
        }
      }
      EXPECT_LT(worst, 1e-5) << tensor.name;
    } else if (tensor.name.ends_with(".b_ih")) {
      for (std::size_t i = 0; i < n; ++i) {
        const bool forget = i >= static_cast<std::size_t>(h) && i < static_cast<std::size_t>(2 * h);
        ASSERT_EQ(p[i], forget ? 1.0f : 0.0f) << tensor.name << " " << i;
      }
    } else if (tensor.name.ends_with(".b_hh") || tensor.name == "dense.b") {
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0.0f) << tensor.name << " " << i;
    } else if (tensor.name == "dense.w") {
      const auto limit = static_cast<float>(std::sqrt(6.0 / (h + 1)));
      for (std::size_t i = 0; i < n; ++i) ASSERT_LE(std::abs(p[i]), limit);
    }
  }
  // Layers draw from their own streams.
  const auto& w0 = layout.tensor("lstm.l0.w_hh");
  const auto& w1 = layout.tensor("lstm.l1.w_hh");
  EXPECT_FALSE(std::equal(params.begin() + static_cast<std::ptrdiff_t>(w0.offset),
                          params.begin() + static_cast<std::ptrdiff_t>(w0.offset + w0.size()),
                          params.begin() + static_cast<std::ptrdiff_t>(w1.offset)));

  std::vector<float> same(layout.total_size());
  initialize_keras(layout, same, 42);
  EXPECT_EQ(params, same);
  std::vector<float> other(layout.total_size());
  initialize_keras(layout, other, 43);
  EXPECT_NE(params, other);

  std::vector<float> wrong_size(layout.total_size() - 1);
  EXPECT_THROW(initialize_keras(layout, wrong_size, 42), std::invalid_argument);
}

TEST(CpuRnnClassifier, GradientsReadyDenseFirstEmbeddingLast) {
  const ModelShape shape{20, 6, 5, 2};
  CpuRnnClassifier<float> model(shape);
  const std::vector<float> init = ddp::testing::test_params(model.layout(), 9);
  std::copy(init.begin(), init.end(), model.params().begin());
  const Batch batch = random_batch(shape.vocab_size, 4, 7, 2);

  // Overwrite every gradient with garbage first: a segment must be complete when it is reported. Rows of the
  // embedding gradient that the batch does not touch stay as they were (zero) by contract.
  const auto& embedding = model.layout().tensor("embedding");
  const auto width = static_cast<std::size_t>(shape.embedding_dim);
  std::fill(model.grads().begin() + static_cast<std::ptrdiff_t>(embedding.offset + embedding.size()),
            model.grads().end(), 1e30f);
  for (const int32_t token : batch.tokens) {
    const auto row = model.grads().subspan(embedding.offset + static_cast<std::size_t>(token) * width, width);
    std::fill(row.begin(), row.end(), 1e30f);
  }
  std::vector<std::string> order;
  std::vector<std::vector<float>> at_report;
  model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq,
                   [&](const ParamSegment& segment) {
                     order.push_back(segment.name);
                     const auto g = model.grads().subspan(segment.offset, segment.size);
                     at_report.emplace_back(g.begin(), g.end());
                   });
  // The first layer hands over the embedding before its own weight gradients (they overlap its exchange).
  EXPECT_EQ(order, (std::vector<std::string>{"dense", "lstm.l1", "embedding", "lstm.l0"}));
  ASSERT_EQ(at_report.size(), order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& segment = *std::find_if(model.layout().segments().begin(), model.layout().segments().end(),
                                        [&](const ParamSegment& s) { return s.name == order[i]; });
    const auto final_grads = model.grads().subspan(segment.offset, segment.size);
    EXPECT_TRUE(std::equal(final_grads.begin(), final_grads.end(), at_report[i].begin())) << order[i];
  }
  for (float g : model.grads()) ASSERT_LT(std::abs(g), 1e3f);
}

TEST(CpuRnnClassifier, EvaluateAndTrainStepAgree) {
  const ModelShape shape{40, 8, 6, 2};
  CpuRnnClassifier<float> model(shape);
  const std::vector<float> init = ddp::testing::test_params(model.layout(), 4);
  std::copy(init.begin(), init.end(), model.params().begin());
  const Batch batch = random_batch(shape.vocab_size, 9, 12, 8);

  std::vector<float> probabilities(9);
  const BatchStats eval = model.evaluate(batch.tokens.data(), batch.labels.data(), 9, 12, probabilities);
  const BatchStats train = model.train_step(batch.tokens.data(), batch.labels.data(), 9, 12, {});
  EXPECT_EQ(eval.loss_sum, train.loss_sum);
  EXPECT_EQ(eval.correct, train.correct);
  EXPECT_EQ(eval.count, 9);
  EXPECT_EQ(train.count, 9);

  // The stats follow from the probabilities.
  double loss = 0;
  int64_t correct = 0;
  for (std::size_t b = 0; b < 9; ++b) {
    const double p = probabilities[b];
    const double y = batch.labels[b];
    loss -= y * std::log(p) + (1 - y) * std::log(1 - p);
    if ((p >= 0.5) == (y >= 0.5)) ++correct;
  }
  EXPECT_NEAR(eval.loss_sum, loss, 1e-4);
  EXPECT_EQ(eval.correct, correct);

  // A smaller batch after a larger one (the last batch of an evaluation) sees only its own rows.
  std::vector<float> one(1);
  const BatchStats first = model.evaluate(batch.tokens.data(), batch.labels.data(), 1, 12, one);
  EXPECT_EQ(first.count, 1);
  EXPECT_FLOAT_EQ(one[0], probabilities[0]);

  const std::vector<int32_t> bad(12, shape.vocab_size);
  EXPECT_THROW(model.evaluate(bad.data(), batch.labels.data(), 1, 12, {}), std::out_of_range);
  EXPECT_THROW(model.evaluate(batch.tokens.data(), batch.labels.data(), 9, 12, one), std::invalid_argument);
}

TEST(CpuRnnClassifier, ZeroWeightsGiveTheDenseBias) {
  // With every weight zero, h = 0 and z = dense.b for every sample: loss and accuracy in closed form.
  const ModelShape shape{10, 4, 3, 2};
  CpuRnnClassifier<double> model(shape);
  const Batch batch = random_batch(shape.vocab_size, 7, 5, 6);
  const std::vector<double> labels = labels_as<double>(batch);
  int64_t positives = 0;
  for (double y : labels) positives += y >= 0.5 ? 1 : 0;
  ASSERT_GT(positives, 0);
  ASSERT_LT(positives, 7);
  auto& dense_b = model.params()[model.layout().tensor("dense.b").offset];
  std::vector<double> probabilities(7);

  dense_b = 0;  // p = 0.5 exactly, which counts as a positive prediction
  BatchStats stats = model.evaluate(batch.tokens.data(), labels.data(), 7, 5, probabilities);
  EXPECT_NEAR(stats.loss_sum, 7 * std::log(2.0), 1e-12);
  EXPECT_EQ(stats.correct, positives);
  for (double p : probabilities) EXPECT_EQ(p, 0.5);

  dense_b = -3;
  stats = model.train_step(batch.tokens.data(), labels.data(), 7, 5, {});
  const double p = 1 / (1 + std::exp(3.0));
  EXPECT_NEAR(stats.loss_sum,
              -static_cast<double>(positives) * std::log(p) -
                  (7.0 - static_cast<double>(positives)) * std::log(1 - p),
              1e-12);
  EXPECT_EQ(stats.correct, 7 - positives);
  EXPECT_NEAR(model.grads()[model.layout().tensor("dense.b").offset], p - static_cast<double>(positives) / 7,
              1e-15);
}

// The token ids of a batch, sorted and unique.
std::vector<int32_t> token_set(const Batch& batch) {
  const std::set<int32_t> tokens(batch.tokens.begin(), batch.tokens.end());
  return {tokens.begin(), tokens.end()};
}

// Tokens drawn from [low, high).
Batch batch_in_range(int low, int high, int batch, int seq, uint64_t seed) {
  Batch out = random_batch(high - low, batch, seq, seed);
  for (auto& t : out.tokens) t += low;
  return out;
}

TEST(CpuRnnClassifier, EmbeddingGradientTouchesOnlyTheBatchRows) {
  // Two layers, so that both kinds of backward (gradient into every step's output or the last one's only)
  // run. Consecutive batches overlap partly, not at all, or fully, and change shape.
  const ModelShape shape{60, 6, 5, 2};
  const ParamLayout layout(shape);
  const std::vector<float> init = ddp::testing::test_params(layout, 21);
  CpuRnnClassifier<float> model(shape);
  std::copy(init.begin(), init.end(), model.params().begin());
  EXPECT_TRUE(model.touched_embedding_rows().empty());

  const std::vector<Batch> batches = {
      batch_in_range(0, 30, 4, 7, 1),  batch_in_range(20, 45, 4, 7, 2), batch_in_range(45, 60, 3, 9, 3),
      batch_in_range(45, 60, 5, 4, 4), batch_in_range(0, 60, 8, 12, 5), batch_in_range(10, 13, 2, 3, 6),
  };
  const auto& embedding = layout.tensor("embedding");
  const auto width = static_cast<std::size_t>(shape.embedding_dim);
  for (std::size_t step = 0; step < batches.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Batch& batch = batches[step];
    model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});

    const auto touched = model.touched_embedding_rows();
    const std::vector<int32_t> expected = token_set(batch);
    ASSERT_EQ(std::vector<int32_t>(touched.begin(), touched.end()), expected);

    const auto grads = model.grads();
    std::vector<bool> in_batch(static_cast<std::size_t>(shape.vocab_size), false);
    for (const int32_t token : expected) in_batch[static_cast<std::size_t>(token)] = true;
    for (std::size_t row = 0; row < in_batch.size(); ++row) {
      const auto g = grads.subspan(embedding.offset + row * width, width);
      const bool all_zero = std::all_of(g.begin(), g.end(), [](float x) { return x == 0.0f; });
      if (!in_batch[row]) {
        ASSERT_TRUE(all_zero) << "row " << row << " is not in the batch";
      } else {
        ASSERT_FALSE(all_zero) << "row " << row << " is in the batch";
      }
    }

    // The same gradients as a model whose gradient buffer starts out zero, bit for bit...
    CpuRnnClassifier<float> fresh(shape);
    std::copy(init.begin(), init.end(), fresh.params().begin());
    fresh.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
    ASSERT_TRUE(std::equal(grads.begin(), grads.end(), fresh.grads().begin()));
    // ...and the double reference's, to float accuracy.
    CpuRnnClassifier<double> reference(shape);
    std::copy(init.begin(), init.end(), reference.params().begin());
    const std::vector<double> labels = labels_as<double>(batch);
    reference.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
    for (const auto& tensor : layout.tensors()) {
      EXPECT_LT(relative_norm_difference(
                    grads.subspan(tensor.offset, tensor.size()),
                    std::span<const double>(reference.grads()).subspan(tensor.offset, tensor.size())),
                1e-4)
          << tensor.name;
    }
  }

  // Evaluation neither changes the rows nor the gradient.
  const std::vector<float> before(model.grads().begin(), model.grads().end());
  const Batch other = batch_in_range(0, 60, 3, 5, 7);
  model.evaluate(other.tokens.data(), other.labels.data(), other.batch, other.seq, {});
  EXPECT_EQ(
      std::vector<int32_t>(model.touched_embedding_rows().begin(), model.touched_embedding_rows().end()),
      token_set(batches.back()));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), model.grads().begin()));

  // A rejected batch leaves them as they are too.
  const std::vector<int32_t> bad(12, shape.vocab_size);
  EXPECT_THROW(model.train_step(bad.data(), other.labels.data(), 1, 12, {}), std::out_of_range);
  EXPECT_EQ(
      std::vector<int32_t>(model.touched_embedding_rows().begin(), model.touched_embedding_rows().end()),
      token_set(batches.back()));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), model.grads().begin()));
}

TEST(CpuReplica, ReportsTouchedEmbeddingRows) {
  const ModelShape shape{100, 8, 6, 1};
  auto replica = make_cpu_replica(shape);
  initialize_keras(replica->layout(), replica->params(), 5);
  EXPECT_TRUE(replica->touched_embedding_rows().empty());
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const Batch batch = random_batch(shape.vocab_size, 5, 6, seed);
    replica->train_step(BatchView{batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq}, {});
    const auto touched = replica->touched_embedding_rows();
    EXPECT_EQ(std::vector<int32_t>(touched.begin(), touched.end()), token_set(batch));
  }
}

TEST(CpuReplica, BadTokensAndLabelsAreBatchValueErrors) {
  // The trainer turns these (and only these) into one line naming the data file.
  ModelShape shape{50, 8, 6, 1};
  shape.classes = 3;
  auto replica = make_cpu_replica(shape);
  initialize_keras(replica->layout(), replica->params(), 5);
  const std::vector<int32_t> tokens(2 * 4, 7);
  for (const float label : {3.0f, 200.0f}) {
    const std::vector<float> labels{0.0f, label};
    try {
      replica->train_step(BatchView{tokens.data(), labels.data(), 2, 4}, {});
      FAIL() << "label " << label << " was accepted";
    } catch (const BatchValueOutOfRange& e) {
      EXPECT_NE(std::string(e.what()).find("outside the classes [0, 3)"), std::string::npos) << e.what();
    }
  }
  const std::vector<int32_t> bad_tokens{1, 2, 3, 50, 1, 2, 3, 4};
  const std::vector<float> labels{0.0f, 2.0f};
  EXPECT_THROW(replica->train_step(BatchView{bad_tokens.data(), labels.data(), 2, 4}, {}),
               BatchValueOutOfRange);
  shape.classes = 2;
  auto binary = make_cpu_replica(shape);
  initialize_keras(binary->layout(), binary->params(), 5);
  const std::vector<float> seven{1.0f, 7.0f};
  EXPECT_THROW(binary->train_step(BatchView{tokens.data(), seven.data(), 2, 4}, {}), BatchValueOutOfRange);
}

TEST(FastMath, MatchesTheStandardFunctions) {
  // Every 1009th float of magnitude up to 100, both signs: relative error against double.
  double worst_exp = 0;
  double worst_sigmoid = 0;
  double worst_tanh = 0;
  for (uint32_t bits = 0; bits < 0x42c80000u; bits += 1009) {  // 0x42c80000 = 100.0f
    for (const float x : {std::bit_cast<float>(bits), -std::bit_cast<float>(bits)}) {
      const double xd = x;
      if (xd > -87.3 && xd < 88.3) {
        worst_exp = std::max(worst_exp, std::abs(fast::exp(x) - std::exp(xd)) / std::exp(xd));
      }
      if (xd > -87.3) {
        const double s = 1 / (1 + std::exp(-xd));
        worst_sigmoid = std::max(worst_sigmoid, std::abs(fast::sigmoid(x) - s) / s);
      }
      const double t = std::tanh(xd);
      if (t != 0) {
        worst_tanh = std::max(worst_tanh, std::abs(fast::tanh(x) - t) / std::abs(t));
      } else {
        ASSERT_EQ(fast::tanh(x), 0.0f);
      }
    }
  }
  EXPECT_LT(worst_exp, 2e-7);
  EXPECT_LT(worst_sigmoid, 3e-7);
  EXPECT_LT(worst_tanh, 3e-7);

  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(fast::sigmoid(0.0f), 0.5f);
  EXPECT_EQ(fast::sigmoid(inf), 1.0f);
  EXPECT_GE(fast::sigmoid(-inf), 0.0f);
  EXPECT_LT(fast::sigmoid(-inf), 1e-37f);
  EXPECT_EQ(fast::tanh(inf), 1.0f);
  EXPECT_EQ(fast::tanh(-inf), -1.0f);
  EXPECT_EQ(fast::tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::isfinite(fast::exp(inf)));
  EXPECT_TRUE(std::isnan(fast::exp(nan)));
  EXPECT_TRUE(std::isnan(fast::sigmoid(nan)));
  EXPECT_TRUE(std::isnan(fast::tanh(nan)));
}

}  // namespace
}  // namespace ddp::models

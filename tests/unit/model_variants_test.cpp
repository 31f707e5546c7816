// Every variant of the CPU model (cell x directions x layers x masking x classes, with and without dropout):
// the canonical layout's order, gradients against finite differences in double, float against double, a
// plain per-sample forward written from the formulas of param_layout.h, masking that makes left padding
// irrelevant, and dropout's masks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/parallel_loops.h"
#include "models/dropout.h"
#include "models/packed_gemm.h"
#include "models/param_layout.h"
#include "models/replica.h"
#include "models/rnn_classifier_cpu.h"
#include "tests/test_util.h"

namespace ddp::models {
namespace {

struct Variant {
  Cell cell = Cell::kLstm;
  bool bidirectional = false;
  int layers = 1;
  bool mask = false;
  int classes = 2;
  double dropout = 0;
  double embedding_dropout = 0;

  ModelShape shape(int vocab = 13, int embed = 5, int hidden = 4) const {
    ModelShape s{vocab, embed, hidden, layers};
    s.cell = cell;
    s.bidirectional = bidirectional;
    s.classes = classes;
    return s;
  }
  ModelOptions options() const { return {mask, dropout, embedding_dropout}; }
  std::string name() const {
    return describe(shape()) + (mask ? ", masked" : "") +
           (dropout + embedding_dropout > 0 ? ", dropout" : "");
  }
};

std::vector<Variant> every_variant() {
  std::vector<Variant> all;
  for (const Cell cell : {Cell::kLstm, Cell::kGru}) {
    for (const bool bidirectional : {false, true}) {
      for (const int layers : {1, 2}) {
        for (const bool mask : {false, true}) {
          Variant v{cell, bidirectional, layers, mask};
          v.classes = layers == 2 && mask ? 3 : 2;  // more classes on a quarter of them
          all.push_back(v);
        }
      }
    }
  }
  return all;
}

struct Batch {
  std::vector<int32_t> tokens;  // [batch, seq]
  std::vector<double> labels;
  int batch = 0;
  int seq = 0;
};

// Left-padded rows with different amounts of padding (none, some, all but the last step), a 0 inside a
// row (a real token there), and labels of `classes` classes.
Batch padded_batch(int vocab, int classes, int batch, int seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch out{std::vector<int32_t>(static_cast<std::size_t>(batch * seq)),
            std::vector<double>(static_cast<std::size_t>(batch)), batch, seq};
  for (int b = 0; b < batch; ++b) {
    const int padding = b == 0 ? 0 : b == 1 ? seq - 1 : static_cast<int>(rng() % static_cast<uint64_t>(seq));
    for (int t = 0; t < seq; ++t) {
      out.tokens[static_cast<std::size_t>(b * seq + t)] =
          t < padding ? 0 : 1 + static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab - 1));
    }
    if (padding + 2 < seq) out.tokens[static_cast<std::size_t>(b * seq + padding + 1)] = 0;
    out.labels[static_cast<std::size_t>(b)] = static_cast<double>(rng() % static_cast<uint64_t>(classes));
  }
  return out;
}

// Parameters that give every gate a useful range (the test fixture's), in double.
template <typename Scalar>
void load_test_params(CpuRnnClassifier<Scalar>& model, uint64_t seed) {
  const std::vector<float> init = ddp::testing::test_params(model.layout(), seed);
  std::copy(init.begin(), init.end(), model.params().begin());
}

// The batch's mean loss with dropout's masks from `key` (a training step's), or none (evaluate).
double mean_loss(CpuRnnClassifier<double>& model, const Batch& batch, bool dropout, uint64_t key) {
  if (!dropout) {
    return model.evaluate(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum /
           batch.batch;
  }
  model.set_dropout_key(key);
  return model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum /
         batch.batch;
}

void check_gradients(const Variant& v) {
  const ModelShape shape = v.shape();
  CpuRnnClassifier<double> model(shape, v.options());
  load_test_params(model, 7);
  const Batch batch = padded_batch(shape.vocab_size, shape.classes, 4, 6, 11);
  const bool dropout = v.dropout + v.embedding_dropout > 0;
  const uint64_t key = 99;
  model.set_dropout_key(key);
  model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
  const std::vector<double> analytic(model.grads().begin(), model.grads().end());

  const double eps = 1e-6;
  auto params = model.params();
  for (const auto& tensor : model.layout().tensors()) {
    double worst = 0, largest = 0;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
      const double saved = params[i];
      params[i] = saved + eps;
      const double plus = mean_loss(model, batch, dropout, key);
      params[i] = saved - eps;
      const double minus = mean_loss(model, batch, dropout, key);
      params[i] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      const double a = analytic[i];
      // As in model_test.cpp: relative above ~1e-9, absolute below.
      worst = std::max(worst, std::abs(a - numeric) / std::max(1e-3, std::abs(a) + std::abs(numeric)));
      largest = std::max(largest, std::abs(a));
    }
    EXPECT_LT(worst, 1e-6) << v.name() << ": " << tensor.name;
    EXPECT_GT(largest, 1e-5) << v.name() << ": " << tensor.name << " has no gradient to check";
  }
}

TEST(ModelVariants, GradientsMatchFiniteDifferences) {
  for (const Variant& v : every_variant()) check_gradients(v);
}

TEST(ModelVariants, GradientsMatchFiniteDifferencesWithDropout) {
  // The masks of a training step are fixed by its key, so the loss is a function of the parameters alone.
  Variant lstm{Cell::kLstm, true, 2, true, 2, 0.3, 0.2};
  Variant gru{Cell::kGru, false, 2, false, 4, 0.5, 0.1};
  check_gradients(lstm);
  check_gradients(gru);
}

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// A forward pass written from param_layout.h's formulas, one sample and one step at a time, no BLAS: the
// CPU model's batched, time-major, GEMM-based code must give its logits.
std::vector<double> plain_logits(const ModelShape& shape, const std::vector<double>& p,
                                 const std::vector<int32_t>& tokens, int seq, bool mask) {
  const ParamLayout layout(shape);
  const int h = shape.hidden, gates = shape.gates();
  auto at = [&](const std::string& name) { return p.data() + layout.tensor(name).offset; };
  int start = 0;
  while (mask && start + 1 < seq && tokens[static_cast<std::size_t>(start)] == 0) ++start;
  // input[t] of the current layer
  std::vector<std::vector<double>> input(static_cast<std::size_t>(seq));
  const double* embedding = at("embedding");
  for (int t = 0; t < seq; ++t) {
    const double* row = embedding + static_cast<std::size_t>(tokens[static_cast<std::size_t>(t)]) *
                                        static_cast<std::size_t>(shape.embedding_dim);
    input[static_cast<std::size_t>(t)].assign(row, row + shape.embedding_dim);
  }
  std::vector<double> last;
  for (int l = 0; l < shape.layers; ++l) {
    std::vector<std::vector<double>> output(static_cast<std::size_t>(seq));
    std::vector<double> final_states;
    for (int d = 0; d < shape.directions(); ++d) {
      const std::string prefix = shape.tensor_prefix(l, d) + ".";
      const double *w_ih = at(prefix + "w_ih"), *w_hh = at(prefix + "w_hh");
      const double *b_ih = at(prefix + "b_ih"), *b_hh = at(prefix + "b_hh");
      const int in = static_cast<int>(input[0].size());
      std::vector<double> hs(static_cast<std::size_t>(h), 0.0), cs(static_cast<std::size_t>(h), 0.0);
      for (int s = 0; s < seq; ++s) {
        const int t = d == 0 ? s : seq - 1 - s;
        const auto& x = input[static_cast<std::size_t>(t)];
        if (t >= start) {
          std::vector<double> gx(static_cast<std::size_t>(gates * h)),
              gh(static_cast<std::size_t>(gates * h));
          for (int r = 0; r < gates * h; ++r) {
            double a = b_ih[r], b = b_hh[r];
            for (int k = 0; k < in; ++k) a += w_ih[r * in + k] * x[static_cast<std::size_t>(k)];
            for (int k = 0; k < h; ++k) b += w_hh[r * h + k] * hs[static_cast<std::size_t>(k)];
            gx[static_cast<std::size_t>(r)] = a;
            gh[static_cast<std::size_t>(r)] = b;
          }
          std::vector<double> next(static_cast<std::size_t>(h));
          for (int j = 0; j < h; ++j) {
            auto gate = [&](int g) { return static_cast<std::size_t>(g * h + j); };
            if (shape.cell == Cell::kLstm) {
              const double i = sigmoid(gx[gate(0)] + gh[gate(0)]), f = sigmoid(gx[gate(1)] + gh[gate(1)]);
              const double g = std::tanh(gx[gate(2)] + gh[gate(2)]), o = sigmoid(gx[gate(3)] + gh[gate(3)]);
              cs[static_cast<std::size_t>(j)] = f * cs[static_cast<std::size_t>(j)] + i * g;
              next[static_cast<std::size_t>(j)] = o * std::tanh(cs[static_cast<std::size_t>(j)]);
            } else {
              const double r = sigmoid(gx[gate(0)] + gh[gate(0)]), z = sigmoid(gx[gate(1)] + gh[gate(1)]);
              const double n = std::tanh(gx[gate(2)] + r * gh[gate(2)]);
              next[static_cast<std::size_t>(j)] = (1 - z) * n + z * hs[static_cast<std::size_t>(j)];
            }
          }
          hs = next;
        }
        auto& out = output[static_cast<std::size_t>(t)];
        out.insert(out.end(), hs.begin(), hs.end());  // directions side by side, forward first
      }
      final_states.insert(final_states.end(), hs.begin(), hs.end());
    }
    input = output;
    last = final_states;
  }
  std::vector<double> logits(static_cast<std::size_t>(shape.outputs()));
  const double *w = at("dense.w"), *b = at("dense.b");
  for (int k = 0; k < shape.outputs(); ++k) {
    double z = b[k];
    for (std::size_t j = 0; j < last.size(); ++j)
      z += w[static_cast<std::size_t>(k) * last.size() + j] * last[j];
    logits[static_cast<std::size_t>(k)] = z;
  }
  return logits;
}

TEST(ModelVariants, AgreeWithAPlainForwardFromTheFormulas) {
  for (const Variant& v : every_variant()) {
    const ModelShape shape = v.shape(17, 6, 5);
    CpuRnnClassifier<double> model(shape, v.options());
    load_test_params(model, 21);
    const Batch batch = padded_batch(shape.vocab_size, shape.classes, 5, 7, 3);
    std::vector<double> probabilities(static_cast<std::size_t>(batch.batch * shape.outputs()));
    model.evaluate(batch.tokens.data(), nullptr, batch.batch, batch.seq, probabilities);
    const std::vector<double> params(model.params().begin(), model.params().end());
    for (int b = 0; b < batch.batch; ++b) {
      const std::vector<int32_t> row(batch.tokens.begin() + b * batch.seq,
                                     batch.tokens.begin() + (b + 1) * batch.seq);
      const std::vector<double> z = plain_logits(shape, params, row, batch.seq, v.mask);
      std::vector<double> expected(z.size());
      if (z.size() == 1) {
        expected[0] = sigmoid(z[0]);
      } else {
        double sum = 0;
        for (double x : z) sum += std::exp(x);
        for (std::size_t k = 0; k < z.size(); ++k) expected[k] = std::exp(z[k]) / sum;
      }
      for (std::size_t k = 0; k < z.size(); ++k) {
        EXPECT_NEAR(probabilities[static_cast<std::size_t>(b) * z.size() + k], expected[k], 1e-12)
            << v.name() << ", sample " << b << ", output " << k;
      }
    }
  }
}

// With masking, more left padding in front of the same tokens changes nothing; without, it does.
TEST(ModelVariants, MaskingMakesLeftPaddingIrrelevant) {
  for (Variant v : every_variant()) {
    const ModelShape shape = v.shape(17, 6, 5);
    const std::vector<int32_t> tokens{4, 0, 9, 3, 12};
    std::vector<std::vector<double>> results;
    for (const int padding : {0, 1, 4}) {
      CpuRnnClassifier<double> model(shape, v.options());
      load_test_params(model, 8);
      std::vector<int32_t> row(static_cast<std::size_t>(padding), 0);
      row.insert(row.end(), tokens.begin(), tokens.end());
      std::vector<double> probabilities(static_cast<std::size_t>(shape.outputs()));
      model.evaluate(row.data(), nullptr, 1, static_cast<int>(row.size()), probabilities);
      results.push_back(probabilities);
    }
    double change = 0;
    for (std::size_t r = 1; r < results.size(); ++r) {
      for (std::size_t k = 0; k < results[0].size(); ++k)
        change = std::max(change, std::abs(results[r][k] - results[0][k]));
    }
    if (v.mask) {
      EXPECT_LT(change, 1e-14) << v.name();
    } else {
      EXPECT_GT(change, 1e-6) << v.name() << ": padding should count without masking";
    }
  }
}

TEST(ModelVariants, FloatMatchesDouble) {
  for (const Variant& v : every_variant()) {
    const ModelShape shape = v.shape(50, 16, 12);
    CpuRnnClassifier<float> single(shape, v.options());
    CpuRnnClassifier<double> reference(shape, v.options());
    load_test_params(single, 3);
    load_test_params(reference, 3);
    const Batch batch = padded_batch(shape.vocab_size, shape.classes, 8, 20, 5);
    const std::vector<float> labels(batch.labels.begin(), batch.labels.end());
    const BatchStats fs = single.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
    const BatchStats ds =
        reference.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
    EXPECT_NEAR(fs.loss_sum, ds.loss_sum, 1e-5 * std::abs(ds.loss_sum)) << v.name();
    for (const auto& tensor : single.layout().tensors()) {
      double diff = 0, norm = 0;
      for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
        const double d = reference.grads()[i];
        diff += (single.grads()[i] - d) * (single.grads()[i] - d);
        norm += d * d;
      }
      EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(norm) + 1e-12) << v.name() << ": " << tensor.name;
    }
  }
}

TEST(ParamLayout, EveryVariantInCudnnOrderWithPyTorchNames) {
  for (const Variant& v : every_variant()) {
    const ModelShape shape = v.shape(13, 5, 4);
    const ParamLayout layout(shape);
    const auto& tensors = layout.tensors();
    const std::string cell = shape.cell == Cell::kLstm ? "lstm" : "gru";
    std::size_t i = 0, next = 0;
    auto expect = [&](const std::string& name, std::vector<int64_t> dims) {
      ASSERT_LT(i, tensors.size()) << v.name();
      EXPECT_EQ(tensors[i].name, name) << v.name();
      EXPECT_EQ(tensors[i].shape, dims) << v.name() << ": " << name;
      EXPECT_EQ(tensors[i].offset, next) << v.name() << ": " << name;
      next += tensors[i].size();
      ++i;
    };
    const int64_t g = shape.gates() * 4, width = shape.directions() * 4;
    expect("embedding", {13, 5});
    for (int l = 0; l < shape.layers; ++l) {
      for (int d = 0; d < shape.directions(); ++d) {
        const std::string p = cell + ".l" + std::to_string(l) + (d == 1 ? "_reverse" : "") + ".";
        expect(p + "w_ih", {g, l == 0 ? 5 : width});
        expect(p + "w_hh", {g, 4});
        expect(p + "b_ih", {g});
        expect(p + "b_hh", {g});
      }
    }
    if (shape.classes == 2) {
      expect("dense.w", {width});
      expect("dense.b", {1});
    } else {
      expect("dense.w", {shape.classes, width});
      expect("dense.b", {shape.classes});
    }
    EXPECT_EQ(i, tensors.size()) << v.name();
    EXPECT_EQ(next, layout.total_size()) << v.name();
    ASSERT_EQ(layout.segments().size(), static_cast<std::size_t>(shape.layers) + 2) << v.name();
    EXPECT_EQ(layout.segments()[1].name, cell + ".l0") << v.name();
  }
  EXPECT_THROW(ParamLayout(ModelShape{13, 5, 4, 1, Cell::kLstm, false, 1}), std::invalid_argument);
}

TEST(Dropout, MasksKeepTheRateScaleKeptValuesAndRepeatByStream) {
  for (const double rate : {0.1, 0.5, 0.8}) {
    const uint64_t stream = dropout_stream(7, 1);
    const std::size_t n = 200000;
    std::size_t dropped = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float m = dropout_mask_value<float>(stream, i, rate);
      if (m == 0.0f) {
        ++dropped;
      } else {
        EXPECT_EQ(m, static_cast<float>(1.0 / (1.0 - rate)));
      }
      EXPECT_EQ(m, dropout_mask_value<float>(stream, i, rate));
    }
    // Binomial: 5 standard deviations.
    const double sd = std::sqrt(rate * (1 - rate) / static_cast<double>(n));
    EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(n), rate, 5 * sd) << rate;
  }
  // Another draw, another key: other masks (they agree on about half the elements at rate 0.5).
  std::size_t same_draw = 0, same_key = 0;
  for (std::size_t i = 0; i < 10000; ++i) {
    const double m = dropout_mask_value<double>(dropout_stream(7, 1), i, 0.5);
    same_draw += m == dropout_mask_value<double>(dropout_stream(7, 2), i, 0.5);
    same_key += m == dropout_mask_value<double>(dropout_stream(8, 1), i, 0.5);
  }
  EXPECT_NEAR(static_cast<double>(same_draw) / 10000.0, 0.5, 0.05);
  EXPECT_NEAR(static_cast<double>(same_key) / 10000.0, 0.5, 0.05);
}

// A training step with dropout depends on the key alone; evaluation never drops.
TEST(Dropout, TrainingStepsRepeatByKeyAndEvaluationDropsNothing) {
  const Variant v{Cell::kGru, true, 2, true, 3, 0.4, 0.3};
  const ModelShape shape = v.shape(30, 8, 6);
  const Batch batch = padded_batch(shape.vocab_size, shape.classes, 6, 9, 4);
  auto step = [&](uint64_t key) {
    CpuRnnClassifier<double> model(shape, v.options());
    load_test_params(model, 5);
    model.set_dropout_key(key);
    const double loss =
        model.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum;
    return std::make_pair(loss, std::vector<double>(model.grads().begin(), model.grads().end()));
  };
  EXPECT_EQ(step(1), step(1));
  EXPECT_NE(step(1).first, step(2).first);

  CpuRnnClassifier<double> dropping(shape, v.options());
  CpuRnnClassifier<double> plain(shape, Variant{Cell::kGru, true, 2, true, 3}.options());
  load_test_params(dropping, 5);
  load_test_params(plain, 5);
  dropping.set_dropout_key(3);
  const double evaluated =
      dropping.evaluate(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum;
  EXPECT_EQ(evaluated,
            plain.evaluate(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum);
  const double trained =
      plain.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {}).loss_sum;
  EXPECT_EQ(evaluated, trained) << "without dropout a training step's loss is the evaluation's";
}

// A float path against the double reference on every variant, with dropout too (the masks come from the
// key, the same in float and double), over two batch shapes: the loss, every tensor's gradient, and
// evaluation's probabilities. The kinds that split the batch between compute threads run on two, which split
// the batch of 16 between them (and leave the batch of 3 whole).
void expect_float_path_matches_reference(CpuKernels kernels, const std::string& label) {
  std::vector<Variant> variants = every_variant();
  variants.push_back({Cell::kGru, true, 2, true, 3, 0.3, 0.2});
  variants.push_back({Cell::kLstm, false, 3, false, 2, 0.2, 0.1});
  for (const Variant& v : variants) {
    // auto runs every variant: its choice does not depend on the variant.
    EXPECT_EQ(parse_cpu_kernels("auto", v.shape(), v.options()), parse_cpu_kernels("auto")) << v.name();
    const ModelShape shape = v.shape(50, 16, 12);
    CpuRnnClassifier<float> fast(shape, v.options());
    if (kernels == CpuKernels::kOnednn) fast.use_onednn();
    if (kernels == CpuKernels::kOnednnGemm) fast.use_onednn_products();
    if (kernels == CpuKernels::kPacked) {  // as the replica builds it
      fast.use_packed_recurrent();
      if (onednn_missing().empty()) fast.use_onednn_products();
    }
    if (kernels != CpuKernels::kOnednn) set_loop_threads(2);
    CpuRnnClassifier<double> reference(shape, v.options());
    load_test_params(fast, 3);
    load_test_params(reference, 3);
    for (const int batch_size : {16, 3}) {
      const Batch batch = padded_batch(shape.vocab_size, shape.classes, batch_size, 20, 5 + batch_size);
      const std::vector<float> labels(batch.labels.begin(), batch.labels.end());
      fast.set_dropout_key(7);
      reference.set_dropout_key(7);
      const BatchStats fs = fast.train_step(batch.tokens.data(), labels.data(), batch.batch, batch.seq, {});
      const BatchStats ds =
          reference.train_step(batch.tokens.data(), batch.labels.data(), batch.batch, batch.seq, {});
      const std::string what = v.name() + ", " + label + ", batch " + std::to_string(batch_size);
      EXPECT_NEAR(fs.loss_sum, ds.loss_sum, 1e-5 * std::abs(ds.loss_sum)) << what;
      for (const auto& tensor : fast.layout().tensors()) {
        double diff = 0, norm = 0;
        for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
          const double d = reference.grads()[i];
          diff += (fast.grads()[i] - d) * (fast.grads()[i] - d);
          norm += d * d;
        }
        EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(norm) + 1e-12) << what << ": " << tensor.name;
      }
      std::vector<float> p(static_cast<std::size_t>(batch.batch * shape.outputs()));
      std::vector<double> q(p.size());
      fast.evaluate(batch.tokens.data(), nullptr, batch.batch, batch.seq, p);
      reference.evaluate(batch.tokens.data(), nullptr, batch.batch, batch.seq, q);
      for (std::size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], q[i], 1e-5) << what << ", output " << i;
    }
    set_loop_threads(1);
  }
}

// oneDNN's primitives (each direction a layer of its own; masking by shifting the forward direction's
// rows), and our cells over its sgemm.
TEST(CpuKernels, OnednnMatchesTheDoubleReferenceOnEveryVariant) {
  if (const std::string why = onednn_missing(); !why.empty()) GTEST_SKIP() << why;
  expect_float_path_matches_reference(CpuKernels::kOnednn, "primitives");
  expect_float_path_matches_reference(CpuKernels::kOnednnGemm, "sgemm");
}

// Our cells with each time step's recurrent product on the packed tiles (the other products on oneDNN's
// sgemm, or the BLAS in a build without oneDNN), every thread its rows of the batch.
TEST(CpuKernels, PackedTilesMatchTheDoubleReferenceOnEveryVariant) {
  if (const std::string why = packed_gemm_missing(); !why.empty()) GTEST_SKIP() << why;
  expect_float_path_matches_reference(CpuKernels::kPacked, "packed tiles");
}

}  // namespace
}  // namespace ddp::models

// The contract every model replica of models/replica.h keeps, as one typed test suite: the CPU replica runs
// it in the unit tests (tests/unit/replica_contract_test.cpp), the cuDNN replica in the GPU tests
// (tests/gpu/replica_contract_gpu_test.cpp), each through a Kind that says how to make the replica, its
// optimizer and batches in its memory, and why it cannot run here (then every test skips, saying so).
//
//   struct Kind {
//     static std::optional<std::string> unavailable();
//     static std::unique_ptr<models::Replica> make(const models::ModelShape& shape,
//                                                  const models::ModelOptions& options = {});
//     static std::unique_ptr<engine::Optimizer> optimizer(const engine::OptimizerSettings&,
//     models::Replica&); static std::unique_ptr<PlacedBatch> place(const HostBatch& batch);  // in the
//     replica's memory
//   };
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/optimizer/optimizer.h"
#include "models/initializers.h"
#include "models/param_layout.h"
#include "models/replica.h"

namespace ddp::testing {

struct HostBatch {
  std::vector<int32_t> tokens;  // [batch, seq]
  std::vector<float> labels;
  int batch = 0;
  int seq = 0;

  BatchView view() const { return {tokens.data(), labels.data(), batch, seq, tokens.data()}; }
};

// A batch where a replica reads it; view() is valid while the object lives.
class PlacedBatch {
 public:
  virtual ~PlacedBatch() = default;
  virtual BatchView view() const = 0;
};

// Random tokens, a few left-padded rows (0 is an ordinary token for the model) and random labels.
inline HostBatch contract_random_batch(int vocab, int batch, int seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostBatch out{std::vector<int32_t>(static_cast<std::size_t>(batch * seq)),
                std::vector<float>(static_cast<std::size_t>(batch)), batch, seq};
  for (auto& t : out.tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  for (int b = 0; b < batch; b += 3) {
    const int padding = static_cast<int>(rng() % static_cast<uint64_t>(seq / 2));
    for (int t = 0; t < padding; ++t) out.tokens[static_cast<std::size_t>(b * seq + t)] = 0;
  }
  for (auto& y : out.labels) y = static_cast<float>(rng() % 2);
  return out;
}

// Label: token 4 appears somewhere before a token 3. Needs the recurrence to carry state across steps.
inline HostBatch order_task_batch(int vocab, int batch, int seq, std::mt19937_64& rng) {
  HostBatch out{std::vector<int32_t>(static_cast<std::size_t>(batch * seq)),
                std::vector<float>(static_cast<std::size_t>(batch)), batch, seq};
  for (int b = 0; b < batch; ++b) {
    bool seen_four = false;
    bool label = false;
    for (int t = 0; t < seq; ++t) {
      const auto token = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
      out.tokens[static_cast<std::size_t>(b * seq + t)] = token;
      if (token == 3 && seen_four) label = true;
      if (token == 4) seen_four = true;
    }
    out.labels[static_cast<std::size_t>(b)] = label ? 1.0f : 0.0f;
  }
  return out;
}

template <typename Kind>
class ReplicaContract : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::optional<std::string> why = Kind::unavailable()) GTEST_SKIP() << *why;
  }
};

TYPED_TEST_SUITE_P(ReplicaContract);

// The flat buffers have the layout's size; host copies of the parameters are exact; forward and backward
// read the parameters and never write them; a buffer of the wrong size is refused.
TYPED_TEST_P(ReplicaContract, HostCopiesAreExactAndStepsLeaveParametersAlone) {
  const models::ModelShape shape{100, 32, 32, 2};
  auto replica = TypeParam::make(shape);
  const models::ParamLayout& layout = replica->layout();
  ASSERT_EQ(replica->params().size(), layout.total_size());
  ASSERT_EQ(replica->grads().size(), layout.total_size());

  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> params(layout.total_size());
  for (auto& p : params) p = normal(rng);
  replica->copy_params_from_host(params);
  std::vector<float> back(layout.total_size());
  replica->copy_params_to_host(back);
  EXPECT_EQ(back, params);

  const HostBatch host = contract_random_batch(shape.vocab_size, 8, 12, 3);
  const auto placed = TypeParam::place(host);
  replica->train_step(placed->view(), {});
  replica->evaluate(placed->view());
  std::vector<float> probabilities(static_cast<std::size_t>(host.batch));
  replica->predict(placed->view(), probabilities);
  replica->take_stats();
  replica->copy_params_to_host(back);
  EXPECT_EQ(back, params);
  std::vector<float> grads(layout.total_size());
  replica->copy_grads_to_host(grads);
  EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return std::isfinite(g); }));
  EXPECT_TRUE(std::any_of(grads.begin(), grads.end(), [](float g) { return g != 0.0f; }));

  EXPECT_THROW(replica->copy_params_from_host(std::vector<float>(3)), std::invalid_argument);
}

// Predicting needs no labels and adds nothing to the stats; with every label 1, evaluate's loss is the sum of
// -log p over the batch; take_stats() counts the samples since the last call, then starts afresh.
TYPED_TEST_P(ReplicaContract, PredictMatchesEvaluateAndStatsCount) {
  const models::ModelShape shape{100, 8, 6, 1};
  auto replica = TypeParam::make(shape);
  std::vector<float> params(replica->layout().total_size());
  models::initialize_keras(replica->layout(), params, 7);
  replica->copy_params_from_host(params);
  HostBatch host = contract_random_batch(shape.vocab_size, 5, 6, 11);
  std::fill(host.labels.begin(), host.labels.end(), 1.0f);
  const auto placed = TypeParam::place(host);
  const BatchView no_labels{placed->view().tokens, nullptr, host.batch, host.seq, host.tokens.data()};
  std::vector<float> p(5);
  replica->predict(no_labels, p);
  EXPECT_EQ(replica->take_stats().count, 0) << "predicting is not evaluating";
  replica->evaluate(placed->view());
  replica->evaluate(placed->view());
  const models::BatchStats stats = replica->take_stats();
  double minus_log_p = 0;
  for (const float x : p) {
    ASSERT_GT(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    minus_log_p -= std::log(static_cast<double>(x));
  }
  EXPECT_EQ(stats.count, 10);
  EXPECT_NEAR(stats.loss_sum, 2 * minus_log_p, 1e-4);
  EXPECT_EQ(replica->take_stats().count, 0);
}

// Trained with its own optimizer, the replica learns a task that needs the recurrence: the held-out loss
// halves.
TYPED_TEST_P(ReplicaContract, LearnsAToyTask) {
  const models::ModelShape shape{8, 8, 16, 1};
  const int seq = 10;
  auto replica = TypeParam::make(shape);
  std::vector<float> params(replica->layout().total_size());
  models::initialize_keras(replica->layout(), params, 1);
  replica->copy_params_from_host(params);
  optim::OptimizerSettings settings;
  settings.name = "adam";
  settings.learning_rate = 0.01;
  auto optimizer = TypeParam::optimizer(settings, *replica);

  std::mt19937_64 rng(2024);
  const auto held_out = TypeParam::place(order_task_batch(shape.vocab_size, 256, seq, rng));
  auto held_out_loss = [&] {
    replica->take_stats();  // drop the training steps' stats
    replica->evaluate(held_out->view());
    return replica->take_stats().loss_sum / 256;
  };
  const double before = held_out_loss();
  // The batches are placed before training: each step only enqueues work, as in the trainer.
  std::vector<std::unique_ptr<PlacedBatch>> batches;
  for (int step = 0; step < 100; ++step)
    batches.push_back(TypeParam::place(order_task_batch(shape.vocab_size, 32, seq, rng)));
  for (const auto& batch : batches) {
    replica->train_step(batch->view(), {});
    optimizer->step(replica->params(), replica->grads());
  }
  const double after = held_out_loss();
  EXPECT_LT(after, 0.5 * before) << "before " << before << ", after " << after;
}

// Dropout between stacked layers drops each input of the layer above with probability model.dropout. With
// one sample of one time step, the gradient of the upper layer's input weights is zero in exactly the
// columns whose input was dropped (elsewhere it is the input times the gate gradients), so the share of zero
// columns over many steps estimates the rate: more than 6 standard deviations off fails.
TYPED_TEST_P(ReplicaContract, DropoutBetweenLayersDropsAtItsRate) {
  const models::ModelShape shape{20, 8, 64, 2};
  for (const double rate : {0.25, 0.6}) {
    models::ModelOptions options;
    options.dropout = rate;
    auto replica = TypeParam::make(shape, options);
    const models::ParamLayout& layout = replica->layout();
    std::vector<float> params(layout.total_size());
    models::initialize_keras(layout, params, 3);
    replica->copy_params_from_host(params);
    const models::ParamTensor& upper = layout.tensor(shape.tensor_prefix(1, 0) + ".w_ih");
    const auto rows = static_cast<std::size_t>(upper.shape.at(0));
    const auto columns = static_cast<std::size_t>(upper.shape.at(1));
    std::vector<float> grads(layout.total_size());
    int64_t dropped = 0;
    int64_t seen = 0;
    for (int step = 0; step < 60; ++step) {
      const HostBatch one{
          {static_cast<int32_t>(1 + step % (shape.vocab_size - 1))}, {static_cast<float>(step % 2)}, 1, 1};
      const auto placed = TypeParam::place(one);
      replica->set_dropout_key(static_cast<uint64_t>(1000 + step));
      replica->train_step(placed->view(), {});
      replica->copy_grads_to_host(grads);
      for (std::size_t c = 0; c < columns; ++c) {
        bool zero = true;
        for (std::size_t r = 0; r < rows && zero; ++r) zero = grads[upper.offset + r * columns + c] == 0.0f;
        dropped += zero ? 1 : 0;
        ++seen;
      }
    }
    replica->take_stats();
    const double share = static_cast<double>(dropped) / static_cast<double>(seen);
    const double deviation = std::sqrt(rate * (1 - rate) / static_cast<double>(seen));
    EXPECT_NEAR(share, rate, 6 * deviation) << dropped << " of " << seen << " inputs dropped";
  }
}

REGISTER_TYPED_TEST_SUITE_P(ReplicaContract, HostCopiesAreExactAndStepsLeaveParametersAlone,
                            PredictMatchesEvaluateAndStatsCount, LearnsAToyTask,
                            DropoutBetweenLayersDropsAtItsRate);

}  // namespace ddp::testing

// What the communication interfaces promise without any peer: agree_on_errors marks the errors it agreed on,
// and AbortOnUnwind aborts a gradient reducer only when an exception leaves its scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/stall_census.h"
#include "engine/all_reduce_step.h"
#include "engine/base/errors.h"
#include "engine/optimizer/optimizer.h"
#include "models/initializers.h"
#include "models/loss_scale.h"
#include "models/param_layout.h"
#include "models/replica.h"
#include "tests/forwarding_replica.h"

namespace ddp::comm {
namespace {

// A reducer without peers: `size` ranks as far as its users can tell, every average this rank's own values
// (an average over ranks that all agree); it counts abort() calls and records where each start_average's
// values start, as offsets from `base`.
class FakeReducer final : public GradientReducer {
 public:
  explicit FakeReducer(int size = 1, std::span<const float> base = {}) : size_(size), base_(base) {}
  int size() const override { return size_; }
  std::string backend() const override { return "fake"; }
  void start_average(std::span<float> values) override {
    // std::less: a total order on pointers, also into another buffer (the delayed exchange's copy).
    const std::less<const float*> before;
    if (!before(values.data(), base_.data()) && before(values.data(), base_.data() + base_.size()))
      started.push_back(static_cast<std::size_t>(values.data() - base_.data()));
  }
  void finish_average() override {}
  std::vector<int32_t> start_average_rows(std::span<float>, std::size_t, std::span<const int32_t>) override {
    return {};
  }
  void abort() override { ++aborts; }

  int aborts = 0;
  std::vector<std::size_t> started;  // offsets of the segments, in the order their reductions started

 private:
  int size_;
  std::span<const float> base_;
};

TEST(AgreeOnErrors, ThrowsTheAgreedErrorAsSuch) {
  HostGroup comm = HostGroup::alone();
  try {
    agree_on_errors(comm, [] { throw UserError("bad key"); });
    FAIL() << "no error";
  } catch (const AgreedUserError& e) {
    EXPECT_STREQ(e.what(), "bad key");
  }
  EXPECT_NO_THROW(agree_on_errors(comm, [] {}));
}

TEST(AbortOnUnwind, AbortsOnlyWhenAnExceptionLeavesTheScope) {
  FakeReducer comm;
  { const AbortOnUnwind guard(&comm); }
  EXPECT_EQ(comm.aborts, 0);
  try {
    const AbortOnUnwind guard(&comm);
    throw std::runtime_error("a failed step");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(comm.aborts, 1);
  // A guard made while another exception is already unwinding (in a destructor) counts from there.
  struct UnwindingDestructor {
    FakeReducer& comm;
    ~UnwindingDestructor() { const AbortOnUnwind guard(&comm); }
  };
  try {
    const UnwindingDestructor outer{comm};
    throw std::runtime_error("outer");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(comm.aborts, 1);
  { const AbortOnUnwind no_communicator(nullptr); }
}

// The one message of a stalled job names the ranks that did not answer, with their hosts; where every rank
// answered it says what each was doing.
TEST(StallCensus, NamesTheRanksThatDidNotAnswer) {
  StallFacts facts;
  facts.world_size = 6;
  facts.hosts = {"a", "a", "b", "b", "c", "c"};
  facts.listened_s = 1.04;
  facts.heard = {{0, "training", 12}, {2, "training", 12}, {3, "training", 12}, {5, "training", 12}};
  EXPECT_EQ(
      describe_stall(facts, 0),
      "ranks 1, 4 (hosts a, c) are hung, lost or slower than the timeout: they did not answer the stalled "
      "ranks 0, 2-3, 5 within 1.0 s");
  facts.heard = {{0, "training", 12},
                 {1, "reading data.path x.h5", 0},
                 {2, "training", 12},
                 {3, "training", 12},
                 {4, "training", 12}};
  EXPECT_EQ(
      describe_stall(facts, 0),
      "rank 5 (host c) is hung, lost or slower than the timeout: it did not answer the stalled ranks 0-4 "
      "within 1.0 s; rank 1 was reading data.path x.h5");
  facts.world_size = 2;
  facts.heard = {{0, "training", 12}, {1, "reading data.path x.h5", 0}};
  EXPECT_EQ(describe_stall(facts, 0),
            "every rank stalled (none failed to answer); rank 1 while reading data.path x.h5; rank 0 while "
            "training (steps done: 12)");
  facts.heard = {{0, "training", 12}, {1, "training", 12}};
  EXPECT_EQ(describe_stall(facts, 0), "every rank stalled (none failed to answer), all while the same thing");
}

// A rank alive answers (its watchdog has not fired: it waits on a peer, or with deadlines of its own): it is
// not blamed, the silent one is, and what the live ones do is said, those in the same phase together. Where
// only live ranks answered, they are the ones the stalled ranks wait for.
TEST(StallCensus, RanksAliveAreNotBlamed) {
  StallFacts facts;
  facts.world_size = 4;
  facts.hosts = {"a", "a", "b", "b"};
  facts.listened_s = 1.0;
  facts.heard = {{0, "writing last.h5", 18, false, 4.92}, {2, "waiting for rank 0", 18}};
  EXPECT_EQ(
      describe_stall(facts, 2),
      "ranks 1, 3 (hosts a, b) are hung, lost or slower than the timeout: they did not answer the stalled "
      "rank 2 within 1.0 s; alive: rank 0 while writing last.h5 (last progress 4.9 s ago)");
  facts.heard = {{0, "training", 18, false, 0.3},
                 {1, "writing last.h5", 18, false, 4.0},
                 {2, "waiting for rank 0", 18},
                 {3, "training", 18, false, 1.26}};
  EXPECT_EQ(
      describe_stall(facts, 2),
      "every rank answered: the stalled rank 2 waits for ranks 0-1, 3 (hosts a, b), alive but slower than "
      "the timeout: ranks 0, 3 while training (last progress up to 1.3 s ago); rank 1 while writing "
      "last.h5 (last progress 4.0 s ago)");
}

}  // namespace
}  // namespace ddp::comm

// --- The order a step starts its reductions in
// ----------------------------------------------------------------

namespace ddp::engine {
namespace {

// A job with a GPU rank starts the dense layer, the embedding (the largest bucket as a rule, which the GPU
// replica finishes right after cuDNN's data backward), then the layers from the top; an all-CPU job follows
// the CPU replica (the layers from the top down to the second, the embedding, the first layer). Whatever
// order the replica reports in.
TEST(AllReduceStep, StartsTheReductionsInTheJobsOrder) {
  const models::ModelShape shape{40, 6, 5, 3};
  const models::ParamLayout layout(shape);
  EXPECT_EQ(layout.reduction_order(/*embedding_early=*/true), (std::vector<std::size_t>{4, 0, 3, 2, 1}));
  EXPECT_EQ(layout.reduction_order(/*embedding_early=*/false), (std::vector<std::size_t>{4, 3, 2, 0, 1}));
  const models::ModelShape one_layer{40, 6, 5, 1};
  EXPECT_EQ(models::ParamLayout(one_layer).reduction_order(true), (std::vector<std::size_t>{2, 0, 1}));
  EXPECT_EQ(models::ParamLayout(one_layer).reduction_order(false), (std::vector<std::size_t>{2, 0, 1}));
  for (const bool gpu_job : {true, false}) {
    auto replica = models::make_cpu_replica(shape);
    comm::FakeReducer comm(2, replica->grads());
    auto sgd = optim::make_optimizer(optim::OptimizerSettings{}, layout.total_size());
    AllReduceStep step(*replica, comm, *sgd, /*sparse_exchange=*/false, 0, false, gpu_job);
    std::vector<int32_t> tokens(4 * 7);
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 40);
    const std::vector<float> labels{0, 1, 1, 0};
    step.run({tokens.data(), labels.data(), 4, 7, tokens.data()});
    std::vector<std::size_t> expected;
    for (const std::size_t index : layout.reduction_order(gpu_job))
      expected.push_back(layout.segments()[index].offset);
    EXPECT_EQ(comm.started, expected) << (gpu_job ? "GPU job" : "CPU job");
  }
}

}  // namespace
}  // namespace ddp::engine

namespace ddp::engine {
namespace {

// The CPU replica whose gradient at its k-th step (from 0) is k + 1 everywhere.
class CountingGradients final : public ddp::testing::ForwardingReplica {
 public:
  using ForwardingReplica::ForwardingReplica;
  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    inner().train_step(batch, on_ready);
    ++steps;
    for (float& g : inner().grads()) g = static_cast<float>(steps);
  }
  int steps = 0;
};

// A tiny model, a batch of one token, and plain SGD with learning rate 1: from zero parameters, their values
// after each step tell which gradients were applied.
struct TinySgdRun {
  const models::ModelShape shape{30, 4, 3, 1};
  const std::vector<int32_t> tokens = std::vector<int32_t>(2 * 5, 3);
  const std::vector<float> labels{0, 1};
  const BatchView batch{tokens.data(), labels.data(), 2, 5, tokens.data()};
  const optim::OptimizerSettings sgd = [] {
    optim::OptimizerSettings settings;
    settings.name = "sgd";
    settings.learning_rate = 1;
    return settings;
  }();
};

// comm.overlap = delayed: step k's gradient is applied at step k + 1, and flush() applies the last one; the
// default applies each step's own.
TEST(AllReduceStep, TheDelayedExchangeAppliesGradientKAtStepKPlusOne) {
  const TinySgdRun run;
  const auto& [shape, tokens, labels, batch, sgd] = run;
  for (const bool delayed : {false, true}) {
    CountingGradients replica(models::make_cpu_replica(shape));
    const std::vector<float> zeros(replica.layout().total_size(), 0.0f);
    replica.copy_params_from_host(zeros);
    comm::FakeReducer comm(2, replica.grads());  // two ranks that agree: the average is our own
    auto optimizer = optim::make_optimizer(sgd, replica.layout().total_size());
    AllReduceStep step(replica, comm, *optimizer, /*sparse_exchange=*/false, 0, delayed);
    // After each step: the parameters' value (all alike).
    std::vector<float> after;
    for (int k = 0; k < 3; ++k) {
      step.run(batch);
      after.push_back(replica.params()[0]);
      EXPECT_EQ(std::count(replica.params().begin(), replica.params().end(), after.back()),
                static_cast<std::ptrdiff_t>(replica.params().size()));
    }
    step.flush();
    after.push_back(replica.params()[0]);
    if (delayed) {
      EXPECT_EQ(after, (std::vector<float>{0, -1, -3, -6})) << "gradient k at step k + 1, the last at flush";
    } else {
      EXPECT_EQ(after, (std::vector<float>{-1, -3, -6, -6})) << "each step's own gradient";
    }
  }
}

// model.precision = fp16: a step whose averaged gradient is not finite is not applied (parameters and the
// optimizer's count stay), the replica hears of every step's fate, and the next finite step applies again.
class OverflowingGradients final : public ddp::testing::ForwardingReplica {
 public:
  using ForwardingReplica::ForwardingReplica;
  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    inner().train_step(batch, on_ready);
    ++steps;
    for (float& g : inner().grads()) g = 1.0f;
    if (steps == 2) inner().grads()[5] = INFINITY;
    if (steps == 3) inner().grads()[0] = NAN;
  }
  void after_update(bool applied) override { fates.push_back(applied); }
  int steps = 0;
  std::vector<bool> fates;
};

TEST(AllReduceStep, AStepWhoseAverageIsNotFiniteIsSkipped) {
  const TinySgdRun run;
  const auto& [shape, tokens, labels, batch, sgd] = run;
  OverflowingGradients replica(models::make_cpu_replica(shape));
  const std::vector<float> zeros(replica.layout().total_size(), 0.0f);
  replica.copy_params_from_host(zeros);
  comm::FakeReducer comm(2, replica.grads());
  auto optimizer = optim::make_optimizer(sgd, replica.layout().total_size());
  AllReduceStep step(replica, comm, *optimizer, /*sparse_exchange=*/false, 0, false, /*gpu_job=*/true,
                     /*skip_nonfinite=*/true);
  std::vector<float> after;
  for (int k = 0; k < 4; ++k) {
    step.run(batch);
    after.push_back(replica.params()[1]);
  }
  EXPECT_EQ(after, (std::vector<float>{-1, -1, -1, -2}));
  EXPECT_EQ(replica.fates, (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(optimizer->iterations(), 2);
  // Without skipping (every other precision) the infinity reaches the parameters.
  OverflowingGradients plain(models::make_cpu_replica(shape));
  plain.copy_params_from_host(zeros);
  comm::FakeReducer plain_comm(2, plain.grads());
  auto plain_optimizer = optim::make_optimizer(sgd, plain.layout().total_size());
  AllReduceStep plain_step(plain, plain_comm, *plain_optimizer, false);
  plain_step.run(batch);
  plain_step.run(batch);
  EXPECT_TRUE(std::isinf(plain.params()[5]));
  EXPECT_TRUE(plain.fates.empty());
}

// The loss scale: 2^16 at first, halved by each skipped step (not below 1), doubled after 2000 applied steps
// in a row (not above 2^24).
TEST(LossScale, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  models::LossScale scale;
  EXPECT_EQ(scale.scale(), 65536.0f);
  scale.update(false);
  EXPECT_EQ(scale.scale(), 32768.0f);
  for (int i = 0; i < 1999; ++i) scale.update(true);
  EXPECT_EQ(scale.scale(), 32768.0f);
  scale.update(true);
  EXPECT_EQ(scale.scale(), 65536.0f);
  for (int i = 0; i < 1999; ++i) scale.update(true);
  scale.update(false);  // an overflow restarts the count
  for (int i = 0; i < 1999; ++i) scale.update(true);
  EXPECT_EQ(scale.scale(), 32768.0f);
  EXPECT_EQ(scale.skipped(), 2);
  for (int i = 0; i < 40; ++i) scale.update(false);
  EXPECT_EQ(scale.scale(), 1.0f);
  for (int i = 0; i < 2000 * 30; ++i) scale.update(true);
  EXPECT_EQ(scale.scale(), 16777216.0f);
}

// A checkpoint's state: restored into a fresh scale, the updates go on as they would have, down to the step
// at which the scale grows; states update() cannot reach are refused.
TEST(LossScale, ARestoredStateGoesOnAsTheUninterruptedOne) {
  models::LossScale straight;
  for (int i = 0; i < 3; ++i) straight.update(false);
  for (int i = 0; i < 1500; ++i) straight.update(true);
  models::LossScale resumed;
  resumed.restore(straight.state());
  EXPECT_EQ(resumed.state().scale, 8192.0f);
  EXPECT_EQ(resumed.state().clean_steps, 1500);
  EXPECT_EQ(resumed.skipped(), 3);
  for (int i = 0; i < 499; ++i) {
    straight.update(true);
    resumed.update(true);
  }
  EXPECT_EQ(resumed.scale(), 8192.0f);
  straight.update(true);
  resumed.update(true);
  EXPECT_EQ(resumed.scale(), 16384.0f);
  EXPECT_EQ(resumed.state().clean_steps, straight.state().clean_steps);

  EXPECT_EQ(models::LossScale::invalid({65536.0f, 0, 0}), "");
  EXPECT_EQ(models::LossScale::invalid({1.0f, 1999, 5}), "");
  for (const models::LossScale::State bad : {models::LossScale::State{3.0f, 0, 0},
                                             {0.5f, 0, 0},
                                             {33554432.0f, 0, 0},
                                             {-2.0f, 0, 0},
                                             {std::numeric_limits<float>::quiet_NaN(), 0, 0},
                                             {1024.0f, 2000, 0},
                                             {1024.0f, -1, 0},
                                             {1024.0f, 0, -1}}) {
    EXPECT_NE(models::LossScale::invalid(bad), "")
        << bad.scale << " " << bad.clean_steps << " " << bad.skipped;
    EXPECT_THROW(resumed.restore(bad), std::invalid_argument);
  }
}

}  // namespace
}  // namespace ddp::engine

namespace ddp::engine {
namespace {

// With the CPU replica's real gradients and Adam, the delayed step is exactly its definition, bit for bit:
// the gradient computed at the parameters plus the last update (none before the first update), the parameters
// restored, then the optimizer applied to the previous step's gradient.
TEST(AllReduceStep, TheDelayedExchangeIsThePreviousGradientAppliedAfterBackward) {
  const models::ModelShape shape{40, 6, 5, 2};
  const models::ParamLayout layout(shape);
  std::vector<float> initial(layout.total_size());
  models::initialize_keras(layout, initial, 3);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> batches(6, std::vector<int32_t>(4 * 7));
  for (auto& tokens : batches)
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % 40);
  const std::vector<float> labels{0, 1, 1, 0};

  auto delayed_replica = models::make_cpu_replica(shape);
  delayed_replica->copy_params_from_host(initial);
  comm::FakeReducer comm(2, delayed_replica->grads());
  auto adam = optim::make_optimizer(optim::OptimizerSettings{}, layout.total_size());
  AllReduceStep delayed(*delayed_replica, comm, *adam, /*sparse_exchange=*/false, 0, /*delayed=*/true);

  auto reference = models::make_cpu_replica(shape);
  reference->copy_params_from_host(initial);
  auto reference_adam = optim::make_optimizer(optim::OptimizerSettings{}, layout.total_size());
  std::vector<float> previous, last_update;
  const std::span<float> params = reference->params();
  for (auto& tokens : batches) {
    const BatchView batch{tokens.data(), labels.data(), 4, 7, tokens.data()};
    delayed.run(batch);
    const std::vector<float> start(params.begin(), params.end());
    for (std::size_t i = 0; i < last_update.size(); ++i) params[i] += last_update[i];
    reference->train_step(batch, {});
    std::copy(start.begin(), start.end(), params.begin());
    if (!previous.empty()) {
      reference_adam->step(params, previous);
      last_update.resize(params.size());
      for (std::size_t i = 0; i < params.size(); ++i) last_update[i] = params[i] - start[i];
    }
    previous.assign(reference->grads().begin(), reference->grads().end());
  }
  delayed.flush();
  reference_adam->step(params, previous);
  EXPECT_EQ(std::vector<float>(delayed_replica->params().begin(), delayed_replica->params().end()),
            std::vector<float>(reference->params().begin(), reference->params().end()));
}

}  // namespace
}  // namespace ddp::engine

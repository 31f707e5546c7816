// A GPU rank's step replayed from CUDA graphs (engine/step_graph.h), on the host, over the fakes of
// tests/step_graph_fakes.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/all_reduce_step.h"
#include "engine/base/errors.h"
#include "engine/step_graph.h"
#include "models/replica.h"
#include "tests/step_graph_fakes.h"

namespace ddp::engine {
namespace {

using testing::FakeGpuReplica;
using testing::FakeRecorder;
using testing::FakeStream;

// --- StepGraphs' rules

TEST(StepGraphs, RunsAShapeEagerlyThenCapturesItThenReplaysIt) {
  FakeStream stream;
  auto owned = std::make_unique<FakeRecorder>(stream);
  FakeRecorder& recorder = *owned;
  StepGraphs graphs(std::move(owned), /*collective=*/false, /*max_graphs=*/2);
  int ran = 0;  // the step's device work, run
  int enqueued = 0;
  const auto step = [&] {
    ++enqueued;
    stream.enqueue([&] { ++ran; });
  };
  using Run = StepGraphs::Run;
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kEager);
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kCaptured);
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kReplayed);
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kReplayed);
  EXPECT_EQ(enqueued, 2) << "the host enqueues the work of the first two steps only";
  EXPECT_EQ(ran, 4) << "every step's work runs once, the captured one from its graph";
  // The last, shorter batch: its own graph from its second time on.
  EXPECT_EQ(graphs.run(7, 80, 1, step), Run::kEager);
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kReplayed);
  EXPECT_EQ(graphs.run(7, 80, 1, step), Run::kCaptured);
  EXPECT_EQ(graphs.run(7, 80, 1, step), Run::kReplayed);
  EXPECT_EQ(graphs.graphs(), 2u);
  // Beyond max_graphs shapes run eagerly, however often they come.
  EXPECT_EQ(graphs.run(5, 80, 1, step), Run::kEager);
  EXPECT_EQ(graphs.run(5, 80, 1, step), Run::kEager);
  EXPECT_EQ(ran, 10);
  EXPECT_EQ(recorder.captures, 2);
  EXPECT_EQ(recorder.launches, 6);
}

TEST(StepGraphs, DropsItsGraphsWhenTheMemoryMoves) {
  FakeStream stream;
  auto owned = std::make_unique<FakeRecorder>(stream);
  FakeRecorder& recorder = *owned;
  StepGraphs graphs(std::move(owned), /*collective=*/false);
  const auto step = [&] { stream.enqueue([] {}); };
  using Run = StepGraphs::Run;
  graphs.run(32, 80, 1, step);
  EXPECT_EQ(graphs.run(32, 80, 1, step), Run::kCaptured);
  EXPECT_EQ(graphs.run(32, 80, 2, step), Run::kEager) << "a graph of the old memory is not replayed";
  EXPECT_EQ(recorder.clears, 1);
  EXPECT_EQ(graphs.graphs(), 0u);
  EXPECT_EQ(graphs.run(32, 80, 2, step), Run::kCaptured);
  EXPECT_EQ(graphs.run(32, 80, 2, step), Run::kReplayed);
}

// With NCCL's all-reduce in the step, every rank must run it eagerly, captured or replayed alike: memory
// settled before the first step is fine, a rank whose memory moves later ends the job instead of running
// eagerly while the others replay.
TEST(StepGraphs, WithACollectiveTheMemoryMayNotMoveAfterTheFirstStep) {
  FakeStream stream;
  StepGraphs graphs(std::make_unique<FakeRecorder>(stream), /*collective=*/true);
  const auto step = [&] { stream.enqueue([] {}); };
  using Run = StepGraphs::Run;
  EXPECT_EQ(graphs.run(32, 80, 7, step), Run::kEager) << "the generation of start-up's shapes";
  EXPECT_EQ(graphs.run(32, 80, 7, step), Run::kCaptured);
  EXPECT_EQ(graphs.run(32, 80, 7, step), Run::kReplayed);
  const ThrowFatalErrors throw_instead_of_abort;
  try {
    graphs.run(32, 80, 8, step);
    ADD_FAILURE() << "a reallocation after the first step went on";
  } catch (const FatalError& e) {
    EXPECT_NE(std::string(e.what()).find("generation 7 to 8, a 32x80 batch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("train.cuda_graph = off"), std::string::npos) << e.what();
  }
}

TEST(StepGraphs, AnErrorWhileCapturingEndsTheCaptureAndPropagates) {
  FakeStream stream;
  auto owned = std::make_unique<FakeRecorder>(stream);
  FakeRecorder& recorder = *owned;
  StepGraphs graphs(std::move(owned), /*collective=*/false);
  graphs.run(32, 80, 1, [] {});
  EXPECT_THROW(graphs.run(32, 80, 1, [] { throw std::runtime_error("cudnnRNNForward failed"); }),
               std::runtime_error);
  EXPECT_EQ(recorder.abandoned, 1);
  EXPECT_EQ(stream.capture, nullptr);
  EXPECT_EQ(graphs.graphs(), 0u);
}

// --- When a step can be replayed

TEST(StepGraphRefusal, NamesWhatKeepsTheStepEager) {
  EXPECT_EQ(step_graph_refusal(StepGraphFacts{}), "");
  const std::string masked = "model.mask_padding: each batch's sequence lengths go into cuDNN's descriptors";
  const std::vector<std::pair<std::function<void(StepGraphFacts&)>, std::string>> cases{
      {[](StepGraphFacts& f) { f.wanted = false; }, "train.cuda_graph = off"},
      {[&](StepGraphFacts& f) { f.replica_refusal = masked; }, masked},
      {[](StepGraphFacts& f) {
         f.reducer_capturable = false;
         f.backend = "mpi";
       },
       "the mpi exchange goes through the host"},
      {[](StepGraphFacts& f) { f.optimizer_splits = false; }, "the optimizer runs on the host"},
      {[](StepGraphFacts& f) { f.skips_nonfinite = true; }, "fp16's skipped steps are decided on the host"},
      {[](StepGraphFacts& f) { f.timeline = true; }, "log.timeline times each launch"},
      {[](StepGraphFacts& f) { f.delayed = true; }, "comm.overlap = delayed"}};
  for (const auto& [change, refusal] : cases) {
    StepGraphFacts facts;
    change(facts);
    EXPECT_EQ(step_graph_refusal(facts), refusal);
  }
}

// --- AllReduceStep's graphed step equals its eager one

// Two ranks that agree, on the fake stream: the average is our own gradient, halved and doubled.
class FakeStreamReducer final : public comm::GradientReducer {
 public:
  explicit FakeStreamReducer(FakeStream& stream) : stream_(stream) {}
  std::string backend() const override { return "fake"; }
  int size() const override { return 2; }
  bool capturable() const override { return true; }
  void start_average(std::span<float> segment) override {
    ++started;
    stream_.enqueue([segment] {
      for (float& g : segment) g = (g + g) / 2;
    });
  }
  void finish_average() override {}
  std::vector<int32_t> start_average_rows(std::span<float> matrix, std::size_t,
                                          std::span<const int32_t>) override {
    start_average(matrix);
    return {};
  }
  std::optional<std::string> asynchronous_error() override { return failure; }
  int started = 0;
  std::optional<std::string> failure;  // a peer's, as NCCL would report it

 private:
  FakeStream& stream_;
};

// SGD whose learning rate decays with its count: the count and the rate are the host's, the rate reaches
// the update through the device.
class FakeSplitOptimizer final : public optim::Optimizer {
 public:
  explicit FakeSplitOptimizer(FakeStream& stream) : stream_(stream) {}
  void step(std::span<float> params, std::span<const float> grads, const optim::TouchedRows*,
            float) override {
    prepare_step();
    enqueue_step(params, grads, 0);
  }
  void step_clipped(std::span<float> params, std::span<const float> grads, const optim::TouchedRows*,
                    double clip_norm) override {
    prepare_step();
    enqueue_step(params, grads, clip_norm);
  }
  bool splits_steps() const override { return true; }
  void prepare_step() override {
    const float rate = 1.0f / static_cast<float>(++iterations_ + 1);
    stream_.enqueue([this, rate] { device_rate_ = rate; });
  }
  void enqueue_step(std::span<float> params, std::span<const float> grads, double) override {
    stream_.enqueue([this, params, grads] {
      for (std::size_t i = 0; i < params.size(); ++i) params[i] -= device_rate_ * grads[i];
    });
  }
  optim::OptimizerState state() const override { return {iterations_, {}}; }
  int64_t iterations() const override { return iterations_; }
  void load_state(const optim::OptimizerState& state) override { iterations_ = state.iterations; }
  std::string name() const override { return "fake sgd"; }

 private:
  FakeStream& stream_;
  int64_t iterations_ = 0;
  float device_rate_ = 0;
};

// Two epochs of 3 full batches and a shorter last one, each batch in memory of its own (as a prefetcher's),
// through AllReduceStep over the fakes, eager or from graphs.
struct TwoEpochs {
  const models::ModelShape shape{30, 4, 3, 1};
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> labels;
  std::vector<float> start;

  TwoEpochs() {
    for (int b = 0; b < 8; ++b) {
      const int rows = b % 4 == 3 ? 3 : 5;
      tokens.emplace_back(static_cast<std::size_t>(rows * 6));
      for (std::size_t i = 0; i < tokens.back().size(); ++i)
        tokens.back()[i] = static_cast<int32_t>((i * 7 + static_cast<std::size_t>(b) * 3) % 30);
      labels.emplace_back(static_cast<std::size_t>(rows));
      for (int r = 0; r < rows; ++r)
        labels.back()[static_cast<std::size_t>(r)] = static_cast<float>((r + b) % 2);
    }
    start.resize(models::ParamLayout(shape).total_size());
    for (std::size_t i = 0; i < start.size(); ++i) start[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  }

  struct Result {
    std::vector<std::vector<float>> params;  // after each step
    std::vector<StepGraphs::Run> runs;
    int captures = 0;
    int reductions_enqueued = 0;
    int64_t updates = 0;
  };
  // `fault` is done to the replica first.
  Result train(bool graphed, const std::function<void(FakeGpuReplica&)>& fault = {}) const {
    Result result;
    FakeStream stream;
    FakeGpuReplica replica(models::make_cpu_replica(shape), stream);
    if (fault) fault(replica);
    replica.copy_params_from_host(start);
    FakeStreamReducer reducer(stream);
    FakeSplitOptimizer optimizer(stream);
    AllReduceStep step(replica, reducer, optimizer, /*sparse_exchange=*/false, 0, false, /*gpu_job=*/true,
                       false, /*cuda_graphs=*/graphed);
    auto owned = std::make_unique<FakeRecorder>(stream);
    const FakeRecorder& recorder = *owned;
    if (graphed) step.use_graph_recorder(std::move(owned));
    EXPECT_EQ(step.graph_note(),
              graphed ? "step in a CUDA graph per batch shape" : "eager step (train.cuda_graph = off)");
    for (std::size_t b = 0; b < tokens.size(); ++b) {
      step.run({tokens[b].data(), labels[b].data(), static_cast<int>(labels[b].size()), 6, tokens[b].data()});
      result.params.emplace_back(replica.params().begin(), replica.params().end());
      result.runs.push_back(step.last_run());
    }
    result.captures = graphed ? recorder.captures : 0;
    result.reductions_enqueued = reducer.started;
    result.updates = optimizer.iterations();
    return result;
  }
};

// Eager and from graphs: the same parameters bit for bit after every step; the full batch captured at its
// second step, the short one at its second epoch; the host enqueues the work of those steps only.
TEST(AllReduceStep, StepsReplayedFromGraphsEqualTheEagerSteps) {
  const TwoEpochs epochs;
  const TwoEpochs::Result eager = epochs.train(false);
  const TwoEpochs::Result graphed = epochs.train(true);
  using Run = StepGraphs::Run;
  EXPECT_EQ(graphed.runs, (std::vector<Run>{Run::kEager, Run::kCaptured, Run::kReplayed, Run::kEager,
                                            Run::kReplayed, Run::kReplayed, Run::kReplayed, Run::kCaptured}));
  EXPECT_EQ(graphed.captures, 2);
  const int segments = static_cast<int>(models::ParamLayout(epochs.shape).segments().size());
  EXPECT_EQ(graphed.reductions_enqueued, 4 * segments)
      << "reductions enqueued at the two eager steps and the two captures only";
  EXPECT_EQ(eager.reductions_enqueued, 8 * segments);
  EXPECT_EQ(graphed.updates, 8);
  for (std::size_t k = 0; k < eager.params.size(); ++k) {
    EXPECT_EQ(graphed.params[k], eager.params[k]) << "step " << k;
    if (k > 0) {
      EXPECT_NE(graphed.params[k], graphed.params[k - 1]) << "step " << k << " changed nothing";
    }
  }
}

// What the comparison above catches: a step whose work takes a per-step value from the host when it is
// enqueued, or reads its batch where the caller had it, trains alike eagerly and differently from graphs.
TEST(AllReduceStep, AValueFrozenAtTheCaptureMakesTheReplayedStepsDiffer) {
  const TwoEpochs epochs;
  const std::vector<std::function<void(FakeGpuReplica&)>> faults{
      [](FakeGpuReplica& replica) { replica.reads_draw_on_host = true; },
      [](FakeGpuReplica& replica) { replica.stages_batch = false; }};
  const TwoEpochs::Result reference = epochs.train(false);
  for (std::size_t f = 0; f < faults.size(); ++f) {
    EXPECT_EQ(epochs.train(false, faults[f]).params, reference.params) << "fault " << f << ", eager";
    EXPECT_NE(epochs.train(true, faults[f]).params.back(), reference.params.back())
        << "fault " << f << ", from graphs";
  }
}

// One GPU step over the fakes, from graphs through `recorder`, on a batch of 5 x 6.
struct GraphedStep {
  explicit GraphedStep(const std::function<std::unique_ptr<FakeRecorder>(FakeStream&)>& recorder) {
    step.use_graph_recorder(recorder(stream));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i % 30);
  }
  void run() { step.run({tokens.data(), labels.data(), 5, 6, tokens.data()}); }

  FakeStream stream;
  FakeGpuReplica replica{models::make_cpu_replica(models::ModelShape{30, 4, 3, 1}), stream};
  FakeStreamReducer reducer{stream};
  FakeSplitOptimizer optimizer{stream};
  AllReduceStep step{replica,          reducer, optimizer,           false, 0, false,
                     /*gpu_job=*/true, false,   /*cuda_graphs=*/true};
  std::vector<int32_t> tokens = std::vector<int32_t>(5 * 6);
  std::vector<float> labels{0, 1, 0, 1, 1};
};

// An eager step learns of a peer's failure as it enqueues the reductions (NCCL's asynchronous error); a
// replayed one enqueues nothing through the reducer, so it asks after the launch, and a failure ends the job
// there rather than at a later wait for a collective that will not finish.
TEST(AllReduceStep, AReplayedStepEndsTheJobOnAPeersFailure) {
  GraphedStep graphed([](FakeStream& stream) { return std::make_unique<FakeRecorder>(stream); });
  for (int k = 0; k < 3; ++k) graphed.run();
  EXPECT_EQ(graphed.step.last_run(), StepGraphs::Run::kReplayed);
  graphed.reducer.failure =
      "NCCL asynchronous error: remote process exited (a peer failed or the network went down)";
  const ThrowFatalErrors throw_instead_of_abort;
  try {
    graphed.run();
    ADD_FAILURE() << "a replayed step went on past a peer's failure";
  } catch (const FatalError& e) {
    EXPECT_NE(std::string(e.what()).find("remote process exited"), std::string::npos) << e.what();
  }
}

// On the way out of a failed run the step's graphs go before NCCL's communicator is aborted (its abort waits
// until no graph holds its collectives): release_graphs() destroys them, and the recorder with them.
TEST(AllReduceStep, ReleasingTheGraphsDestroysThem) {
  int destroyed = 0;
  GraphedStep graphed([&](FakeStream& stream) { return std::make_unique<FakeRecorder>(stream, &destroyed); });
  for (int k = 0; k < 2; ++k) graphed.run();
  EXPECT_EQ(graphed.step.last_run(), StepGraphs::Run::kCaptured);
  EXPECT_EQ(destroyed, 0);
  graphed.step.release_graphs();
  EXPECT_EQ(destroyed, 1);
  graphed.step.release_graphs();
  EXPECT_EQ(destroyed, 1);
}

// A CPU replica, or an exchange through the host, keeps the step eager, and says so on GPU ranks only.
TEST(AllReduceStep, SaysWhyAGpuStepStaysEager) {
  const models::ModelShape shape{30, 4, 3, 1};
  FakeStream stream;
  auto cpu = models::make_cpu_replica(shape);
  FakeStreamReducer reducer(stream);
  FakeSplitOptimizer optimizer(stream);
  AllReduceStep on_cpu(*cpu, reducer, optimizer, false, 0, false, true, false, /*cuda_graphs=*/true);
  EXPECT_EQ(on_cpu.graph_note(), "");
  EXPECT_THROW(on_cpu.use_graph_recorder(std::make_unique<FakeRecorder>(stream)), std::logic_error);

  FakeGpuReplica gpu(models::make_cpu_replica(shape), stream);
  auto host_optimizer = optim::make_optimizer(optim::OptimizerSettings{}, gpu.layout().total_size());
  AllReduceStep host_update(gpu, reducer, *host_optimizer, false, 0, false, true, false, true);
  EXPECT_EQ(host_update.graph_note(), "eager step (the optimizer runs on the host)");
  AllReduceStep fp16(gpu, reducer, optimizer, false, 0, false, true, /*skip_nonfinite=*/true, true);
  EXPECT_EQ(fp16.graph_note(), "eager step (fp16's skipped steps are decided on the host)");
}

}  // namespace
}  // namespace ddp::engine

// The GPU self-check's comparisons, run here on replicas that live on the CPU: the CPU replica itself must
// pass, and a replica with one of the faults the check exists for (gates in the wrong order, a perturbed
// output, a parameter mapping that loses a float) must fail, naming what differs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/average_check.h"
#include "engine/self_check.h"
#include "models/param_layout.h"
#include "models/replica.h"
#include "tests/forwarding_replica.h"
#include "tests/scaling_replica.h"
#include "tests/step_graph_fakes.h"

namespace ddp::engine {
namespace {

// The CPU replica with a fault injected after each step or prediction.
class FaultyReplica final : public ddp::testing::ForwardingReplica {
 public:
  explicit FaultyReplica(const models::ModelShape& shape)
      : ForwardingReplica(models::make_cpu_replica(shape)) {}

  std::function<void(const models::ParamLayout&, std::span<float>)> after_step;  // on the gradients
  std::function<void(std::span<float>)> after_predict;                           // on the probabilities
  std::string mapping_problem;
  // Where not 0, the faults act on batches of this many rows only: a kernel wrong at one batch size alone.
  int faulty_batch = 0;
  bool faulty(const BatchView& batch) const { return faulty_batch == 0 || batch.batch == faulty_batch; }

  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    inner().train_step(batch, on_ready);
    if (after_step && faulty(batch)) after_step(layout(), inner().grads());
  }
  void predict(const BatchView& batch, std::span<float> probabilities) override {
    inner().predict(batch, probabilities);
    if (after_predict && faulty(batch)) after_predict(probabilities);
  }
  std::string check_parameter_mapping() override { return mapping_problem; }
};

const models::ModelShape kShape{50, 8, 8, 2};
const std::vector<std::pair<int, int>> kShapes{{8, 12}, {3, 12}};

SelfCheckReport check(models::Replica& replica) {
  optim::OptimizerSettings adam;
  adam.learning_rate = 0.01;
  return check_gpu_replica(replica, 0, kShapes, adam, 5);
}

TEST(SelfCheck, TheCpuReplicaPasses) {
  auto replica = models::make_cpu_replica(kShape);
  const SelfCheckReport report = check(*replica);
  EXPECT_TRUE(report.ok) << report.failure;
  EXPECT_EQ(report.passed.size(), 4u);
  EXPECT_NE(report.summary().find("passed in"), std::string::npos) << report.summary();
  EXPECT_NE(report.summary().find("CPU's on 4x12"), std::string::npos) << report.summary();
  EXPECT_NE(report.summary().find("8x12, 3x12 = their rows in small batches"), std::string::npos)
      << report.summary();
}

// fp16: a step of the check that overflows is taken again at half the scale, as training would take it; the
// scale that fits stays for training, but the check's overflowing steps are no skipped training steps.
TEST(SelfCheck, ItsOverflowingStepsLowerTheLossScaleButSkipNoTrainingStep) {
  ddp::testing::ReplicaThatScalesItsLoss replica(models::make_cpu_replica(kShape), /*fits=*/1024.0f);
  const SelfCheckReport report = check(replica);
  EXPECT_TRUE(report.ok) << report.failure;
  ASSERT_TRUE(replica.loss_scaling().has_value());
  EXPECT_EQ(replica.loss_scaling()->scale, 1024.0f);
  EXPECT_EQ(replica.loss_scaling()->skipped, 0);
}

// The CPU references (float and float64, slow at large hidden sizes) run on the same small slice whatever
// the run's batch size and sequence length: their work is counted, not timed.
TEST(SelfCheck, TheCpuWorkDoesNotGrowWithTheRunsShapes) {
  const auto reference_batches = [](const std::vector<std::pair<int, int>>& shapes) {
    auto replica = models::make_cpu_replica(kShape);
    const SelfCheckReport report = check_gpu_replica(*replica, 0, shapes, optim::OptimizerSettings{}, 5);
    EXPECT_TRUE(report.ok) << report.failure;
    return report.reference_batches;
  };
  const std::vector<std::pair<int, int>> imdb = reference_batches({{32, 80}, {7, 80}});
  const std::vector<std::pair<int, int>> large = reference_batches({{1024, 400}, {1000, 400}, {3, 400}});
  ASSERT_FALSE(imdb.empty());
  EXPECT_EQ(imdb, large);
  for (const auto& [rows, steps] : large) {
    EXPECT_LE(rows, kSliceRows);
    EXPECT_LE(steps, kSliceSteps);
  }
  // Shorter runs than the slice's steps take their own length.
  for (const auto& [rows, steps] : reference_batches({{8, 12}})) EXPECT_EQ(steps, 12);
}

// The tolerances follow the precision's unit roundoff: unchanged at fp32, 2^13 times the CPU's error at tf32
// with floors of 16 units of 2^-11 (bf16: 2^16, 16 units of 2^-8), and never a quarter of the values' size,
// which a wrong result would pass.
TEST(SelfCheck, TheBoundsFollowThePrecision) {
  const PrecisionBounds fp32 = precision_bounds(models::Precision::kFp32);
  EXPECT_EQ(fp32.error_scale, 1.0);
  EXPECT_EQ(fp32.relative_floor, kRelativeFloor);
  EXPECT_EQ(fp32.consistency, kConsistencyTolerance);
  EXPECT_DOUBLE_EQ(reference_bound(fp32, 1e-6, 1.0), 1e-4);   // the floor
  EXPECT_DOUBLE_EQ(reference_bound(fp32, 1e-4, 2.0), 16e-4);  // 16 x the CPU's error
  const PrecisionBounds tf32 = precision_bounds(models::Precision::kTf32);
  EXPECT_EQ(tf32.error_scale, 8192.0);
  EXPECT_DOUBLE_EQ(tf32.relative_floor, 16.0 / 2048);
  EXPECT_DOUBLE_EQ(tf32.consistency, 16.0 / 2048);
  EXPECT_DOUBLE_EQ(reference_bound(tf32, 1e-8, 1.0), 16.0 / 2048);                // the floor
  EXPECT_DOUBLE_EQ(reference_bound(tf32, 1e-6, 1.0), 16 * 8192 * 1e-6);           // the CPU's error, scaled
  EXPECT_DOUBLE_EQ(reference_bound(tf32, 1e-4, 3.0), kLargestRelativeError * 3);  // the ceiling
  const PrecisionBounds bf16 = precision_bounds(models::Precision::kBf16);
  EXPECT_EQ(bf16.error_scale, 65536.0);
  EXPECT_DOUBLE_EQ(bf16.relative_floor, 16.0 / 256);
  EXPECT_DOUBLE_EQ(bf16.consistency, 16.0 / 256);
}

// At tf32's looser bounds the CPU replica passes, and a wrong result still fails: two rows mixed up, or a
// layer's gradient doubled.
TEST(SelfCheck, AWrongResultFailsAtTf32) {
  models::ModelOptions tf32;
  tf32.precision = models::Precision::kTf32;
  auto replica = models::make_cpu_replica(kShape);
  const SelfCheckReport passes = check_gpu_replica(*replica, 0, kShapes, optim::OptimizerSettings{}, 5, tf32);
  EXPECT_TRUE(passes.ok) << passes.failure;
  EXPECT_NE(passes.summary().find("CPU's on 4x12 within tf32's bounds"), std::string::npos)
      << passes.summary();
  {
    FaultyReplica faulty(kShape);
    faulty.after_predict = [](std::span<float> p) { std::swap(p[0], p[1]); };
    const SelfCheckReport report = check_gpu_replica(faulty, 0, kShapes, optim::OptimizerSettings{}, 5, tf32);
    ASSERT_FALSE(report.ok);
    // Two near-equal rows swapped hide below tf32's floor in the slice; the run's shapes against their
    // halves, measured from the batch's mean, see them.
    EXPECT_NE(report.failure.find("probabilities of rows 4..7 (batch 8 x 12"), std::string::npos)
        << report.failure;
  }
  {
    FaultyReplica faulty(kShape);
    faulty.after_step = [](const models::ParamLayout& layout, std::span<float> grads) {
      const models::ParamTensor& w_hh = layout.tensor("lstm.l1.w_hh");
      for (std::size_t i = w_hh.offset; i < w_hh.offset + w_hh.size(); ++i) grads[i] *= 2;
    };
    const SelfCheckReport report = check_gpu_replica(faulty, 0, kShapes, optim::OptimizerSettings{}, 5, tf32);
    ASSERT_FALSE(report.ok);
    EXPECT_NE(report.failure.find("gradient of lstm.l1.w_hh (batch 4 x 12)"), std::string::npos)
        << report.failure;
  }
}

// What the slice cannot see, a kernel wrong only at the run's own large batch, shows against the batch's rows
// run alone: in the outputs, and in the gradients.
TEST(SelfCheck, AFaultAtTheRunsBatchSizeAloneFails) {
  const std::vector<std::pair<int, int>> shapes{{64, 30}, {17, 30}};
  {
    FaultyReplica replica(kShape);
    replica.faulty_batch = 64;
    replica.after_predict = [](std::span<float> p) { std::swap(p[0], p[1]); };  // two rows mixed up
    const SelfCheckReport report = check_gpu_replica(replica, 0, shapes, optim::OptimizerSettings{}, 5);
    ASSERT_FALSE(report.ok);
    EXPECT_NE(report.failure.find("probabilities of rows 0..31 (batch 64 x 30, against those rows alone)"),
              std::string::npos)
        << report.failure;
  }
  {
    FaultyReplica replica(kShape);
    replica.faulty_batch = 17;  // the evaluation batch's shape, forward only
    replica.after_predict = [](std::span<float> p) { p.back() *= 0.99f; };
    const SelfCheckReport report = check_gpu_replica(replica, 0, shapes, optim::OptimizerSettings{}, 5);
    ASSERT_FALSE(report.ok);
    EXPECT_NE(report.failure.find("probabilities of rows 8..16 (batch 17 x 30"), std::string::npos)
        << report.failure;
  }
  {
    FaultyReplica replica(kShape);
    replica.faulty_batch = 64;
    // A gradient that misses a percent, as one dropped row of a hundred would.
    replica.after_step = [](const models::ParamLayout& layout, std::span<float> grads) {
      const models::ParamTensor& w_ih = layout.tensor("lstm.l0.w_ih");
      for (std::size_t i = w_ih.offset; i < w_ih.offset + w_ih.size(); ++i) grads[i] *= 0.99f;
    };
    const SelfCheckReport report = check_gpu_replica(replica, 0, shapes, optim::OptimizerSettings{}, 5);
    ASSERT_FALSE(report.ok);
    EXPECT_NE(report.failure.find("gradient of lstm.l0.w_ih (batch 64 x 30, against its two halves"),
              std::string::npos)
        << report.failure;
  }
  {
    // Rounding of another summation order at the large batch passes.
    FaultyReplica replica(kShape);
    replica.faulty_batch = 64;
    replica.after_step = [](const models::ParamLayout&, std::span<float> grads) {
      for (float& g : grads) g *= 1.0f + 3e-7f;
    };
    replica.after_predict = [](std::span<float> p) {
      for (float& v : p) v *= 1.0f + 3e-7f;
    };
    const SelfCheckReport report = check_gpu_replica(replica, 0, shapes, optim::OptimizerSettings{}, 5);
    EXPECT_TRUE(report.ok) << report.failure;
  }
}

// Batches of every size down to one row, and batches not a multiple of the small one, are checked.
TEST(SelfCheck, EveryBatchSizePasses) {
  for (const int batch : {1, 2, 3, 4, 5, 7, 9, 33}) {
    auto replica = models::make_cpu_replica(kShape);
    const std::vector<std::pair<int, int>> shapes{{batch, 10}};
    const SelfCheckReport report = check_gpu_replica(*replica, 0, shapes, optim::OptimizerSettings{}, 5);
    EXPECT_TRUE(report.ok) << "batch " << batch << ": " << report.failure;
  }
}

// Each part of the check tells the caller that the work proceeds (the trainer beats its watchdog with it).
TEST(SelfCheck, ProgressIsToldAfterEachPart) {
  auto replica = models::make_cpu_replica(kShape);
  int told = 0;
  const SelfCheckReport report =
      check_gpu_replica(*replica, 0, kShapes, optim::OptimizerSettings{}, 5, {}, [&told] { ++told; });
  EXPECT_TRUE(report.ok) << report.failure;
  EXPECT_EQ(told, 1 + static_cast<int>(kShapes.size()) + 2);  // slice, each shape, mapping, optimizer
}

// A masked bidirectional GRU passes when the check is told the replica's options (its CPU references then
// mask the padded rows of its batches as the replica does), and fails when it is not.
TEST(SelfCheck, TheReplicasOptionsReachItsReferences) {
  models::ModelShape shape = kShape;
  shape.cell = models::Cell::kGru;
  shape.bidirectional = true;
  shape.classes = 3;
  models::ModelOptions masked;
  masked.mask_padding = true;
  auto replica = models::make_cpu_replica(shape, models::CpuKernels::kBuiltin, masked);
  models::ModelOptions configured = masked;
  configured.dropout = 0.3;  // the references leave dropout out, as the GPU replica runs none
  optim::OptimizerSettings adam;
  const SelfCheckReport told = check_gpu_replica(*replica, 0, kShapes, adam, 5, configured);
  EXPECT_TRUE(told.ok) << told.failure;
  const SelfCheckReport not_told = check_gpu_replica(*replica, 0, kShapes, adam, 5);
  EXPECT_FALSE(not_told.ok);
}

// With train.clip_norm the optimizer comparison is the clipped step (a norm far below the gradient's, so the
// clipping acts), and the report says so.
TEST(SelfCheck, TheOptimizerStepIsTheClippedOneWithClipping) {
  auto replica = models::make_cpu_replica(kShape);
  optim::OptimizerSettings adam;
  adam.clip_norm = 1e-4;
  const SelfCheckReport report = check_gpu_replica(*replica, 0, kShapes, adam, 5);
  EXPECT_TRUE(report.ok) << report.failure;
  EXPECT_NE(report.summary().find("adam clipped step = host's bit for bit"), std::string::npos)
      << report.summary();
}

TEST(SelfCheck, FloatRoundingPasses) {
  FaultyReplica replica(kShape);
  // A few units in the last place, as another summation order gives.
  replica.after_step = [](const models::ParamLayout&, std::span<float> grads) {
    for (float& g : grads) g *= 1.0f + 3e-7f;
  };
  const SelfCheckReport report = check(replica);
  EXPECT_TRUE(report.ok) << report.failure;
}

TEST(SelfCheck, GatesInTheWrongOrderFail) {
  FaultyReplica replica(kShape);
  // The recurrent weights' gradient with gates i and f swapped: what a wrong weight map would give.
  replica.after_step = [](const models::ParamLayout& layout, std::span<float> grads) {
    const models::ParamTensor& w_hh = layout.tensor("lstm.l1.w_hh");
    const std::size_t gate = w_hh.size() / 4;
    std::swap_ranges(grads.begin() + static_cast<std::ptrdiff_t>(w_hh.offset),
                     grads.begin() + static_cast<std::ptrdiff_t>(w_hh.offset + gate),
                     grads.begin() + static_cast<std::ptrdiff_t>(w_hh.offset + gate));
  };
  const SelfCheckReport report = check(replica);
  ASSERT_FALSE(report.ok);
  EXPECT_NE(report.failure.find("gradient of lstm.l1.w_hh (batch 4 x 12)"), std::string::npos)
      << report.failure;
  EXPECT_NE(report.summary().find("FAILED: "), std::string::npos);
}

TEST(SelfCheck, AnOutputOffByAThousandthFails) {
  FaultyReplica replica(kShape);
  replica.after_predict = [](std::span<float> p) { p.back() += 1e-3f; };
  const SelfCheckReport report = check(replica);
  ASSERT_FALSE(report.ok);
  EXPECT_NE(report.failure.find("probabilities (batch 4 x 12)"), std::string::npos) << report.failure;
  EXPECT_NE(report.failure.find("largest at element 3"), std::string::npos) << report.failure;
}

TEST(SelfCheck, AMappingProblemFails) {
  FaultyReplica replica(kShape);
  replica.mapping_problem = "lstm.l0.b_hh[3] came back as 0 instead of 1";
  const SelfCheckReport report = check(replica);
  ASSERT_FALSE(report.ok);
  EXPECT_EQ(report.failure, "parameter mapping: lstm.l0.b_hh[3] came back as 0 instead of 1");
}

TEST(SelfCheck, ANonFiniteGradientFails) {
  FaultyReplica replica(kShape);
  replica.after_step = [](const models::ParamLayout& layout, std::span<float> grads) {
    grads[layout.tensor("dense.b").offset] = std::numeric_limits<float>::quiet_NaN();
  };
  const SelfCheckReport report = check(replica);
  ASSERT_FALSE(report.ok);
  EXPECT_NE(report.failure.find("gradient of dense.b"), std::string::npos) << report.failure;
}

}  // namespace
}  // namespace ddp::engine

namespace ddp::engine {
namespace {

// The shapes check-env and a default run check; the time is what the check adds to a GPU rank's start-up
// (its CPU side dominates), printed for the record and not judged here.
TEST(SelfCheck, TheCpuReplicaPassesAtTheImdbShapes) {
  auto replica = models::make_cpu_replica({20000, 128, 128, 1});
  const std::vector<std::pair<int, int>> shapes{{32, 80}, {7, 80}};
  const SelfCheckReport report = check_gpu_replica(*replica, 0, shapes, optim::OptimizerSettings{}, 7);
  EXPECT_TRUE(report.ok) << report.failure;
  std::printf("%s\n", report.summary().c_str());
}

// The trainer joins the replica's check and the communicator's: the first failure stands, both times count.
TEST(SelfCheck, ReportsAddUp) {
  SelfCheckReport report;
  report.passed = {"replica"};
  report.seconds = 0.25;
  SelfCheckReport failed;
  failed.ok = false;
  failed.failure = "nccl average: largest error 3";
  failed.seconds = 0.5;
  SelfCheckReport later;
  later.ok = false;
  later.failure = "a later failure";
  report.add(failed);
  report.add(later);
  EXPECT_FALSE(report.ok);
  EXPECT_EQ(report.failure, "nccl average: largest error 3");
  EXPECT_EQ(report.passed, std::vector<std::string>{"replica"});
  EXPECT_DOUBLE_EQ(report.seconds, 0.75);
  EXPECT_EQ(report.summary(), "FAILED: nccl average: largest error 3");
}

// The communicator check's bounds: fp32 exact up to the scaling's rounding, 16-bit wire types a few units of
// their last place, growing with the ranks whose partial sums a ring rounds.
TEST(SelfCheck, AverageTolerances) {
  EXPECT_DOUBLE_EQ(comm::average_tolerance("none", 2), comm::kAverageTolerance);
  EXPECT_DOUBLE_EQ(comm::average_tolerance("fp16", 2), comm::kFp16Tolerance);
  EXPECT_DOUBLE_EQ(comm::average_tolerance("bf16", 4), comm::kBf16Tolerance);
  EXPECT_GT(comm::average_tolerance("bf16", 64), comm::kBf16Tolerance);
  EXPECT_GT(comm::average_tolerance("none", 1024), comm::kAverageTolerance);
  EXPECT_LT(comm::average_tolerance("none", 1024), 1e-4);
  EXPECT_LT(comm::average_tolerance("fp16", 8), comm::average_tolerance("bf16", 8));
  EXPECT_THROW(comm::average_tolerance("int8", 2), std::invalid_argument);
}

// train.cuda_graph = auto: the training shape's step, captured once and replayed on two batches, must give
// each the eager step's gradients. A replica whose graph would read the batch where it was at the capture
// passes every eager check and fails this one, at the second batch; without a recorder (off) the check is
// not made.
TEST(SelfCheck, AStepReplayedFromAGraphMustEqualItsEagerStep) {
  testing::FakeStream stream;
  const GraphRecorderFactory recorder = [&stream](void*) {
    return std::make_unique<testing::FakeRecorder>(stream);
  };
  optim::OptimizerSettings adam;
  adam.learning_rate = 0.01;
  testing::FakeGpuReplica replica(models::make_cpu_replica(kShape), stream, models::DeviceKind::kCpu);
  replica.adds_draw = false;  // the CPU replica's gradients, which the slice compares with its references
  const SelfCheckReport report = check_gpu_replica(replica, 0, kShapes, adam, 5, {}, {}, recorder);
  EXPECT_TRUE(report.ok) << report.failure;
  EXPECT_NE(report.summary().find("a step replayed from a CUDA graph = its eager step"), std::string::npos)
      << report.summary();

  testing::FakeGpuReplica frozen(models::make_cpu_replica(kShape), stream, models::DeviceKind::kCpu);
  frozen.adds_draw = false;
  frozen.stages_batch = false;
  const SelfCheckReport fails = check_gpu_replica(frozen, 0, kShapes, adam, 5, {}, {}, recorder);
  EXPECT_FALSE(fails.ok);
  EXPECT_NE(fails.failure.find("replayed from a CUDA graph (batch 8 x 12, batch 2 of 2"), std::string::npos)
      << fails.failure;
  EXPECT_NE(fails.failure.find("train.cuda_graph = off"), std::string::npos) << fails.failure;
  EXPECT_TRUE(check_gpu_replica(frozen, 0, kShapes, adam, 5).ok) << "no recorder: no replay to check";
}

}  // namespace
}  // namespace ddp::engine

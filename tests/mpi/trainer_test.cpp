// The whole training loop under MPI: replicas identical at the end, metrics written, and a run stopped in the
// middle of an epoch and resumed ends with exactly the parameters of a run never interrupted.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/all_reduce_updater.h"
#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/device_preparation.h"
#include "engine/preemption.h"
#include "engine/topology.h"
#include "engine/trainer.h"
#include "engine/training_job.h"
#include "io/batch_source.h"
#include "io/dataset.h"
#include "io/dataset_writer.h"
#include "io/synthetic.h"
#include "models/onednn_lstm.h"
#include "models/packed_gemm.h"
#include "models/replica.h"
#include "tests/forwarding_replica.h"
#include "tests/mpi/mpi_test_util.h"
#include "tests/scaling_replica.h"

namespace ddp {
namespace {

using ddp::testing::SharedDir;
using ddp::testing::world_rank;
using ddp::testing::world_size;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The CPU replica with a random state of its own that the step keys do not determine, as cuDNN's dropout
// state: "rank R after N steps", N counting train_steps from the start or from the state it restored.
class ReplicaWithItsOwnRandomState final : public ddp::testing::ForwardingReplica {
 public:
  // `restored` gets what restore_rng_state was given.
  ReplicaWithItsOwnRandomState(std::unique_ptr<models::Replica> inner, int rank, std::string& restored)
      : ForwardingReplica(std::move(inner)), rank_(rank), restored_(restored) {}

  std::string rng_state() override { return state_text(rank_, steps_); }
  bool restore_rng_state(const std::string& saved) override {
    restored_ = saved;
    const std::string prefix = state_text(rank_, 0).substr(0, state_text(rank_, 0).find(" after ") + 7);
    if (saved.rfind(prefix, 0) != 0) return false;
    steps_ = std::stoll(saved.substr(prefix.size()));
    return true;
  }
  static std::string state_text(int rank, int64_t steps) {
    return "rank " + std::to_string(rank) + " after " + std::to_string(steps) + " steps";
  }

  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    ++steps_;
    inner().train_step(batch, on_ready);
  }

 private:
  int rank_;
  std::string& restored_;
  int64_t steps_ = 0;
};

// Overflows above 2^12: a run skips its first four steps (2^16 down to 2^12).
constexpr float kScaleThatFits = 4096.0f;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = std::make_unique<comm::HostGroup>(MPI_COMM_WORLD);
    reducer_ = comm::make_mpi_reducer(*comm_);
    data_path_ = dir_.file("data.h5");
    ddp::testing::write_synthetic_on_rank0(
        {.output = data_path_, .train = 600, .test = 130, .vocab = 300, .maxlen = 16, .seed = 5});
    data_ = io::inspect_dataset(data_path_);
    topology_ = engine::discover_topology(*comm_, "cpu");
  }

  // The all-reduce trainer (comm.backend = auto would pick the parameter server on CPU ranks: those runs are
  // tested in ps_trainer_test.cpp).
  // `extra` (--key value ..., or a lone --resume) adds or overrides keys.
  engine::TrainResult run(const std::string& run_dir, std::vector<std::string> extra) {
    const std::vector<std::pair<std::string, std::string>> defaults{
        {"--data.path", data_path_}, {"--checkpoint.dir", run_dir}, {"--model.embedding_dim", "8"},
        {"--model.hidden", "8"},     {"--train.batch_size", "10"},  {"--train.epochs", "2"},
        {"--log.progress", "lines"}, {"--comm.backend", "mpi"}};
    std::vector<std::string> args = extra;
    for (const auto& [key, value] : defaults) {
      if (std::find(extra.begin(), extra.end(), key) == extra.end()) args.insert(args.end(), {key, value});
    }
    const engine::Config config = engine::parse_config(args).config;
    const io::DatasetInfo data =
        io::inspect_dataset(args[std::find(args.begin(), args.end(), "--data.path") - args.begin() + 1]);
    engine::ProgressWatchdog watchdog(config.comm.timeout_s);
    return engine::train(config, topology_, data, *comm_, watchdog);
  }

  // The same all-reduce run through the epoch loop itself, on the replica `wrap` makes of the CPU one;
  // `skip_nonfinite` as for fp16 (the replica's verdict on each averaged gradient decides whether it
  // applies).
  template <typename Wrap>
  engine::TrainResult run_on(const std::string& run_dir, std::vector<std::string> args, Wrap&& wrap,
                             bool skip_nonfinite = false) {
    args.insert(args.end(), {"--data.path", data_path_, "--checkpoint.dir", run_dir, "--model.embedding_dim",
                             "8", "--model.hidden", "8", "--train.batch_size", "10", "--log.progress",
                             "lines", "--comm.backend", "mpi"});
    const engine::Config config = engine::parse_config(args).config;
    engine::ProgressWatchdog watchdog(config.comm.timeout_s);
    engine::StopAgreement stop_signal(*comm_);
    std::unique_ptr<models::Replica> replica =
        wrap(models::make_cpu_replica(engine::model_shape(config, data_.vocab_size, data_.num_classes)));
    auto updater =
        engine::make_all_reduce_updater(*replica, -1, *comm_, *reducer_, engine::optimizer_settings(config),
                                        /*sparse_exchange=*/false, /*delayed=*/false,
                                        /*gpu_job=*/false, skip_nonfinite);
    engine::TrainingRun run(config,
                            engine::TrainingRanks{*comm_, comm_->size(), topology_, watchdog, stop_signal},
                            data_, std::move(replica), std::move(updater), "test", {});
    return run.run();
  }

  // On ReplicaWithItsOwnRandomState; `restored` gets what its replica was given to restore.
  engine::TrainResult run_with_own_random_state(const std::string& run_dir, std::vector<std::string> args,
                                                std::string& restored) {
    restored.clear();
    return run_on(run_dir, std::move(args), [&](std::unique_ptr<models::Replica> cpu) {
      return std::make_unique<ReplicaWithItsOwnRandomState>(std::move(cpu), comm_->rank(), restored);
    });
  }

  // On ReplicaThatScalesItsLoss (overflowing above kScaleThatFits), this rank's starting at `initial_scale`.
  engine::TrainResult run_scaling_the_loss(const std::string& run_dir, std::vector<std::string> args,
                                           float initial_scale = models::LossScale::kInitial) {
    return run_on(
        run_dir, std::move(args),
        [&](std::unique_ptr<models::Replica> cpu) {
          return std::make_unique<ddp::testing::ReplicaThatScalesItsLoss>(std::move(cpu), kScaleThatFits,
                                                                          initial_scale);
        },
        /*skip_nonfinite=*/true);
  }

  bool identical_on_all_ranks(const std::vector<float>& params) {
    std::vector<float> reference = params;
    comm_->broadcast(reference, 0);
    int same = std::memcmp(reference.data(), params.data(), params.size() * sizeof(float)) == 0 ? 1 : 0;
    int all_same = 0;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return all_same == 1;
  }

  SharedDir dir_;
  std::unique_ptr<comm::HostGroup> comm_;
  std::unique_ptr<comm::GradientReducer> reducer_;  // over comm_
  std::string data_path_;
  io::DatasetInfo data_;
  engine::Topology topology_;
};

TEST_F(TrainerTest, ReplicasEndIdenticalAndMetricsAreWritten) {
  const engine::TrainResult result = run(dir_.file("run"), {});
  ASSERT_EQ(result.history.size(), 2u);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
  EXPECT_EQ(result.history[0].world_size, comm_->size());
  // data.validation = auto on a file without /val holds out the last 10% of /train.
  EXPECT_EQ(result.history[0].steps, 540 / comm_->size() / 10);
  EXPECT_GT(result.history[1].val_acc, 0.0);
  if (comm_->rank() == 0) {
    const std::vector<std::string> lines = read_lines(dir_.file("run/metrics.jsonl"));
    ASSERT_EQ(lines.size(), 3u);  // two epochs, then the test score
    for (const std::string& line : lines)
      EXPECT_EQ(nlohmann::json::parse(line)["run_id"], result.run_id) << line;
    EXPECT_TRUE(nlohmann::json::parse(lines[0]).contains("val_acc"));
    EXPECT_EQ(nlohmann::json::parse(lines[2])["event"], "test");
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/last.h5")));
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/best.h5")));
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/config.ini")));
    EXPECT_EQ(engine::read_checkpoint(dir_.file("run/last.h5")).params, result.params);
  }
}

// Every rank tries every rank's batch shapes, in one order: here rank r's test shard ends in a short batch of
// r rows (none on rank 0) and the last rank's validation shard in one of 3.
TEST_F(TrainerTest, EveryRankTriesTheUnionOfTheRanksBatchShapes) {
  const int rank = comm_->rank();
  const int size = comm_->size();
  const auto shapes = engine::every_ranks_batch_shapes(*comm_, 10, 16, rank == size - 1 ? 23 : 20, 10 + rank);
  std::set<int> short_batches{3};
  for (int r = 1; r < size; ++r) short_batches.insert(r);
  std::vector<std::pair<int, int>> expected{{10, 16}};
  for (const int rows : short_batches) expected.emplace_back(rows, 16);
  EXPECT_EQ(shapes, expected);
}

// The shards of a split differ by a sample: with size x batch + 1 test rows one rank alone ends its test
// shard with a short batch. The run starts, trains and scores the test split on every rank.
TEST_F(TrainerTest, AShortLastBatchOnOneRankOnly) {
  const std::string uneven = dir_.file("uneven.h5");
  ddp::testing::write_synthetic_on_rank0({.output = uneven,
                                          .train = 600,
                                          .test = 10 * static_cast<int64_t>(comm_->size()) + 1,
                                          .vocab = 300,
                                          .maxlen = 16,
                                          .seed = 7});
  const engine::TrainResult result =
      run(dir_.file("uneven"), {"--data.path", uneven, "--train.epochs", "1", "--data.validation", "test"});
  ASSERT_EQ(result.history.size(), 1u);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
}

TEST_F(TrainerTest, StoppedAndResumedEqualsUninterrupted) {
  const engine::TrainResult straight = run(dir_.file("straight"), {});
  const int64_t steps_per_epoch = straight.history[0].steps;
  // Stop in the middle of the second epoch, then resume to the end.
  const engine::TrainResult first =
      run(dir_.file("interrupted"), {"--train.stop_after_steps", std::to_string(steps_per_epoch + 3)});
  EXPECT_EQ(first.history.size(), 1u);
  const engine::TrainResult second = run(dir_.file("interrupted"), {"--resume"});
  ASSERT_EQ(second.history.size(), 1u);
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
  // The resumed epoch's training metrics include the steps before the stop.
  EXPECT_NEAR(second.history[0].loss, straight.history[1].loss, 1e-9);
  EXPECT_NEAR(second.history[0].val_loss, straight.history[1].val_loss, 1e-9);
}

// The delayed exchange (comm.overlap = delayed) applies its last gradient and forgets its last update (the
// weight prediction's) at each epoch's end: a run resumed from an epoch's checkpoint goes on as the
// uninterrupted run does, bit for bit; and the delay changed the result.
TEST_F(TrainerTest, TheDelayedExchangeResumedAfterAnEpochEqualsUninterrupted) {
  const std::vector<std::string> delayed{"--comm.backend", "mpi", "--comm.overlap", "delayed",
                                         "--train.epochs", "2"};
  const engine::TrainResult straight = run(dir_.file("straight"), delayed);
  ASSERT_EQ(straight.history.size(), 2u);
  std::vector<std::string> one_epoch = delayed;
  one_epoch.back() = "1";
  run(dir_.file("interrupted"), one_epoch);
  std::vector<std::string> resume = delayed;
  resume.push_back("--resume");
  const engine::TrainResult second = run(dir_.file("interrupted"), resume);
  ASSERT_EQ(second.history.size(), 1u);
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
  EXPECT_TRUE(identical_on_all_ranks(second.params));
  const engine::TrainResult undelayed =
      run(dir_.file("undelayed"), {"--comm.backend", "mpi", "--train.epochs", "2"});
  EXPECT_NE(undelayed.params, straight.params);
}

// A replica's own random state (cuDNN's dropout state) is in every checkpoint, by rank, and a resumed run
// hands each rank the state it saved, so that it goes on where it was.
TEST_F(TrainerTest, EachRanksReplicaRandomStateIsCheckpointedAndRestored) {
  std::string restored;
  const engine::TrainResult first =
      run_with_own_random_state(dir_.file("own"), {"--train.epochs", "1"}, restored);
  const int64_t steps = first.history.at(0).steps;
  EXPECT_EQ(restored, "") << "a fresh run restores nothing";
  if (world_rank() == 0) {
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("own/last.h5"));
    ASSERT_EQ(c.replica_rng_states.size(), static_cast<std::size_t>(world_size()));
    for (int r = 0; r < world_size(); ++r) {
      EXPECT_EQ(c.replica_rng_states[static_cast<std::size_t>(r)],
                ReplicaWithItsOwnRandomState::state_text(r, steps));
    }
  }
  run_with_own_random_state(dir_.file("own"), {"--train.epochs", "2", "--resume"}, restored);
  EXPECT_EQ(restored, ReplicaWithItsOwnRandomState::state_text(world_rank(), steps));
  if (world_rank() == 0) {
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("own/last.h5"));
    ASSERT_EQ(c.replica_rng_states.size(), static_cast<std::size_t>(world_size()));
    EXPECT_EQ(c.replica_rng_states.back(),
              ReplicaWithItsOwnRandomState::state_text(world_size() - 1, 2 * steps))
        << "the restored state went on";
    // As if another number of ranks had written it: one state more than this job has ranks.
    engine::CheckpointWriter writer(dir_.file("own/last.h5"), c.shape, c.params, c.optimizer_name,
                                    c.optimizer.iterations, c.progress, c.config_ini, c.run);
    for (const auto& [name, values] : c.optimizer.buffers) writer.add_optimizer_buffer(name, values);
    std::vector<std::string> states = c.replica_rng_states;
    states.push_back(ReplicaWithItsOwnRandomState::state_text(world_size(), 2 * steps));
    writer.add_replica_rng_states(states);
    writer.commit();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  run_with_own_random_state(dir_.file("own"), {"--train.epochs", "3", "--resume"}, restored);
  EXPECT_EQ(restored, "") << "a state saved by another number of ranks was handed out";
}

// fp16's loss scaling is in every checkpoint: a run stopped in the middle of an epoch and resumed goes on at
// the scale it had, with the steps it had skipped, and ends with the parameters of the uninterrupted run
// (resumed at the initial scale, it would skip the first steps again).
TEST_F(TrainerTest, TheLossScaleIsCheckpointedAndAResumedRunScalesAsTheUninterruptedOne) {
  constexpr int64_t kSkipped = 4;
  const engine::TrainResult straight = run_scaling_the_loss(dir_.file("straight"), {"--train.epochs", "2"});
  const int64_t steps_per_epoch = straight.history.at(0).steps;
  ASSERT_GT(steps_per_epoch, kSkipped);
  EXPECT_EQ(straight.history[0].loss_scale, kScaleThatFits);
  EXPECT_EQ(straight.history[0].skipped_steps, kSkipped);
  run_scaling_the_loss(dir_.file("interrupted"), {"--train.epochs", "2", "--train.stop_after_steps",
                                                  std::to_string(steps_per_epoch + 3)});
  if (world_rank() == 0) {
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("interrupted/last.h5"));
    ASSERT_TRUE(c.progress.loss_scaling.has_value());
    EXPECT_EQ(c.progress.loss_scaling->scale, kScaleThatFits);
    EXPECT_EQ(c.progress.loss_scaling->clean_steps, steps_per_epoch + 3 - kSkipped);
    EXPECT_EQ(c.progress.loss_scaling->skipped, kSkipped);
  }
  const engine::TrainResult second =
      run_scaling_the_loss(dir_.file("interrupted"), {"--train.epochs", "2", "--resume"});
  ASSERT_EQ(second.history.size(), 1u);
  EXPECT_EQ(second.history[0].skipped_steps, kSkipped) << "the resumed run skipped steps again";
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
  EXPECT_TRUE(identical_on_all_ranks(second.params));
}

// The ranks that scale start from one scale, the smallest (the start-up self-check may have lowered one GPU's
// and not another's): here the last rank's replica starts at kScaleThatFits and the others above it, so that
// without the agreement the others would skip steps the last one applies, and the replicas would part.
TEST_F(TrainerTest, TheRanksThatScaleTheLossStartFromTheSmallestScale) {
  const float initial = world_rank() == world_size() - 1 ? kScaleThatFits : models::LossScale::kInitial;
  const engine::TrainResult result =
      run_scaling_the_loss(dir_.file("agreed"), {"--train.epochs", "1"}, initial);
  ASSERT_EQ(result.history.size(), 1u);
  EXPECT_EQ(result.history[0].loss_scale, kScaleThatFits);
  EXPECT_EQ(result.history[0].skipped_steps, 0);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
}

// The same with every control that has state over the run: a cosine schedule after a warm-up, clipping,
// weight decay, and dropout (masks from the step), on a masked bidirectional GRU of three layers.
TEST_F(TrainerTest, StoppedAndResumedEqualsUninterruptedWithScheduleClippingAndDropout) {
  const std::vector<std::string> controls{
      "--train.lr_schedule",       "cosine", "--train.warmup_steps",  "7",   "--train.clip_norm",     "0.05",
      "--train.weight_decay",      "0.01",   "--model.cell",          "gru", "--model.bidirectional", "true",
      "--model.mask_padding",      "true",   "--model.layers",        "3",   "--model.dropout",       "0.2",
      "--model.embedding_dropout", "0.1",    "--train.learning_rate", "0.01"};
  const engine::TrainResult straight = run(dir_.file("straight"), controls);
  const int64_t steps_per_epoch = straight.history[0].steps;
  std::vector<std::string> stop = controls;
  stop.insert(stop.end(), {"--train.stop_after_steps", std::to_string(steps_per_epoch + 3)});
  run(dir_.file("interrupted"), stop);
  std::vector<std::string> resume = controls;
  resume.push_back("--resume");
  const engine::TrainResult second = run(dir_.file("interrupted"), resume);
  ASSERT_EQ(second.history.size(), 1u);
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
  EXPECT_TRUE(identical_on_all_ranks(second.params));
  // Not a run of the defaults: the controls changed the result.
  const engine::TrainResult plain =
      run(dir_.file("plain"), {"--model.cell", "gru", "--model.bidirectional", "true", "--model.mask_padding",
                               "true", "--model.layers", "3", "--train.learning_rate", "0.01"});
  EXPECT_NE(plain.params, straight.params);
}

// A learning rate so small that SGD leaves every parameter as it was: val_loss never goes down, so with
// patience 2 the run stops after epoch 3 (best: epoch 1) on every rank, and still scores best.h5 on test.
TEST_F(TrainerTest, EarlyStoppingEndsEveryRankAfterThePatience) {
  const engine::TrainResult result =
      run(dir_.file("early"), {"--train.optimizer", "sgd", "--train.learning_rate", "1e-30", "--train.epochs",
                               "8", "--train.early_stopping_patience", "2"});
  EXPECT_EQ(result.history.size(), 3u);
  if (world_rank() == 0) {
    const engine::Checkpoint last = engine::read_checkpoint(dir_.file("early/last.h5"));
    EXPECT_EQ(last.progress.epoch, 3);
    EXPECT_EQ(last.progress.best_epoch, 1);
    const std::vector<std::string> lines = read_lines(dir_.file("early/metrics.jsonl"));
    ASSERT_FALSE(lines.empty());
    EXPECT_NE(lines.back().find("\"event\":\"test\""), std::string::npos) << lines.back();
  }

  // Stopped while scoring its test split (its test line not yet written): resuming trains nothing and
  // scores it; resuming once more scores nothing again.
  const auto test_lines = [&] {
    int count = 0;
    for (const std::string& line : read_lines(dir_.file("early/metrics.jsonl")))
      count += line.find("\"event\":\"test\"") != std::string::npos ? 1 : 0;
    return count;
  };
  if (world_rank() == 0) {
    std::vector<std::string> lines = read_lines(dir_.file("early/metrics.jsonl"));
    lines.pop_back();
    std::ofstream out(dir_.file("early/metrics.jsonl"), std::ios::trunc);
    for (const std::string& line : lines) out << line << "\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<std::string> resumed_args{
      "--train.optimizer", "sgd", "--train.learning_rate",           "1e-30",
      "--train.epochs",    "8",   "--train.early_stopping_patience", "2",
      "--resume",          "last"};
  EXPECT_TRUE(run(dir_.file("early"), resumed_args).history.empty());
  if (world_rank() == 0) {
    EXPECT_EQ(test_lines(), 1);
  }
  EXPECT_TRUE(run(dir_.file("early"), resumed_args).history.empty());
  if (world_rank() == 0) {
    EXPECT_EQ(test_lines(), 1);
  }
}

// A checkpoint is the canonical layout whichever LSTM kernels wrote it: a run stopped under oneDNN's
// primitives resumes under the builtin kernels and the other way round, one stopped under our cells over
// oneDNN's sgemm resumes on the primitives, and one on the packed tiles over it, each ending near the
// uninterrupted run (not bitwise: they sum in other orders).
TEST_F(TrainerTest, CheckpointsMoveBetweenCpuKernels) {
  if (const std::string why = models::onednn_missing(); !why.empty()) GTEST_SKIP() << why;
  const engine::TrainResult straight = run(dir_.file("straight"), {"--model.cpu_kernels", "onednn"});
  const int64_t steps_per_epoch = straight.history[0].steps;
  for (const auto& [first, then] : {std::pair{"onednn", "builtin"}, std::pair{"builtin", "onednn"},
                                    std::pair{"onednn_gemm", "onednn"}, std::pair{"packed", "onednn_gemm"}}) {
    if (std::string(first) == "packed" && !models::packed_gemm_missing().empty()) continue;
    const std::string dir = dir_.file(std::string(first) + "-then-" + then);
    run(dir, {"--model.cpu_kernels", first, "--train.stop_after_steps", std::to_string(steps_per_epoch + 3)});
    const engine::TrainResult resumed = run(dir, {"--model.cpu_kernels", then, "--resume"});
    ASSERT_EQ(resumed.history.size(), 1u) << first << " then " << then;
    ASSERT_EQ(resumed.params.size(), straight.params.size());
    double worst = 0;
    for (std::size_t i = 0; i < straight.params.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(resumed.params[i]) - straight.params[i]));
    EXPECT_LT(worst, 1e-3) << first << " then " << then;
    EXPECT_TRUE(identical_on_all_ranks(resumed.params));
  }
}

TEST_F(TrainerTest, ResumeWithoutCheckpointIsAUserErrorOnEveryRank) {
  EXPECT_THROW(run(dir_.file("empty"), {"--resume"}), UserError);
}

// data.validation_split: epochs judged on the held-out rows, best.h5 chosen on them, and the test split
// scored once at the end, on best.h5's model.
TEST_F(TrainerTest, ValidationSplitChoosesBestOnValAndScoresTestOnce) {
  const engine::TrainResult result =
      run(dir_.file("val"), {"--data.validation", "split", "--data.validation_split", "0.2", "--train.epochs",
                             "3", "--train.learning_rate", "0.02"});
  ASSERT_EQ(result.history.size(), 3u);
  EXPECT_EQ(result.history[0].steps, 480 / comm_->size() / 10);
  if (comm_->rank() != 0) return;
  int best_epoch = 1;
  for (int e = 1; e <= 3; ++e) {
    EXPECT_EQ(result.history[e - 1].held_out, "val");
    if (result.history[e - 1].val_loss < result.history[best_epoch - 1].val_loss) best_epoch = e;
  }
  const engine::Checkpoint best = engine::read_checkpoint(dir_.file("val/best.h5"));
  EXPECT_EQ(best.progress.epoch, best_epoch);

  const std::vector<std::string> lines = read_lines(dir_.file("val/metrics.jsonl"));
  ASSERT_EQ(lines.size(), 4u);
  const nlohmann::json test_line = nlohmann::json::parse(lines.back());
  ASSERT_EQ(test_line["event"], "test") << test_line;
  const double test_loss = test_line["test_loss"].get<double>();
  // The same score from best.h5 on every /test row, computed here apart from the trainer.
  std::unique_ptr<models::Replica> replica = models::make_cpu_replica(best.shape);
  replica->copy_params_from_host(best.params);
  io::BatchReaderOptions options;
  options.path = data_path_;
  options.split = "test";
  options.shard = {0, data_.test_size};
  options.batch_size = 32;
  options.shuffle = false;
  options.drop_last = false;
  const std::unique_ptr<io::BatchSource> source = io::make_host_batch_source(options);
  while (const std::optional<BatchView> batch = source->next()) {
    replica->evaluate(*batch);
  }
  const models::BatchStats stats = replica->take_stats();
  ASSERT_EQ(stats.count, data_.test_size);
  EXPECT_NEAR(test_loss, stats.loss_sum / static_cast<double>(stats.count), 1e-5);
  // The held-out rows are not the test rows: their numbers differ.
  EXPECT_NE(result.history[best_epoch - 1].val_loss, test_loss);
}

TEST_F(TrainerTest, ANewRunRefusesAnotherRunsDirectoryUnlessToldToOverwrite) {
  const engine::TrainResult first = run(dir_.file("used"), {"--train.epochs", "1"});
  try {
    run(dir_.file("used"), {"--train.epochs", "1"});
    FAIL() << "a second run wrote over the first";
  } catch (const UserError& e) {
    for (const char* part : {"holds another run", "last.h5", "--resume", "--checkpoint.overwrite"}) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << part << " in " << e.what();
    }
  }
  if (comm_->rank() == 0) {
    EXPECT_EQ(read_lines(dir_.file("used/metrics.jsonl")).size(), 2u);
  }
  const engine::TrainResult second =
      run(dir_.file("used"), {"--train.epochs", "1", "--checkpoint.overwrite", "true"});
  if (comm_->rank() == 0) {
    EXPECT_NE(second.run_id, first.run_id);
    const std::vector<std::string> lines = read_lines(dir_.file("used/metrics.jsonl"));
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[0].find(second.run_id), std::string::npos);
  }
}

TEST_F(TrainerTest, ResumeRefusesOtherDataAndSaysWhenTheRunIsFinished) {
  run(dir_.file("done"), {"--train.epochs", "1"});
  // Resuming the finished run trains nothing and writes nothing.
  const engine::TrainResult again = run(dir_.file("done"), {"--train.epochs", "1", "--resume", "auto"});
  EXPECT_TRUE(again.history.empty());
  if (comm_->rank() == 0) {
    EXPECT_EQ(read_lines(dir_.file("done/metrics.jsonl")).size(), 2u);
  }

  // The same shapes, other rows.
  const std::string other = dir_.file("other.h5");
  ddp::testing::write_synthetic_on_rank0(
      {.output = other, .train = 600, .test = 130, .vocab = 300, .maxlen = 16, .seed = 6});
  auto run_on_other = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--data.path", other, "--resume", "auto"});
    return run(dir_.file("done"), extra);
  };
  try {
    run_on_other({});
    FAIL() << "resumed on other data without a word";
  } catch (const UserError& e) {
    for (const char* part : {"was trained on", "other.h5", "checkpoint.allow_data_change"}) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << part << " in " << e.what();
    }
  }
  const engine::TrainResult tuned = run_on_other({"--checkpoint.allow_data_change", "true"});
  EXPECT_EQ(tuned.history.size(), 1u);  // epoch 2 of 2, on the other data
}

// A file in label order (all 1s, then all 0s): the start log names the shards whose classes differ.
TEST_F(TrainerTest, ShardsOfAFileInLabelOrderAreNamed) {
  const std::string sorted = dir_.file("sorted.h5");
  if (comm_->rank() == 0) {
    constexpr int64_t kRows = 240;
    constexpr int kMaxlen = 16;
    io::DatasetWriter writer(sorted, 300, kMaxlen, kRows, 40);
    std::vector<int32_t> tokens(kRows * kMaxlen, 5);
    std::vector<uint8_t> labels(kRows, 0);
    std::fill(labels.begin(), labels.begin() + kRows / 2, uint8_t{1});
    writer.write_rows("train", 0, tokens, labels);
    writer.write_rows("test", 0, std::span(tokens).first(40 * kMaxlen), std::span(labels).first(40));
    writer.commit();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ::testing::internal::CaptureStdout();
  run(dir_.file("sorted-run"), {"--data.path", sorted, "--train.epochs", "1", "--data.validation", "test"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  if (comm_->rank() != 0) return;
  EXPECT_NE(out.find("classes of the training rows: 50.0% 0, 50.0% 1"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0's shard: 0.0% 0, 100.0% 1"), std::string::npos) << out;
  EXPECT_NE(out.find("rank " + std::to_string(comm_->size() - 1) + "'s shard: 100.0% 0, 0.0% 1"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("warning: no training row"), std::string::npos) << out;
}

// Training rows of one class of three (a class folder emptied, a filter that kept one label): the start log
// shows every class of the model and warns of those no row teaches.
TEST_F(TrainerTest, ClassesWithoutTrainingRowsAreWarnedOf) {
  const std::string one_class = dir_.file("one-class.h5");
  if (comm_->rank() == 0) {
    constexpr int64_t kRows = 240;
    constexpr int kMaxlen = 16;
    io::DatasetWriter writer(one_class, 300, kMaxlen, kRows, 40);
    writer.write_classes(3, {});
    std::vector<int32_t> tokens(kRows * kMaxlen, 5);
    std::vector<uint8_t> labels(kRows, 1);
    writer.write_rows("train", 0, tokens, labels);
    labels[0] = 2;
    writer.write_rows("test", 0, std::span(tokens).first(40 * kMaxlen), std::span(labels).first(40));
    writer.commit();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ::testing::internal::CaptureStdout();
  run(dir_.file("one-class-run"),
      {"--data.path", one_class, "--train.epochs", "1", "--data.validation", "test"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  if (comm_->rank() != 0) return;
  EXPECT_NE(out.find("classes of the training rows: 0.0% 0, 100.0% 1, 0.0% 2"), std::string::npos) << out;
  EXPECT_NE(
      out.find("warning: no training row has class 0, 2 (of the data's 3 classes): the model cannot learn "
               "to predict them"),
      std::string::npos)
      << out;
}

}  // namespace
}  // namespace ddp

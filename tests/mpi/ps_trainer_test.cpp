// The trainer with the parameter server (comm.backend = ps), under mpirun with N = 2, 3 or 4 ranks: K servers
// (1, or 2 with 4 ranks) and W = N - K workers. Sync mode against the all-reduce trainer on W ranks (a
// sub-communicator of the first W ranks, so both shard the data over W), checkpoints in the common format,
// resume, async mode with a straggler, and the errors every rank must agree on.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/topology.h"
#include "engine/training_job.h"
#include "io/dataset.h"
#include "io/synthetic.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

using ddp::testing::SharedDir;
using ddp::testing::world_rank;
using ddp::testing::world_size;

// Largest |a - b| / max(1, |b|).
double max_relative_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::max(worst, d / std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  }
  return a.size() == b.size() ? worst : 1e30;
}

// Async updates land in an order the timing picks, so one epoch's held-out score may dip (a last epoch fell
// to 0.89 after 0.97 once, another to 0.915 after 0.96): converged means the loss fell and some epoch scored
// well above chance.
void expect_async_converged(const std::vector<engine::EpochMetrics>& history) {
  ASSERT_GE(history.size(), 2u);
  double best_val_acc = 0;
  for (const auto& epoch : history) best_val_acc = std::max(best_val_acc, epoch.val_acc);
  EXPECT_GT(best_val_acc, 0.9) << "chance is 0.5";
  EXPECT_LT(history.back().loss, 0.5 * history.front().loss);
}

class PsTrainerTest : public ::testing::Test {
 protected:
  // 2 servers with 4 ranks (two shards), else 1; the workers are the first W ranks.
  static int servers() { return world_size() >= 4 ? 2 : 1; }
  static int workers() { return world_size() - servers(); }

  void SetUp() override {
    ASSERT_GE(world_size(), 2) << "the parameter server needs 2 ranks or more";
    data_path_ = dir_.file("data.h5");
    ddp::testing::write_synthetic_on_rank0(
        {.output = data_path_, .train = 600, .test = 130, .vocab = 300, .maxlen = 16, .seed = 5});
    data_ = io::inspect_dataset(data_path_);
    comm::HostGroup world(MPI_COMM_WORLD);
    topology_ = engine::discover_topology(world, "cpu");
    // The first W ranks, for the all-reduce reference over the same W data shards.
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < workers() ? 0 : MPI_UNDEFINED, world_rank(),
                   &first_workers_);
  }

  void TearDown() override {
    if (first_workers_ != MPI_COMM_NULL) MPI_Comm_free(&first_workers_);
  }

  // A small model on the small dataset; `extra` (--key value ..., or a lone --resume) adds or overrides keys.
  engine::TrainResult run(const std::string& run_dir, std::vector<std::string> extra, MPI_Comm comm,
                          const std::string& data_path = "") {
    const std::vector<std::pair<std::string, std::string>> defaults{
        {"--data.path", data_path.empty() ? data_path_ : data_path},
        {"--checkpoint.dir", run_dir},
        {"--model.embedding_dim", "8"},
        {"--model.hidden", "8"},
        {"--train.batch_size", "10"},
        {"--train.epochs", "2"},
        {"--log.progress", "lines"},
        // Epochs judged on /test, so every step count below is a share of the whole /train.
        {"--data.validation", "test"},
        {"--comm.ps_servers", std::to_string(servers())}};
    std::vector<std::string> args = extra;
    for (const auto& [key, value] : defaults) {
      if (std::find(extra.begin(), extra.end(), key) == extra.end()) args.insert(args.end(), {key, value});
    }
    const engine::Config config = engine::parse_config(args).config;
    const io::DatasetInfo data = data_path.empty() ? data_ : io::inspect_dataset(data_path);
    engine::ProgressWatchdog watchdog(config.comm.timeout_s);
    comm::HostGroup group(comm);
    return engine::train(config, topology_, data, group, watchdog);
  }

  // The all-reduce trainer on the first W ranks; every rank gets rank 0's parameters.
  std::vector<float> all_reduce_reference(const std::string& run_dir, std::vector<std::string> extra = {}) {
    std::vector<float> params;
    if (first_workers_ != MPI_COMM_NULL) {
      extra.insert(extra.end(), {"--comm.backend", "mpi", "--comm.sparse_embedding", "false"});
      params = run(run_dir, extra, first_workers_).params;
    }
    int size = static_cast<int>(params.size());
    MPI_Bcast(&size, 1, MPI_INT, 0, MPI_COMM_WORLD);
    params.resize(static_cast<std::size_t>(size));
    MPI_Bcast(params.data(), size, MPI_FLOAT, 0, MPI_COMM_WORLD);
    return params;
  }

  bool identical_on_all_ranks(const std::vector<float>& params) {
    std::vector<float> reference = params;
    MPI_Bcast(reference.data(), static_cast<int>(reference.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    int same = std::memcmp(reference.data(), params.data(), params.size() * sizeof(float)) == 0 ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return same == 1;
  }

  static bool is_worker() { return world_rank() < workers(); }

  SharedDir dir_;
  std::string data_path_;
  io::DatasetInfo data_;
  engine::Topology topology_;
  MPI_Comm first_workers_ = MPI_COMM_NULL;
};

// A CPU worker pushes the embedding's gradient row-sparse (comm.sparse_embedding, the default): the servers
// must end with exactly the parameters of dense pushes.
TEST_F(PsTrainerTest, RowSparsePushesGiveTheParametersOfDensePushes) {
  const engine::TrainResult sparse = run(dir_.file("sparse"), {"--comm.backend", "ps"}, MPI_COMM_WORLD);
  const engine::TrainResult dense =
      run(dir_.file("dense"), {"--comm.backend", "ps", "--comm.sparse_embedding", "false"}, MPI_COMM_WORLD);
  ASSERT_EQ(sparse.params.size(), dense.params.size());
  EXPECT_EQ(std::memcmp(sparse.params.data(), dense.params.data(), sparse.params.size() * sizeof(float)), 0)
      << "row-sparse pushes changed the parameters";
}

TEST_F(PsTrainerTest, SyncEqualsAllReduceOnTheWorkersAndWritesTheSameCheckpoint) {
  const std::vector<float> reference = all_reduce_reference(dir_.file("reference"));
  // comm.backend = auto picks the parameter server on CPU ranks.
  const engine::TrainResult ps = run(dir_.file("ps"), {"--comm.backend", "auto"}, MPI_COMM_WORLD);

  EXPECT_TRUE(identical_on_all_ranks(ps.params)) << "servers and workers end with different parameters";
  EXPECT_LE(max_relative_diff(ps.params, reference), 1e-5);
  if (is_worker()) {
    ASSERT_EQ(ps.history.size(), 2u);
    EXPECT_EQ(ps.history[0].backend, "ps");
    EXPECT_EQ(ps.history[0].world_size, world_size());
    EXPECT_EQ(ps.history[0].workers, workers());
    EXPECT_EQ(ps.history[0].steps, 600 / workers() / 10);
  } else {
    EXPECT_TRUE(ps.history.empty());
  }
  if (world_rank() == 0) {
    const engine::Checkpoint mine = engine::read_checkpoint(dir_.file("ps/last.h5"));
    const engine::Checkpoint theirs = engine::read_checkpoint(dir_.file("reference/last.h5"));
    EXPECT_EQ(mine.params, ps.params);
    EXPECT_EQ(mine.optimizer_name, "adam");
    EXPECT_EQ(mine.optimizer.iterations, theirs.optimizer.iterations);  // one Adam iteration per step
    ASSERT_EQ(mine.optimizer.buffers.size(), theirs.optimizer.buffers.size());
    for (std::size_t b = 0; b < mine.optimizer.buffers.size(); ++b) {
      EXPECT_EQ(mine.optimizer.buffers[b].first, theirs.optimizer.buffers[b].first);
      EXPECT_LE(max_relative_diff(mine.optimizer.buffers[b].second, theirs.optimizer.buffers[b].second),
                1e-5);
    }
    EXPECT_EQ(mine.progress.world_size, workers());  // the data is sharded over the workers
    EXPECT_TRUE(std::filesystem::exists(dir_.file("ps/best.h5")));
    std::ifstream metrics(dir_.file("ps/metrics.jsonl"));
    std::string line;
    std::getline(metrics, line);
    EXPECT_EQ(nlohmann::json::parse(line)["backend"], "ps") << line;
  }
}

TEST_F(PsTrainerTest, SyncStoppedAndResumedEqualsUninterrupted) {
  const std::vector<std::string> ps{"--comm.backend", "ps"};
  const engine::TrainResult straight = run(dir_.file("straight"), ps, MPI_COMM_WORLD);
  const int64_t steps_per_epoch = 600 / workers() / 10;
  // Stop in the second epoch, with mid-epoch checkpoints (each a run of steps of its own) on the way.
  std::vector<std::string> stop = ps;
  stop.insert(stop.end(), {"--train.stop_after_steps", std::to_string(steps_per_epoch + 5),
                           "--checkpoint.every_steps", "4"});
  const engine::TrainResult first = run(dir_.file("interrupted"), stop, MPI_COMM_WORLD);
  if (is_worker()) {
    EXPECT_EQ(first.history.size(), 1u);
  }
  std::vector<std::string> resume = ps;
  resume.push_back("--resume");
  const engine::TrainResult second = run(dir_.file("interrupted"), resume, MPI_COMM_WORLD);
  if (is_worker()) {
    ASSERT_EQ(second.history.size(), 1u);
    EXPECT_NEAR(second.history[0].loss, straight.history[1].loss, 1e-9);
    EXPECT_NEAR(second.history[0].val_loss, straight.history[1].val_loss, 1e-9);
  }
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
}

TEST_F(PsTrainerTest, CheckpointResumesUnderAllReduce) {
  const std::vector<float> reference = all_reduce_reference(dir_.file("reference"));
  const int64_t steps_per_epoch = 600 / workers() / 10;
  run(dir_.file("handover"),
      {"--comm.backend", "ps", "--train.stop_after_steps", std::to_string(steps_per_epoch + 2)},
      MPI_COMM_WORLD);
  const std::vector<float> resumed = all_reduce_reference(dir_.file("handover"), {"--resume"});
  EXPECT_LE(max_relative_diff(resumed, reference), 1e-5);
}

TEST_F(PsTrainerTest, AsyncWithAStragglerConverges) {
  const std::string easy = dir_.file("easy.h5");
  ddp::testing::write_synthetic_on_rank0(
      {.output = easy, .train = 2000, .test = 400, .vocab = 60, .maxlen = 12, .seed = 3});
  const engine::TrainResult result =
      run(dir_.file("async"),
          {"--comm.backend", "ps", "--comm.ps_mode", "async", "--train.straggle_ms", "2",
           "--model.embedding_dim", "16", "--model.hidden", "16", "--train.batch_size", "16",
           "--train.epochs", "3", "--train.learning_rate", "0.01"},
          MPI_COMM_WORLD, easy);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
  if (is_worker()) {
    ASSERT_EQ(result.history.size(), 3u);
    expect_async_converged(result.history);
  }
  if (world_rank() == 0) {
    // Adam counts one iteration per applied gradient: every worker's every step.
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("async/last.h5"));
    EXPECT_EQ(c.optimizer.iterations, 3 * workers() * (2000 / workers() / 16));
  }
}

TEST_F(PsTrainerTest, ImpossibleSetupsAreUserErrorsOnEveryRank) {
  // No rank left to work.
  EXPECT_THROW(
      run(dir_.file("none"), {"--comm.backend", "ps", "--comm.ps_servers", std::to_string(world_size())},
          MPI_COMM_WORLD),
      UserError);
  // Lazy embedding updates need the all-reduce.
  EXPECT_THROW(
      run(dir_.file("lazy"), {"--comm.backend", "ps", "--train.embedding_update", "lazy"}, MPI_COMM_WORLD),
      UserError);
  // A foreign checkpoint is refused on every rank, servers included.
  if (world_rank() == 0) {
    std::filesystem::create_directories(dir_.file("foreign"));
    std::ofstream(dir_.file("foreign/last.h5")) << "not a checkpoint\n";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_THROW(run(dir_.file("foreign"), {"--comm.backend", "ps", "--resume"}, MPI_COMM_WORLD), UserError);
}

TEST_F(PsTrainerTest, AutoOnOneRankKeepsTheSingleReplica) {
  MPI_Comm alone = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &alone);
  if (alone != MPI_COMM_NULL) {
    const engine::TrainResult result =
        run(dir_.file("alone"),
            {"--comm.backend", "auto", "--train.epochs", "1", "--train.max_steps_per_epoch", "3"}, alone);
    ASSERT_EQ(result.history.size(), 1u);
    EXPECT_EQ(result.history[0].backend, "mpi");
    EXPECT_THROW(run(dir_.file("alone-ps"), {"--comm.backend", "ps"}, alone), UserError);
    MPI_Comm_free(&alone);
  }
}

// --- The colocated layout: every rank trains and serves a shard (comm/ps_service.h) -------------

const std::vector<std::string> kColocated{"--comm.backend", "ps", "--comm.ps_servers", "0"};

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Every rank trains: the result is the all-reduce backend's on all the ranks, up to the order in which
// MPI sums; two runs are equal bit for bit, and every rank ends with the same parameters.
TEST_F(PsTrainerTest, ColocatedSyncEqualsAllReduceOnEveryRank) {
  const engine::TrainResult colocated = run(dir_.file("colocated"), kColocated, MPI_COMM_WORLD);
  ASSERT_EQ(colocated.history.size(), 2u);
  EXPECT_EQ(colocated.history[0].workers, world_size()) << "every rank trains";
  EXPECT_EQ(colocated.history[0].backend, "ps");
  EXPECT_TRUE(identical_on_all_ranks(colocated.params));
  const engine::TrainResult all_reduce =
      run(dir_.file("mpi"), {"--comm.backend", "mpi", "--comm.sparse_embedding", "false"}, MPI_COMM_WORLD);
  EXPECT_LE(max_relative_diff(colocated.params, all_reduce.params), 1e-5);
  const engine::TrainResult again = run(dir_.file("colocated-again"), kColocated, MPI_COMM_WORLD);
  EXPECT_EQ(again.params, colocated.params) << "not reproducible run to run";
  if (world_rank() == 0) {
    // The checkpoint holds the whole optimizer state, as the all-reduce backend's does.
    const engine::Checkpoint mine = engine::read_checkpoint(dir_.file("colocated/last.h5"));
    const engine::Checkpoint theirs = engine::read_checkpoint(dir_.file("mpi/last.h5"));
    EXPECT_EQ(mine.optimizer.iterations, theirs.optimizer.iterations);
    ASSERT_EQ(mine.optimizer.buffers.size(), theirs.optimizer.buffers.size());
    for (std::size_t b = 0; b < mine.optimizer.buffers.size(); ++b) {
      EXPECT_LE(max_relative_diff(mine.optimizer.buffers[b].second, theirs.optimizer.buffers[b].second), 1e-5)
          << mine.optimizer.buffers[b].first;
    }
  }
}

// Clipping, a schedule and weight decay under the colocated server: each owner adds its shard's squares to
// the global norm, so the clipped steps are all-reduce's up to the order of float sums; the clipping bites
// (the run differs from one without it). Async refuses clipping on every rank (no averaged gradient).
TEST_F(PsTrainerTest, ColocatedSyncClipsAsAllReduceDoes) {
  const std::vector<std::string> controls{"--train.clip_norm",    "0.02", "--train.lr_schedule",  "cosine",
                                          "--train.warmup_steps", "5",    "--train.weight_decay", "0.01"};
  const engine::TrainResult colocated =
      run(dir_.file("colocated"), with(kColocated, controls), MPI_COMM_WORLD);
  const engine::TrainResult all_reduce =
      run(dir_.file("mpi"), with(controls, {"--comm.backend", "mpi", "--comm.sparse_embedding", "false"}),
          MPI_COMM_WORLD);
  EXPECT_TRUE(identical_on_all_ranks(colocated.params));
  EXPECT_LE(max_relative_diff(colocated.params, all_reduce.params), 1e-4);
  const engine::TrainResult unclipped = run(
      dir_.file("unclipped"),
      with(kColocated,
           {"--train.lr_schedule", "cosine", "--train.warmup_steps", "5", "--train.weight_decay", "0.01"}),
      MPI_COMM_WORLD);
  EXPECT_GT(max_relative_diff(colocated.params, unclipped.params), 1e-3) << "the clipping did not bite";
  if (world_size() > 1) {
    for (const std::vector<std::string>& refused :
         {std::vector<std::string>{"--comm.backend", "ps", "--comm.ps_servers", "1", "--comm.ps_mode",
                                   "async"},
          std::vector<std::string>{"--comm.backend", "ps", "--comm.ps_mode", "async"}}) {
      EXPECT_THROW(run(dir_.file("refused"), with(refused, {"--train.clip_norm", "1"}), MPI_COMM_WORLD),
                   UserError);
    }
  }
}

// Dedicated servers clip as well: each adds its shard's squares and they exchange them (1 server, or 2 with
// 4 ranks), so the steps are all-reduce's on the workers up to the order of float sums, and the same on
// every rank.
TEST_F(PsTrainerTest, DedicatedSyncClipsAsAllReduceDoes) {
  const std::vector<std::string> clip{"--train.clip_norm", "0.02"};
  const std::vector<float> reference = all_reduce_reference(dir_.file("reference"), clip);
  const engine::TrainResult ps = run(
      dir_.file("ps"), with({"--comm.backend", "ps", "--comm.ps_servers", std::to_string(servers())}, clip),
      MPI_COMM_WORLD);
  EXPECT_TRUE(identical_on_all_ranks(ps.params)) << "servers and workers end with different parameters";
  EXPECT_LE(max_relative_diff(ps.params, reference), 1e-4);
  const std::vector<float> unclipped = all_reduce_reference(dir_.file("unclipped"));
  EXPECT_GT(max_relative_diff(reference, unclipped), 1e-3) << "the clipping did not bite";
}

TEST_F(PsTrainerTest, ColocatedStoppedAndResumedEqualsUninterrupted) {
  const engine::TrainResult straight = run(dir_.file("straight"), kColocated, MPI_COMM_WORLD);
  const int64_t steps_per_epoch = straight.history[0].steps;
  const engine::TrainResult first = run(
      dir_.file("stopped"),
      with(kColocated, {"--train.stop_after_steps", std::to_string(steps_per_epoch + 2)}), MPI_COMM_WORLD);
  EXPECT_EQ(first.history.size(), 1u);
  const engine::TrainResult second =
      run(dir_.file("stopped"), with(kColocated, {"--resume"}), MPI_COMM_WORLD);
  ASSERT_EQ(second.history.size(), 1u);
  EXPECT_EQ(second.params, straight.params) << "resumed run differs from the uninterrupted one";
}

// With many rows and small batches (4,000 rows, 160 tokens a step) the colocated layout pushes and fetches
// embedding rows instead of the whole embedding, so every rank's copy of a row is stale until a batch reads
// it: still the all-reduce backend's result, the same on every rank after each run of steps, with clipping
// too, and a run stopped mid-epoch resumes to the uninterrupted run's bits.
TEST_F(PsTrainerTest, ColocatedRowExchangeEqualsAllReduceAndResumes) {
  const std::string wide = dir_.file("wide.h5");
  ddp::testing::write_synthetic_on_rank0(
      {.output = wide, .train = 600, .test = 130, .vocab = 4000, .maxlen = 16, .seed = 7});
  const std::vector<std::string> clipped{"--train.clip_norm", "0.05"};
  const engine::TrainResult colocated =
      run(dir_.file("colocated"), with(kColocated, clipped), MPI_COMM_WORLD, wide);
  EXPECT_TRUE(identical_on_all_ranks(colocated.params));
  const engine::TrainResult all_reduce =
      run(dir_.file("mpi"), with(clipped, {"--comm.backend", "mpi"}), MPI_COMM_WORLD, wide);
  EXPECT_LE(max_relative_diff(colocated.params, all_reduce.params), 1e-5);

  const int64_t steps_per_epoch = colocated.history[0].steps;
  run(dir_.file("stopped"),
      with(kColocated,
           {"--train.clip_norm", "0.05", "--train.stop_after_steps", std::to_string(steps_per_epoch + 3)}),
      MPI_COMM_WORLD, wide);
  const engine::TrainResult resumed =
      run(dir_.file("stopped"), with(kColocated, {"--train.clip_norm", "0.05", "--resume"}), MPI_COMM_WORLD,
          wide);
  EXPECT_EQ(resumed.params, colocated.params) << "resumed run differs from the uninterrupted one";
}

// comm.compression = bf16 | fp16 under the colocated layout, with the whole region exchanged (small
// vocabulary) and with its rows (wide vocabulary), and under dedicated servers: every rank ends with the same
// bits, and the result is the float run's within the 16-bit rounding of gradients and updates, but not equal
// to it (the wire did round); two runs are equal (checked once). fp16 on the wide vocabulary only, to keep
// the test short (the protocol's own tests check bf16's bits against a reference, and fp16's scale).
TEST_F(PsTrainerTest, SixteenBitWiresKeepReplicasIdenticalAndNearFloat) {
  const std::string wide = dir_.file("wide-16.h5");
  ddp::testing::write_synthetic_on_rank0(
      {.output = wide, .train = 600, .test = 130, .vocab = 4000, .maxlen = 16, .seed = 7});
  const std::vector<std::string> dedicated{"--comm.backend", "ps", "--comm.ps_servers",
                                           std::to_string(servers())};
  // (data, layout): the float run each wire is compared with.
  const std::vector<std::pair<std::string, std::vector<std::string>>> setups{
      {std::string(), kColocated}, {wide, kColocated}, {wide, dedicated}};
  for (const auto& [data, layout] : setups) {
    const std::string setup = (data.empty() ? "narrow-" : "wide-") + layout.back();
    const engine::TrainResult exact = run(dir_.file(setup + "-float"), layout, MPI_COMM_WORLD, data);
    for (const std::string wire : {"bf16", "fp16"}) {
      if (data.empty() && wire == "fp16") continue;
      const std::string name = setup + "-" + wire;
      const std::vector<std::string> compressed = with(layout, {"--comm.compression", wire});
      const engine::TrainResult rounded = run(dir_.file(name), compressed, MPI_COMM_WORLD, data);
      EXPECT_TRUE(identical_on_all_ranks(rounded.params)) << name;
      const double diff = max_relative_diff(rounded.params, exact.params);
      EXPECT_GT(diff, 0) << name << ": the wire rounded nothing";
      EXPECT_LT(diff, 0.01) << name << ": further from the float run than 16 bits' rounding explains";
      if (wire == "fp16" && layout == kColocated) {
        const engine::TrainResult again = run(dir_.file(name + "-again"), compressed, MPI_COMM_WORLD, data);
        EXPECT_EQ(again.params, rounded.params) << name << ": not reproducible run to run";
      }
    }
  }
}

// A colocated checkpoint continues under the all-reduce backend and under dedicated servers, and the other
// way round: the state is in the canonical layout whatever the layout of the servers.
TEST_F(PsTrainerTest, ColocatedCheckpointsMoveBetweenBackends) {
  const std::vector<std::string> one_epoch{"--train.epochs", "1"};
  const std::vector<std::string> two_epochs{"--train.epochs", "2", "--resume"};
  const std::vector<std::string> mpi{"--comm.backend", "mpi", "--comm.sparse_embedding", "false"};
  const engine::TrainResult straight = run(dir_.file("straight"), mpi, MPI_COMM_WORLD);

  run(dir_.file("to-mpi"), with(kColocated, one_epoch), MPI_COMM_WORLD);
  const engine::TrainResult under_mpi = run(dir_.file("to-mpi"), with(mpi, two_epochs), MPI_COMM_WORLD);
  ASSERT_EQ(under_mpi.history.size(), 1u);
  EXPECT_LE(max_relative_diff(under_mpi.params, straight.params), 1e-5);

  run(dir_.file("to-colocated"), with(mpi, one_epoch), MPI_COMM_WORLD);
  const engine::TrainResult under_colocated =
      run(dir_.file("to-colocated"), with(kColocated, two_epochs), MPI_COMM_WORLD);
  ASSERT_EQ(under_colocated.history.size(), 1u);
  EXPECT_LE(max_relative_diff(under_colocated.params, straight.params), 1e-5);

  // And with one dedicated server, both ways: N - 1 ranks train under it, so the data order changes (as the
  // log says). Dedicated sync equals all-reduce over its workers, so the reference is the all-reduce trainer
  // on N ranks and on the first N - 1, in the same order.
  const std::vector<std::string> dedicated{"--comm.backend", "ps", "--comm.ps_servers", "1"};
  MPI_Comm all_but_last = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank() < world_size() - 1 ? 0 : MPI_UNDEFINED, world_rank(),
                 &all_but_last);
  auto on_all_but_last = [&](const std::string& run_dir, const std::vector<std::string>& extra) {
    if (all_but_last != MPI_COMM_NULL) run(run_dir, extra, all_but_last);
    MPI_Barrier(MPI_COMM_WORLD);
  };
  // Rank 0's last.h5 parameters of `run_dir`, compared with those of `reference`.
  auto expect_same_checkpoint = [&](const std::string& run_dir, const std::string& reference) {
    if (world_rank() != 0) return;
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file(run_dir + "/last.h5"));
    EXPECT_EQ(c.progress.epoch, 2) << run_dir;
    EXPECT_LE(max_relative_diff(c.params, engine::read_checkpoint(dir_.file(reference + "/last.h5")).params),
              1e-5)
        << run_dir;
  };

  run(dir_.file("to-dedicated"), with(kColocated, one_epoch), MPI_COMM_WORLD);
  const engine::TrainResult under_dedicated =
      run(dir_.file("to-dedicated"), with(dedicated, two_epochs), MPI_COMM_WORLD);
  if (world_rank() < world_size() - 1) {
    EXPECT_EQ(under_dedicated.history.size(), 1u);
  }
  run(dir_.file("to-dedicated-reference"), with(mpi, one_epoch), MPI_COMM_WORLD);
  on_all_but_last(dir_.file("to-dedicated-reference"), with(mpi, two_epochs));
  expect_same_checkpoint("to-dedicated", "to-dedicated-reference");

  run(dir_.file("from-dedicated"), with(dedicated, one_epoch), MPI_COMM_WORLD);
  const engine::TrainResult from_dedicated =
      run(dir_.file("from-dedicated"), with(kColocated, two_epochs), MPI_COMM_WORLD);
  ASSERT_EQ(from_dedicated.history.size(), 1u);
  EXPECT_EQ(from_dedicated.history[0].epoch, 2);
  EXPECT_TRUE(identical_on_all_ranks(from_dedicated.params));
  on_all_but_last(dir_.file("from-dedicated-reference"), with(mpi, one_epoch));
  run(dir_.file("from-dedicated-reference"), with(mpi, two_epochs), MPI_COMM_WORLD);
  expect_same_checkpoint("from-dedicated", "from-dedicated-reference");
  if (all_but_last != MPI_COMM_NULL) MPI_Comm_free(&all_but_last);
}

TEST_F(PsTrainerTest, ColocatedRefusesWhatItCannotServe) {
  EXPECT_THROW(run(dir_.file("lazy"), with(kColocated, {"--train.embedding_update", "lazy"}), MPI_COMM_WORLD),
               UserError);
  EXPECT_THROW(run(dir_.file("servers"), {"--comm.backend", "ps", "--comm.ps_servers", "-1"}, MPI_COMM_WORLD),
               UserError);
}

// Async over the colocated layout: each rank's server thread applies every rank's gradient as it comes,
// while the last rank straggles (it sleeps after each step) and holds the others back by at most
// comm.max_staleness steps.
TEST_F(PsTrainerTest, ColocatedAsyncWithAStragglerConverges) {
  const std::string easy = dir_.file("easy.h5");
  ddp::testing::write_synthetic_on_rank0(
      {.output = easy, .train = 2000, .test = 400, .vocab = 60, .maxlen = 12, .seed = 3});
  const engine::TrainResult result =
      run(dir_.file("async"),
          with(kColocated, {"--comm.ps_mode", "async", "--train.straggle_ms", "2", "--model.embedding_dim",
                            "16", "--model.hidden", "16", "--train.batch_size", "16", "--train.epochs", "5",
                            "--train.learning_rate", "0.01"}),
          MPI_COMM_WORLD, easy);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
  ASSERT_EQ(result.history.size(), 5u);
  EXPECT_EQ(result.history[0].workers, world_size()) << "every rank trains";
  expect_async_converged(result.history);
  if (world_rank() == 0) {
    // Adam counts one iteration per applied gradient: every rank's every step, on every shard alike.
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("async/last.h5"));
    EXPECT_EQ(c.optimizer.iterations, 5 * world_size() * (2000 / world_size() / 16));
  }
}

// A colocated async run stopped in the middle of an epoch resumes from its checkpoint and trains the rest.
TEST_F(PsTrainerTest, ColocatedAsyncStoppedAndResumedFinishes) {
  const std::vector<std::string> async = with(kColocated, {"--comm.ps_mode", "async"});
  const engine::TrainResult first =
      run(dir_.file("stopped"), with(async, {"--train.stop_after_steps", "5"}), MPI_COMM_WORLD);
  EXPECT_TRUE(first.history.empty());
  EXPECT_EQ(first.steps_done_in_epoch, 5);
  const engine::TrainResult second = run(dir_.file("stopped"), with(async, {"--resume"}), MPI_COMM_WORLD);
  ASSERT_EQ(second.history.size(), 2u);
  EXPECT_TRUE(identical_on_all_ranks(second.params));
  if (world_rank() == 0) {
    const engine::Checkpoint c = engine::read_checkpoint(dir_.file("stopped/last.h5"));
    EXPECT_EQ(c.progress.epoch, 2);
    EXPECT_EQ(c.optimizer.iterations, 2 * world_size() * second.history[0].steps);
  }
}

}  // namespace
}  // namespace ddp

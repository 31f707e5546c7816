// The whole training loop under MPI: replicas identical at the end, metrics written, and a run stopped in the
// middle of an epoch and resumed ends with exactly the parameters of a run never interrupted.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "comm/communicator.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/topology.h"
#include "engine/trainer.h"
#include "io/dataset.h"
#include "io/synthetic.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

using ddp::testing::SharedDir;
using ddp::testing::world_rank;
using ddp::testing::world_size;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = comm::make_mpi_communicator(MPI_COMM_WORLD);
    data_path_ = dir_.file("data.h5");
    ddp::testing::write_synthetic_on_rank0(
        {.output = data_path_, .train = 600, .test = 130, .vocab = 300, .maxlen = 16, .seed = 5});
    data_ = io::inspect_dataset(data_path_);
    topology_ = engine::discover_topology(MPI_COMM_WORLD, "cpu");
  }

  // The all-reduce trainer (comm.backend = auto would pick the parameter server on CPU ranks: those runs are
  // tested in ps_trainer_test.cpp).
  engine::TrainResult run(const std::string& run_dir, std::vector<std::string> extra) {
    std::vector<std::string> args{"--data.path",           data_path_, "--checkpoint.dir", run_dir,
                                  "--model.embedding_dim", "8",        "--model.hidden",   "8",
                                  "--train.batch_size",    "10",       "--train.epochs",   "2",
                                  "--log.progress",        "lines",    "--comm.backend",   "mpi"};
    args.insert(args.end(), extra.begin(), extra.end());
    const engine::Config config = engine::parse_config(args).config;
    engine::ProgressWatchdog watchdog(config.comm.timeout_s);
    return engine::train(config, topology_, data_, MPI_COMM_WORLD, watchdog);
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
  std::unique_ptr<comm::Communicator> comm_;
  std::string data_path_;
  io::DatasetInfo data_;
  engine::Topology topology_;
};

TEST_F(TrainerTest, ReplicasEndIdenticalAndMetricsAreWritten) {
  const engine::TrainResult result = run(dir_.file("run"), {});
  ASSERT_EQ(result.history.size(), 2u);
  EXPECT_TRUE(identical_on_all_ranks(result.params));
  EXPECT_EQ(result.history[0].world_size, comm_->size());
  EXPECT_EQ(result.history[0].steps, 600 / comm_->size() / 10);
  EXPECT_GT(result.history[1].val_acc, 0.0);
  if (comm_->rank() == 0) {
    std::ifstream metrics(dir_.file("run/metrics.jsonl"));
    std::string line;
    int lines = 0;
    while (std::getline(metrics, line)) {
      ++lines;
      EXPECT_NE(line.find("\"val_acc\""), std::string::npos);
    }
    EXPECT_EQ(lines, 2);
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/last.h5")));
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/best.h5")));
    EXPECT_TRUE(std::filesystem::exists(dir_.file("run/config.ini")));
    EXPECT_EQ(engine::read_checkpoint(dir_.file("run/last.h5")).params, result.params);
  }
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

TEST_F(TrainerTest, ResumeWithoutCheckpointIsAUserErrorOnEveryRank) {
  EXPECT_THROW(run(dir_.file("empty"), {"--resume"}), UserError);
}

}  // namespace
}  // namespace ddp

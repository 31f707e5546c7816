// The start log's wording, from the facts the trainer gathers (no MPI needed): the lines users and the
// launch tests read.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/start_log.h"

namespace ddp::engine {
namespace {

TEST(StartLog, RankLine) {
  RankStartFacts rank;
  rank.rank = 1;
  rank.ranks = 4;
  rank.local_rank = 1;
  rank.local_ranks = 2;
  rank.host = "node7";
  rank.device = "cuda:1 NVIDIA H100 (PCI 0000:1a:00.0), cuDNN persist_small_h";
  rank.device_reason = "device = auto: GPU of local rank 1";
  rank.train_rows = {4500, 9000};
  EXPECT_EQ(
      rank_start_line(rank),
      "rank 1/4 on node7 (local rank 1/2): cuda:1 NVIDIA H100 (PCI 0000:1a:00.0), cuDNN persist_small_h "
      "[device = auto: GPU of local rank 1], train rows [4500, 9000)");
}

RunStartFacts imdb_run() {
  RunStartFacts run;
  run.backend_reason = "mpi: 2 CPU ranks";
  run.data_path = "data/imdb.h5";
  run.vocab_size = 20000;
  run.maxlen = 80;
  run.data_plan = "train 22500 (the first rows of /train), val 2500, test 25000";
  run.embedding_dim = 128;
  run.layers = 1;
  run.hidden = 128;
  run.parameters = 2692225;
  run.optimizer = "adam";
  run.learning_rate = 0.001;
  run.batch_size = 32;
  run.trainers = 2;
  run.trainers_name = "ranks";
  run.steps_per_epoch = 351;
  run.run_id = "20261124T120000Z-ab12";
  run.run_dir = "runs/imdb";
  run.checkpoint = "runs/imdb/last.h5";
  run.epochs = 15;
  return run;
}

TEST(StartLog, RunLinesInOrder) {
  const std::vector<std::string> lines = start_log_lines(imdb_run(), {"rank 0 ...", "rank 1 ..."});
  const std::vector<std::string> expected{"backend mpi: 2 CPU ranks",
                                          "rank 0 ...",
                                          "rank 1 ...",
                                          "data data/imdb.h5: vocab 20000, maxlen 80; train 22500 (the first "
                                          "rows of /train), val 2500, test 25000",
                                          "model: embedding 128, LSTM 1 x 128, 2692225 parameters; adam lr "
                                          "0.001; batch 32 per rank x 2 ranks; 351 "
                                          "steps per epoch",
                                          "run 20261124T120000Z-ab12 in runs/imdb"};
  EXPECT_EQ(lines, expected);
}

TEST(StartLog, WhereTheRunStarts) {
  RunStartFacts run = imdb_run();
  run.start = RunStartFacts::Start::kResumed;
  run.epochs_done = 3;
  run.steps_done = 120;
  EXPECT_EQ(start_log_lines(run, {}).back(),
            "resumed from runs/imdb/last.h5 (run 20261124T120000Z-ab12): 3 epochs and 120 steps done");
  run.epochs_done = 1;
  run.steps_done = 1;
  EXPECT_EQ(start_log_lines(run, {}).back(),
            "resumed from runs/imdb/last.h5 (run 20261124T120000Z-ab12): 1 epoch and 1 step done");
  run.start = RunStartFacts::Start::kAlreadyFinished;
  run.epochs_done = 15;
  run.steps_done = 0;
  EXPECT_EQ(
      start_log_lines(run, {}).back(),
      "runs/imdb/last.h5: run 20261124T120000Z-ab12 already finished its 15 epochs (train.epochs = 15): "
      "nothing to train; raise train.epochs to train further");
  // train.epochs lowered below what the run had trained, part of the next epoch included.
  run.epochs_done = 17;
  run.steps_done = 12;
  EXPECT_EQ(start_log_lines(run, {}).back(),
            "runs/imdb/last.h5: run 20261124T120000Z-ab12 already trained 17 epochs and 12 steps of the next "
            "(train.epochs = 15): nothing to train; raise train.epochs to train further");
}

// A shard is named only when its classes differ by more than 5 points and by more than random rows would:
// 100 rows of a 50/50 file may well hold 58 of one class (1.6 standard errors), 10,000 may not.
TEST(StartLog, SkewedShardsAreThoseChanceCannotExplain) {
  const std::vector<double> half_and_half{50000, 50000};
  EXPECT_FALSE(shard_classes_skewed(std::vector<int64_t>{58, 42}, half_and_half));
  EXPECT_TRUE(shard_classes_skewed(std::vector<int64_t>{80, 20}, half_and_half));  // 6 standard errors
  EXPECT_TRUE(shard_classes_skewed(std::vector<int64_t>{5800, 4200}, half_and_half));
  EXPECT_FALSE(shard_classes_skewed(std::vector<int64_t>{5300, 4700}, half_and_half));  // 3 points
  // A file in label order: rank 0 of two holds all of class 0.
  EXPECT_TRUE(shard_classes_skewed(std::vector<int64_t>{25, 0}, std::vector<double>{25, 25}));
  // A rare class: 20 of 1000 rows where 1% is the share is 3.2 standard errors but 1 point: chance.
  EXPECT_FALSE(shard_classes_skewed(std::vector<int64_t>{980, 20}, std::vector<double>{99000, 1000}));
  EXPECT_FALSE(shard_classes_skewed(std::vector<int64_t>{}, half_and_half));  // an empty shard
}

}  // namespace
}  // namespace ddp::engine

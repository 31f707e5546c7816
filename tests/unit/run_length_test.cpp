// How long a run trains (engine/run_length.h): the steps of an epoch and of the run, train.stop_after_steps
// and early stopping, with the lines they print.
#include <gtest/gtest.h>

#include <string>

#include "engine/run_length.h"

namespace ddp::engine {
namespace {

// 1000 training rows, all trained on (data.validation = val reads /val).
io::DatasetInfo thousand_rows() {
  io::DatasetInfo data;
  data.path = "data.h5";
  data.train_size = 1000;
  data.val_size = 100;
  data.has_val = true;
  data.test_size = 100;
  return data;
}

Config batches_of_32() {
  Config config;
  config.data.validation = "val";
  config.train.batch_size = 32;
  config.train.epochs = 3;
  return config;
}

TEST(RunLength, AnEpochIsEachRanksFullBatches) {
  Config config = batches_of_32();
  EXPECT_EQ(steps_per_epoch(config, thousand_rows(), 1), 31);  // 1000 rows: 31 full batches, 8 rows left
  EXPECT_EQ(steps_per_epoch(config, thousand_rows(), 2), 15);  // 500 rows each
  EXPECT_EQ(planned_steps(config, thousand_rows(), 2), 45);
  config.train.max_steps_per_epoch = 10;
  EXPECT_EQ(steps_per_epoch(config, thousand_rows(), 2), 10);
  EXPECT_EQ(planned_steps(config, thousand_rows(), 2), 30);
  config.train.max_steps_per_epoch = 100;  // a cap above the epoch changes nothing
  EXPECT_EQ(steps_per_epoch(config, thousand_rows(), 2), 15);
}

TEST(RunLength, StopAfterStepsCountsEveryStepOfTheRun) {
  Config config = batches_of_32();
  TrainingProgress progress;
  progress.global_step = 40;
  EXPECT_FALSE(stop_after_steps_reached(config, progress));  // 0: never
  config.train.stop_after_steps = 41;
  EXPECT_FALSE(stop_after_steps_reached(config, progress));
  config.train.stop_after_steps = 40;
  EXPECT_TRUE(stop_after_steps_reached(config, progress));

  config.checkpoint.dir = "runs/a";
  EXPECT_EQ(stop_after_steps_line(config, progress, true),
            "stopped after 40 steps (train.stop_after_steps 40): runs/a/last.h5 holds them; --resume with a "
            "larger train.stop_after_steps, or 0, continues");
  EXPECT_EQ(stop_after_steps_line(config, progress, false).substr(0, 21), "already at 40 steps (");
}

TEST(RunLength, PatienceIsSpentEpochsAfterTheBestOne) {
  Config config = batches_of_32();
  TrainingProgress progress;
  progress.epoch = 5;
  progress.best_epoch = 3;
  EXPECT_FALSE(patience_spent(config, progress));  // patience 0: never stops early
  config.train.early_stopping_patience = 2;
  EXPECT_TRUE(patience_spent(config, progress));
  progress.best_epoch = 4;
  EXPECT_FALSE(patience_spent(config, progress));
  progress = {};  // no epoch yet: nothing to judge
  EXPECT_FALSE(patience_spent(config, progress));

  progress.epoch = 5;
  progress.best_epoch = 3;
  EXPECT_EQ(early_stop_line(config, progress, "val"),
            "early stopping: val_loss has not improved for 2 epoch(s) since epoch 3 "
            "(train.early_stopping_patience = 2); best.h5 holds epoch 3");
}

}  // namespace
}  // namespace ddp::engine

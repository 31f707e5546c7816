// Checkpoints (engine/checkpoint.h): round trips, atomic writes, and damaged or foreign files.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/optimizer/optimizer.h"
#include "models/replica.h"
#include "tests/test_util.h"

namespace ddp::engine {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::TempDir;
using ddp::testing::write_text;

TEST(Checkpoint, RoundTripAndAtomicWrite) {
  TempDir dir;
  const models::ModelShape shape{50, 8, 6, 2};
  const models::ParamLayout layout(shape);
  std::vector<float> params(layout.total_size());
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i) * 0.001f - 0.3f;
  optim::OptimizerSettings s;
  auto adam = optim::make_optimizer(s, params.size());
  std::vector<float> scratch = params;
  adam->step(scratch, params);
  TrainingProgress progress;
  progress.epoch = 3;
  progress.step_in_epoch = 7;
  progress.global_step = 100;
  progress.seed = 42;
  progress.world_size = 2;
  progress.batch_size = 16;
  progress.best_val_loss = 0.25;
  progress.loss_sum = 12.5;
  const std::string path = dir.file("last.h5");
  write_checkpoint(path, shape, params, adam->name(), adam->state(), progress, "[train]\nepochs = 3\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const Checkpoint c = read_checkpoint(path);
  EXPECT_EQ(c.shape, shape);
  EXPECT_EQ(c.params, params);
  EXPECT_EQ(c.optimizer_name, "adam");
  EXPECT_EQ(c.optimizer.iterations, 1);
  ASSERT_EQ(c.optimizer.buffers.size(), 2u);
  EXPECT_EQ(c.optimizer.buffers[0].second, adam->state().buffers[0].second);
  EXPECT_EQ(c.progress.epoch, 3);
  EXPECT_EQ(c.progress.step_in_epoch, 7);
  EXPECT_EQ(c.progress.global_step, 100);
  EXPECT_EQ(c.progress.seed, 42u);
  EXPECT_EQ(c.progress.best_val_loss, 0.25);
  EXPECT_EQ(c.progress.loss_sum, 12.5);
  EXPECT_EQ(c.config_ini, "[train]\nepochs = 3\n");

  // Overwriting keeps a readable file at every moment: the new one replaces the old by rename.
  params[0] = 99.0f;
  write_checkpoint(path, shape, params, adam->name(), adam->state(), progress, "");
  EXPECT_EQ(read_checkpoint(path).params[0], 99.0f);
}

// The writer takes the optimizer's buffers one at a time (visit_state hands the host optimizer's own memory);
// a writer given up before commit() leaves the previous checkpoint as it was and no temporary file.
TEST(Checkpoint, WriterTakesBuffersOneAtATimeAndAbandonsCleanly) {
  TempDir dir;
  const models::ModelShape shape{40, 4, 3, 1};
  const models::ParamLayout layout(shape);
  std::vector<float> params(layout.total_size(), 0.25f);
  optim::OptimizerSettings s;
  auto adam = optim::make_optimizer(s, params.size());
  std::vector<float> grads(params.size(), 0.5f);
  adam->step(params, grads);
  const std::string path = dir.file("last.h5");
  {
    CheckpointWriter writer(path, shape, params, adam->name(), adam->iterations(), {}, "");
    adam->visit_state([&](const std::string& name, std::span<const float> values) {
      writer.add_optimizer_buffer(name, values);
    });
    writer.commit();
  }
  const Checkpoint written = read_checkpoint(path);
  EXPECT_EQ(written.optimizer.iterations, 1);
  ASSERT_EQ(written.optimizer.buffers.size(), 2u);
  EXPECT_EQ(written.optimizer.buffers[0].first, "m");
  EXPECT_EQ(written.optimizer.buffers[0].second, adam->state().buffers[0].second);
  EXPECT_EQ(written.optimizer.buffers[1].second, adam->state().buffers[1].second);
  {
    std::vector<float> other(params.size(), 9.0f);
    CheckpointWriter abandoned(path, shape, other, adam->name(), 7, {}, "");
    abandoned.add_optimizer_buffer("m", other);
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_checkpoint(path).params, params);
}

// The replicas' random states (cuDNN's dropout state on GPUs) travel as bytes, by rank, a rank without one
// kept apart from a rank whose state is empty; a checkpoint whose ranks have none holds no group, and the
// model-only read leaves them out.
TEST(Checkpoint, KeepsEachRanksReplicaRandomState) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 2};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  const std::vector<std::string> states{binary, "", std::string(3, '\0')};
  const std::string path = dir.file("last.h5");
  {
    CheckpointWriter writer(path, shape, params, "adam", 0, {}, "");
    writer.add_replica_rng_states(states);
    writer.commit();
  }
  EXPECT_EQ(read_checkpoint(path).replica_rng_states, states);
  EXPECT_TRUE(read_checkpoint(path, CheckpointParts::kModel).replica_rng_states.empty());
  {
    CheckpointWriter writer(path, shape, params, "adam", 0, {}, "");
    writer.add_replica_rng_states({"", ""});
    writer.commit();
  }
  EXPECT_TRUE(read_checkpoint(path).replica_rng_states.empty());
}

// fp16's loss scaling, where ranks scaled: kept, and refused where damaged; none in other checkpoints.
TEST(Checkpoint, KeepsTheLossScaling) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 2};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  const std::string path = dir.file("last.h5");
  TrainingProgress progress;
  write_checkpoint(path, shape, params, "adam", {}, progress, "");
  EXPECT_FALSE(read_checkpoint(path).progress.loss_scaling.has_value());
  progress.loss_scaling = models::LossScale::State{2048.0f, 1234, 17};
  write_checkpoint(path, shape, params, "adam", {}, progress, "");
  const std::optional<models::LossScale::State> read = read_checkpoint(path).progress.loss_scaling;
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->scale, 2048.0f);
  EXPECT_EQ(read->clean_steps, 1234);
  EXPECT_EQ(read->skipped, 17);

  // An edit made on purpose (the header's checksum dropped): `value` as a double, or as an integer.
  const auto set_number = [&](const char* name, auto value) {
    const bool integer = std::is_integral_v<decltype(value)>;
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    H5Adelete(file, "header_checksum");
    H5Adelete(file, name);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr =
        H5Acreate2(file, name, integer ? H5T_STD_I64LE : H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(attr, integer ? H5T_NATIVE_INT64 : H5T_NATIVE_DOUBLE, &value), 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Fclose(file);
  };
  for (const double bad : {3.0, 0.25, 1e300, -4.0, std::nan("")}) {
    write_checkpoint(path, shape, params, "adam", {}, progress, "");
    set_number("loss_scale", bad);
    expect_user_error([&] { read_checkpoint(path); }, {path, "loss_scale", "is not a power of two"});
  }
  write_checkpoint(path, shape, params, "adam", {}, progress, "");
  set_number("loss_scale_clean_steps", int64_t{2000});
  expect_user_error([&] { read_checkpoint(path); }, {path, "loss_scale_clean_steps", "outside [0, 2000)"});
}

TEST(Checkpoint, DamagedCountersSumsFlagsAndClassNamesAreUserErrors) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 1};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  const std::string path = dir.file("last.h5");
  const auto expect_refused = [&](const std::string& mention) {
    expect_user_error([&] { read_checkpoint(path); }, {path, mention});
  };
  TrainingProgress progress;
  progress.step_in_epoch = -3;
  write_checkpoint(path, shape, params, "adam", {}, progress, "");
  expect_refused("step_in_epoch = -3 is not 0 to 2^53");
  progress.step_in_epoch = 0;
  OptimizerState state;
  state.iterations = -1;
  write_checkpoint(path, shape, params, "adam", state, progress, "");
  expect_refused("iterations = -1 is not 0 to 2^53");
  // Counters whose next step would wrap, or that the doubles carrying progress between ranks cannot hold:
  // an epoch of 2^63 - 1 resumed as epoch -2^63 and trained forever, an optimizer step as NaN parameters.
  state.iterations = 3;
  for (int64_t TrainingProgress::*counter : {&TrainingProgress::epoch, &TrainingProgress::global_step}) {
    TrainingProgress huge;
    huge.*counter = INT64_MAX;
    write_checkpoint(path, shape, params, "adam", state, huge, "");
    expect_refused(" = 9223372036854775807 is not 0 to 2^53");
    huge.*counter = (int64_t{1} << 53) - 1;  // the largest that passes
    write_checkpoint(path, shape, params, "adam", state, huge, "");
    EXPECT_EQ(read_checkpoint(path).progress.*counter, (int64_t{1} << 53) - 1);
  }
  state.iterations = INT64_MAX;
  write_checkpoint(path, shape, params, "adam", state, TrainingProgress{}, "");
  expect_refused("iterations = 9223372036854775807 is not 0 to 2^53");

  // best.h5's epoch cannot come after the epochs the checkpoint has finished.
  TrainingProgress later_best;
  later_best.epoch = 2;
  later_best.best_epoch = 3;
  write_checkpoint(path, shape, params, "adam", {}, later_best, "");
  expect_refused("best_epoch = 3 is after its epoch = 2");
  later_best.best_epoch = 2;
  write_checkpoint(path, shape, params, "adam", {}, later_best, "");
  EXPECT_EQ(read_checkpoint(path).progress.best_epoch, 2);

  // The interrupted epoch's sums, the 0/1 attributes and the class names are checked as the counters are:
  // edited values printed an accuracy of 2.8e27 or named two classes with one name.
  const auto sums = [&](double loss_sum, double correct, double count) {
    TrainingProgress p;
    p.loss_sum = loss_sum;
    p.correct = correct;
    p.count = count;
    write_checkpoint(path, shape, params, "adam", {}, p, "");
  };
  sums(12.5, 3, 8);
  EXPECT_EQ(read_checkpoint(path).progress.correct, 3);
  for (const auto& [loss_sum, correct, count] :
       {std::tuple{12.5, 9.0, 8.0}, std::tuple{12.5, 1e30, 8.0}, std::tuple{12.5, 2.5, 8.0},
        std::tuple{-1.0, 3.0, 8.0}, std::tuple{std::nan(""), 3.0, 8.0}, std::tuple{1.0, 3.0, std::nan("")},
        std::tuple{1.0, -1.0, 8.0}, std::tuple{HUGE_VAL, 3.0, 8.0}}) {
    sums(loss_sum, correct, count);
    expect_refused("are not the sums of an epoch");
  }

  // An edit made on purpose drops the header's checksum, as the refusal of an edit says to.
  const auto set_int = [&](const char* name, int64_t value, bool keep_checksum = false) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    if (!keep_checksum) H5Adelete(file, "header_checksum");
    H5Adelete(file, name);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Fclose(file);
  };
  for (const char* flag : {"mask_padding", "bidirectional"}) {
    write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "");
    set_int(flag, 5);
    expect_refused(std::string(flag) + " = 5 is not 0 or 1");
  }
  // A counter changed in a way no range check can see (a flipped bit: step 0 became 2^32) is caught by the
  // checksum over the root's attributes; without that checksum (an edit, or a checkpoint of before) it reads.
  write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "");
  set_int("step_in_epoch", int64_t{1} << 32, /*keep_checksum=*/true);
  expect_refused("attributes (model dimensions, progress, run) do not match the checksum written with them");
  set_int("step_in_epoch", int64_t{1} << 32);
  EXPECT_EQ(read_checkpoint(path).progress.step_in_epoch, int64_t{1} << 32);

  RunRecord run;
  run.class_names = {"neg", "pos"};
  write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "", run);
  EXPECT_EQ(read_checkpoint(path).run.class_names, run.class_names);
  models::ModelShape three = shape;
  three.classes = 3;
  const std::vector<float> three_params(models::ParamLayout(three).total_size(), 0.5f);
  write_checkpoint(path, three, three_params, "adam", {}, TrainingProgress{}, "", run);
  expect_refused("/classes names 2 classes, not the model's 3");
  run.class_names = {"a", "b", "c", "d"};
  write_checkpoint(path, three, three_params, "adam", {}, TrainingProgress{}, "", run);
  expect_refused("/classes names more classes, not the model's 3");
}

// A value changed on disk after the write (a torn copy, a bad sector) is caught by the checksum written with
// the values, in the parameters and in the optimizer's state, instead of resuming as garbage; a checkpoint
// from before the checksum (none beside its values) still reads.
TEST(Checkpoint, DamagedValuesAreUserErrors) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 1};
  const std::size_t total = models::ParamLayout(shape).total_size();
  std::vector<float> params(total);
  for (std::size_t i = 0; i < total; ++i) params[i] = 0.01f * static_cast<float>(i);
  OptimizerState state;
  state.iterations = 3;
  state.buffers = {{"m", params}, {"v", params}};
  const std::string path = dir.file("last.h5");
  // Rewrites one value of `dataset` in place, or (`drop_checksum`) removes the checksum beside it.
  const auto tamper = [&](const char* dataset, bool drop_checksum) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t set = H5Dopen2(file, dataset, H5P_DEFAULT);
    ASSERT_GE(set, 0);
    if (drop_checksum) {
      EXPECT_GE(H5Adelete(set, "checksum"), 0);
    } else {
      std::vector<float> values = params;
      values[7] = std::nextafter(values[7], 1.0f);  // one bit
      EXPECT_GE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    }
    H5Dclose(set);
    H5Fclose(file);
  };
  for (const char* dataset : {"params", "optimizer/v"}) {
    write_checkpoint(path, shape, params, "adam", state, TrainingProgress{}, "");
    EXPECT_EQ(read_checkpoint(path).params, params);
    tamper(dataset, false);
    try {
      read_checkpoint(path);
      ADD_FAILURE() << dataset << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("is damaged"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    tamper(dataset, true);
    EXPECT_NO_THROW(read_checkpoint(path)) << dataset << " without its checksum";
  }
  // Without a checksum the values must at least be numbers (a NaN loaded silently and predicted NaN); with
  // one, a run that diverged is read back as it was written.
  std::vector<float> diverged = params;
  diverged[5] = std::numeric_limits<float>::quiet_NaN();
  write_checkpoint(path, shape, diverged, "adam", state, TrainingProgress{}, "");
  EXPECT_TRUE(std::isnan(read_checkpoint(path).params[5]));
  tamper("params", true);
  expect_user_error([&] { read_checkpoint(path); }, {path, "params", "not finite"});
}

TEST(Checkpoint, ForeignFilesAreUserErrors) {
  TempDir dir;
  EXPECT_THROW(read_checkpoint(dir.file("missing.h5")), UserError);
  const std::string text = write_text(dir, "text.h5", "not hdf5");
  try {
    read_checkpoint(text);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos);
  }
}

}  // namespace
}  // namespace ddp::engine

// The epoch's metrics and their JSON lines, and the parameters' checksum (engine/metrics.h); the process's
// age (engine/base/process_age.h), which start_to_first_step_s reads.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/json.h"
#include "engine/base/process_age.h"
#include "engine/metrics.h"

namespace ddp::engine {
namespace {

TEST(Metrics, EpochLineAndJson) {
  EpochMetrics m;
  m.epoch = 3;
  m.epochs = 15;
  m.steps = 782;
  m.epoch_time_s = 18.23;
  m.step_time_ms = 0.73;
  m.loss = 0.2127;
  m.acc = 0.9186;
  m.val_loss = 0.4426;
  m.val_acc = 0.8319;
  m.world_size = 2;
  m.backend = "mpi";
  EXPECT_EQ(format_epoch_line(m),
            "Epoch 3/15 - 782 steps - 18.2s - 0.73ms/step - loss: 0.2127 - acc: 0.9186 - val_loss: 0.4426 - "
            "val_acc: 0.8319");
  const nlohmann::json line = nlohmann::json::parse(to_json(m));
  EXPECT_EQ(line["epoch"], 3);
  EXPECT_EQ(line["loss"], 0.2127);
  EXPECT_EQ(line["acc"], 0.9186);
  EXPECT_EQ(line["val_loss"], 0.4426);
  EXPECT_EQ(line["val_acc"], 0.8319);
  EXPECT_EQ(line["epoch_time_s"], 18.23);
  EXPECT_EQ(line["step_time_ms"], 0.73);
  EXPECT_TRUE(line.contains("samples_per_s"));
  EXPECT_EQ(line["world_size"], 2);
  EXPECT_EQ(line["backend"], "mpi");
  EXPECT_FALSE(line.contains("gpu_util"));
  EXPECT_FALSE(line.contains("not_finite"));
  EXPECT_FALSE(line.contains("start_to_first_step_s")) << "only the process's first epoch says it";
  m.start_to_first_step_s = 2.25;
  EXPECT_EQ(nlohmann::json::parse(to_json(m))["start_to_first_step_s"], 2.25);
  EXPECT_FALSE(line.contains("loss_scale")) << "only where fp16 scales the loss";
  m.loss_scale = 32768;
  m.skipped_steps = 3;
  const nlohmann::json fp16 = nlohmann::json::parse(to_json(m));
  EXPECT_EQ(fp16["loss_scale"], 32768);
  EXPECT_EQ(fp16["skipped_steps"], 3);
}

// The process's age counts from its exec: more than this test's own time, and growing with the clock.
TEST(ProcessAge, CountsFromTheProcesssStartAndGrowsWithTheClock) {
  const auto test_start = std::chrono::steady_clock::now();
  const double before = seconds_since_process_start();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const double after = seconds_since_process_start();
  const double slept = std::chrono::duration<double>(std::chrono::steady_clock::now() - test_start).count();
  EXPECT_GT(before, 0.0);
  // /proc's start time is in clock ticks (10 ms): the difference of two readings is exact to the clock's.
  EXPECT_NEAR(after - before, slept, 0.02);
  EXPECT_LT(after, 24 * 3600.0) << "a day: not this process's age";
}

// JSON has no NaN: a diverged loss is null, and "not_finite" says what it was, so the curves read it back.
TEST(Metrics, ADivergedLossIsNullAndSaysWhy) {
  EpochMetrics m;
  m.epoch = 2;
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.val_loss = std::numeric_limits<double>::infinity();
  const std::string text = to_json(m);
  EXPECT_EQ(text.find("nan"), text.find("\"nan\"") + 1) << "only as a string: " << text;
  const nlohmann::json line = nlohmann::json::parse(text);
  EXPECT_TRUE(line["loss"].is_null());
  EXPECT_TRUE(line["val_loss"].is_null());
  EXPECT_EQ(line["not_finite"], (nlohmann::json{{"loss", "nan"}, {"val_loss", "inf"}}));
  EXPECT_TRUE(std::isnan(json::number_at(line, "loss")));
  EXPECT_EQ(json::number_at(line, "val_loss"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(json::number_at(line, "acc"), 0.0);
  EXPECT_TRUE(std::isnan(json::number_at(line, "no such key")));
  // On the console too, a NaN with its sign bit set (as a diverged sum often is) reads "nan", not "-nan".
  m.loss = -std::numeric_limits<double>::quiet_NaN();
  const std::string console = format_epoch_line(m);
  EXPECT_NE(console.find("- loss: nan -"), std::string::npos) << console;
  EXPECT_EQ(console.find("-nan"), std::string::npos) << console;
}

TEST(Metrics, SayWhichRunWhenAndOnWhatRows) {
  EpochMetrics m;
  m.run_id = "20261123T204512Z-3f9a";
  m.time = "2026-11-23T20:45:12Z";
  m.epoch = 2;
  m.epochs = 3;
  m.steps = 300;
  m.steps_run = 200;  // resumed at step 100
  m.epoch_time_s = 7.0;
  m.step_time_ms = 35.0;
  m.held_out = "test";  // data.validation = test
  const std::string line = format_epoch_line(m);
  EXPECT_NE(line.find("300 steps (200 after resuming)"), std::string::npos) << line;
  EXPECT_NE(line.find("test_loss: "), std::string::npos) << line;
  EXPECT_EQ(line.find("val_"), std::string::npos) << line;
  const nlohmann::json json_line = nlohmann::json::parse(to_json(m));
  EXPECT_EQ(json_line["run_id"], "20261123T204512Z-3f9a");
  EXPECT_EQ(json_line["time"], "2026-11-23T20:45:12Z");
  EXPECT_EQ(json_line["steps_run"], 200);
  EXPECT_TRUE(json_line.contains("test_loss") && json_line.contains("test_acc")) << json_line;
  EXPECT_FALSE(json_line.contains("val_loss")) << json_line;

  TestMetrics t;
  t.run_id = m.run_id;
  t.best_epoch = 4;
  t.test_loss = 0.35714;
  t.test_acc = 0.84681;
  t.samples = 25000;
  EXPECT_EQ(format_test_line(t),
            "Test (best.h5, epoch 4) - test_loss: 0.3571 - test_acc: 0.8468 (25000 samples)");
  const nlohmann::json test_line = nlohmann::json::parse(to_json(t));
  EXPECT_EQ(test_line["event"], "test");
  EXPECT_EQ(test_line["test_loss"], 0.35714);
  EXPECT_FALSE(test_line.contains("epoch")) << "curves would take it for an epoch";
}

// The epoch's parameter checksum tells replicas apart by a single bit (0.0 and -0.0 too), and names the
// first rank that differs from rank 0.
TEST(ParametersChecksum, DiffersInOneBitAndNamesTheFirstOtherRank) {
  std::vector<float> params{0.5f, -1.25f, 0.0f, 3e-8f};
  const std::string checksum = parameters_checksum(params);
  EXPECT_EQ(checksum.size(), 16u);
  EXPECT_EQ(parameters_checksum(std::vector<float>(params)), checksum);
  std::vector<float> other = params;
  other[2] = -0.0f;
  EXPECT_NE(parameters_checksum(other), checksum);
  other = params;
  other[3] = std::nextafter(other[3], 1.0f);
  EXPECT_NE(parameters_checksum(other), checksum);
  EXPECT_EQ(first_other_checksum({checksum, checksum, checksum}), std::nullopt);
  EXPECT_EQ(first_other_checksum({checksum, checksum, "x", "y"}), std::optional<std::size_t>(2));
  EXPECT_EQ(first_other_checksum({checksum}), std::nullopt);
}

}  // namespace
}  // namespace ddp::engine

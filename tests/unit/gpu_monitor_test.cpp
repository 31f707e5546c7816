// The GPU monitor: without NVML it declines to start and says why; its arithmetic (mean utilization, peak
// memory between two take()s) and its thread, tested with an injected reader instead of NVML.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "engine/gpu_monitor.h"

namespace ddp::engine {
namespace {

using std::chrono::milliseconds;

// Polls `done` for at most 10 s.
template <typename Predicate>
bool wait_until(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(GpuMonitor, WithoutNvmlDoesNotStartAndSaysWhy) {
  if (void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL)) {
    dlclose(nvml);
    GTEST_SKIP() << "NVML is installed on this machine, so the monitor would start";
  }
  std::string why;
  EXPECT_EQ(GpuMonitor::start("0000:3b:00.0", &why), nullptr);
  EXPECT_NE(why.find("NVML"), std::string::npos) << why;
  EXPECT_EQ(GpuMonitor::start("0000:3b:00.0", nullptr), nullptr);  // the reason is optional
}

TEST(GpuMonitor, WithoutBusIdDoesNotStart) {
  std::string why;
  EXPECT_EQ(GpuMonitor::start("", &why), nullptr);
  EXPECT_FALSE(why.empty());
}

TEST(GpuSampleAccumulator, MeanUtilizationPeakMemoryThenStartsOver) {
  GpuSampleAccumulator accumulator;
  accumulator.add({10, 100, 1000});
  accumulator.add({20, 300, 1000});
  accumulator.add({60, 200, 1000});
  const GpuSample sample = accumulator.take();
  EXPECT_EQ(sample.readings, 3);
  EXPECT_DOUBLE_EQ(sample.utilization_percent, 30);
  EXPECT_DOUBLE_EQ(sample.memory_used_mib, 300);
  EXPECT_DOUBLE_EQ(sample.memory_total_mib, 1000);

  const GpuSample empty = accumulator.take();
  EXPECT_EQ(empty.readings, 0);
  EXPECT_EQ(empty.utilization_percent, 0);
  EXPECT_EQ(empty.memory_used_mib, 0);

  accumulator.add({5, 50, 1000});
  const GpuSample next = accumulator.take();
  EXPECT_EQ(next.readings, 1);
  EXPECT_DOUBLE_EQ(next.utilization_percent, 5);
  EXPECT_DOUBLE_EQ(next.memory_used_mib, 50);  // the earlier peak does not carry over
}

// Reading k (1, 2, 3, ...) reports utilization k % and 10 k MiB, so a window of consecutive readings
// n+1..m has mean utilization (n+1+m)/2 and peak memory 10 m.
TEST(GpuMonitor, SamplesOnItsThreadAndSummarizesEachWindow) {
  std::atomic<int> calls{0};
  std::atomic<bool> released{false};
  {
    GpuMonitor monitor(
        [&]() -> std::optional<GpuReading> {
          const int k = ++calls;
          return GpuReading{static_cast<double>(k), 10.0 * k, 4096};
        },
        milliseconds(2), [&] { released = true; });
    ASSERT_TRUE(wait_until([&] { return calls >= 5; }));
    const GpuSample first = monitor.take();
    ASSERT_GE(first.readings, 5);
    const double n = first.memory_used_mib / 10;  // readings 1..n
    EXPECT_DOUBLE_EQ(n, first.readings);
    EXPECT_DOUBLE_EQ(first.utilization_percent, (1 + n) / 2);
    EXPECT_DOUBLE_EQ(first.memory_total_mib, 4096);

    ASSERT_TRUE(wait_until([&] { return calls >= n + 5; }));
    const GpuSample second = monitor.take();
    ASSERT_GE(second.readings, 1);
    const double m = second.memory_used_mib / 10;  // readings n+1..m
    EXPECT_DOUBLE_EQ(m - n, second.readings);
    EXPECT_DOUBLE_EQ(second.utilization_percent, (n + 1 + m) / 2);
    EXPECT_FALSE(released);
  }
  EXPECT_TRUE(released);  // once the thread has stopped
  const int after = calls;
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(calls, after);  // and it samples no more
}

TEST(GpuMonitor, FailedReadsAreLeftOut) {
  std::atomic<int> calls{0};
  GpuMonitor monitor(
      [&]() -> std::optional<GpuReading> {
        const int k = ++calls;
        if (k % 2 == 0) return std::nullopt;
        return GpuReading{50, 100, 200};
      },
      milliseconds(1));
  ASSERT_TRUE(wait_until([&] { return calls >= 10; }));
  const GpuSample sample = monitor.take();
  EXPECT_GE(sample.readings, 4);
  EXPECT_LE(sample.readings, (calls + 1) / 2);
  EXPECT_DOUBLE_EQ(sample.utilization_percent, 50);
}

// An epoch shorter than the period still gets a value: take() reads once itself. The long period also
// shows that stopping does not wait for it (or the test's timeout ends it).
TEST(GpuMonitor, TakeReadsOnceWhenNoReadingSinceLastTake) {
  std::atomic<int> calls{0};
  {
    GpuMonitor monitor(
        [&]() -> std::optional<GpuReading> {
          const int k = ++calls;
          return GpuReading{static_cast<double>(k), 1, 2};
        },
        std::chrono::hours(1));
    ASSERT_TRUE(wait_until([&] { return calls >= 1; }));  // the thread's first reading
    const GpuSample first = monitor.take();
    EXPECT_EQ(first.readings, 1);
    EXPECT_DOUBLE_EQ(first.utilization_percent, 1);
    const GpuSample second = monitor.take();
    EXPECT_EQ(second.readings, 1);
    EXPECT_DOUBLE_EQ(second.utilization_percent, 2);  // a fresh reading, not the old one
    EXPECT_EQ(calls, 2);
  }
}

}  // namespace
}  // namespace ddp::engine

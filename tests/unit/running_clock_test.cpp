// The clock that leaves out the time a process was stopped (engine/base/running_clock.h).
#include <gtest/gtest.h>

#include <chrono>

#include "engine/base/running_clock.h"

namespace ddp::engine {
namespace {

// A wake far later than the sleep asked for is time the process was stopped: the running clock leaves it
// out, so a job stopped and continued finds no silence in it. A scheduler's delay is no stop.
TEST(RunningClock, LeavesOutTheSpellsAProcessWasStopped) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  const RunningClock::duration before = RunningClock::stopped_total();
  EXPECT_EQ(RunningClock::note_wake(seconds(1), milliseconds(1400)), RunningClock::duration::zero());
  EXPECT_EQ(RunningClock::stopped_total(), before);
  EXPECT_EQ(RunningClock::note_wake(seconds(1), seconds(4)), seconds(3));
  EXPECT_EQ(RunningClock::stopped_total() - before, seconds(3));
  const auto running = RunningClock::now().time_since_epoch();
  EXPECT_GE(std::chrono::steady_clock::now().time_since_epoch() - running, seconds(3));
}

}  // namespace
}  // namespace ddp::engine

// The stall watchdog (engine/watchdog.h): when it calls the handler, and what its message says.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/optimizer/optimizer.h"
#include "engine/run_start.h"
#include "engine/self_check.h"
#include "engine/watchdog.h"
#include "models/initializers.h"
#include "models/replica.h"

namespace ddp::engine {
namespace {

// The watchdog's judgement on a clock the test steps: no test waits for real time to pass.
class ManualClock {
 public:
  ProgressWatchdog::Now now() {
    return [this] { return time_; };
  }
  void advance(double seconds) {
    time_ +=
        std::chrono::duration_cast<ProgressWatchdog::Clock::duration>(std::chrono::duration<double>(seconds));
  }

 private:
  ProgressWatchdog::Clock::time_point time_{std::chrono::hours(1000)};
};

// The stall handler is called once no beat came for the timeout, with the last step in its message, and
// only once.
TEST(ProgressWatchdog, CallsTheHandlerWhenBeatsStop) {
  ManualClock clock;
  std::vector<std::string> reasons;
  auto watchdog = ProgressWatchdog::without_thread(0.2, clock.now(),
                                                   [&](const std::string& why) { reasons.push_back(why); });
  watchdog->enter("training");
  watchdog->beat(41);
  clock.advance(0.1);
  watchdog->beat(42);
  clock.advance(0.19);
  EXPECT_FALSE(watchdog->check());
  clock.advance(0.01);
  EXPECT_TRUE(watchdog->check());
  clock.advance(1.0);
  EXPECT_FALSE(watchdog->check());
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(
      reasons[0].find("no progress for 0.2 s (comm.timeout_s 0.2) while training (steps done: 42): a rank "
                      "is hung or lost"),
      0u)
      << reasons[0];
}

// Start-up work that proceeds is no stall, however long it takes in all: the initial parameters (orthogonal
// matrices take seconds at large hidden sizes) and the GPU self-check tell the watchdog as each piece is
// done. Here each piece takes 0.4 of the timeout on the watchdog's clock, the pieces many timeouts together,
// and the watchdog stays quiet; the same silence without a word of the work is a stall.
TEST(ProgressWatchdog, StartUpWorkThatProceedsIsNoStall) {
  ManualClock clock;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++stalls; });
  int pieces = 0;
  const auto piece_done = [&] {
    clock.advance(0.4);
    watchdog->proceed();
    ++pieces;
    EXPECT_FALSE(watchdog->check()) << "after piece " << pieces;
  };
  watchdog->enter("drawing the initial parameters");
  const models::ParamLayout layout({100, 16, 320, 2});
  std::vector<float> params(layout.total_size());
  models::initialize_keras(layout, params, 1, piece_done);
  EXPECT_GE(pieces, 2 * (320 / 32));  // at least one per block of 32 columns of each orthogonal matrix
  watchdog->enter("preparing the batch shapes and the GPU self-check");
  const int before = pieces;
  auto replica = models::make_cpu_replica({100, 8, 8, 2});
  const std::vector<std::pair<int, int>> shapes{{16, 20}, {5, 20}};
  EXPECT_TRUE(check_gpu_replica(*replica, 0, shapes, optim::OptimizerSettings{}, 1, {}, piece_done).ok);
  EXPECT_EQ(pieces - before, 5);
  EXPECT_EQ(stalls, 0);
  clock.advance(1.0);
  EXPECT_TRUE(watchdog->check());
  EXPECT_EQ(stalls, 1);
}

// A pause (the exchange's own deadlines) outlives work done within it: proceed() does not end it.
TEST(ProgressWatchdog, ProceedLeavesAPauseAsItIs) {
  ManualClock clock;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++stalls; });
  watchdog->pause();
  watchdog->proceed();
  clock.advance(5.0);
  EXPECT_FALSE(watchdog->check());
  EXPECT_EQ(stalls, 0);
}

// File work of a known size (rank 0 writing a checkpoint while the others wait) gets patience sized to its
// bytes on top of the timeout, until the next phase or step; a stall past it names the allowance.
TEST(ProgressWatchdog, FileWorkOfAKnownSizeIsWaitedForUntilTheNextStep) {
  ManualClock clock;
  std::string reason;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string& why) {
    reason = why;
    ++stalls;
  });
  watchdog->enter("waiting for rank 0 writing last.h5");
  expect_file_work(*watchdog, "rank 0 writing last.h5", 50'000'000);  // 5 s at the slowest storage
  clock.advance(5.9);
  EXPECT_FALSE(watchdog->check()) << reason;
  watchdog->beat(7);  // the step after: the allowance is spent
  clock.advance(1.1);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find("(comm.timeout_s 1) while"), std::string::npos) << reason;

  auto second =
      ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string& why) { reason = why; });
  expect_file_work(*second, "rank 0 writing last.h5", 50'000'000);
  clock.advance(6.1);
  ASSERT_TRUE(second->check());
  EXPECT_NE(reason.find("(comm.timeout_s 1 + 5.0 s for rank 0 writing last.h5 (50.0 MB)) while"),
            std::string::npos)
      << reason;

  auto third =
      ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string& why) { reason = why; });
  expect_file_work(*third, "its files", 50'000'000);
  third->enter("training");  // a new phase: the allowance is spent
  clock.advance(1.1);
  EXPECT_TRUE(third->check());
}

// Before the first step (a collective of start-up waiting for a hung rank) the message names the phase.
TEST(ProgressWatchdog, NamesThePhaseItStalledIn) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->enter("reading data.path /frozen/imdb.h5");
  clock.advance(0.5);
  ASSERT_TRUE(watchdog->check());
  EXPECT_EQ(reason.find("no progress for 0.5 s"), 0u) << reason;
  EXPECT_NE(reason.find(" while reading data.path /frozen/imdb.h5: a rank is hung"), std::string::npos)
      << reason;
  EXPECT_EQ(reason.find("steps done"), std::string::npos) << reason;
}

// The other ranks' words (comm/stall_census.h) replace the guess at the end of the message.
TEST(ProgressWatchdog, TheSurveysWordsNameTheRank) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->set_stall_survey([&](const std::string& phase, int64_t steps_done) {
    return phase + " after " + std::to_string(steps_done) + ": rank 9 is gone";
  });
  watchdog->enter("training");
  watchdog->beat(7);
  clock.advance(0.3);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find(" while training (steps done: 7): training after 7: rank 9 is gone"),
            std::string::npos)
      << reason;
  EXPECT_EQ(reason.find("a rank is hung"), std::string::npos) << reason;
}

// What the rank knows it is stuck in (a file read that does not return) ends the message.
TEST(ProgressWatchdog, TheRanksOwnDetailEndsTheMessage) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->set_stall_survey([](const std::string&, int64_t) { return "rank 1 is hung"; });
  watchdog->set_stall_detail([] { return "this rank has been reading /frozen/imdb.h5 for 0.5 s"; });
  watchdog->enter("reading data.path /frozen/imdb.h5");
  clock.advance(0.5);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find(": rank 1 is hung; this rank has been reading /frozen/imdb.h5 for 0.5 s"),
            std::string::npos)
      << reason;
}

// Paused (the parameter server's deadlines hold), it lets any silence pass; the next phase arms it again,
// with a fresh timeout.
TEST(ProgressWatchdog, JudgesNothingWhilePausedAndWatchesAgainFromTheNextPhase) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->pause();
  clock.advance(60);
  EXPECT_FALSE(watchdog->check());
  watchdog->enter("gathering the start-up log");
  clock.advance(0.1);
  EXPECT_FALSE(watchdog->check());
  clock.advance(0.1);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find("while gathering the start-up log"), std::string::npos) << reason;
}

// Beats that keep coming, each within the timeout, keep it quiet however long the run.
TEST(ProgressWatchdog, StaysQuietWhileBeatsCome) {
  ManualClock clock;
  int calls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++calls; });
  for (int step = 1; step <= 1000; ++step) {  // 900 s of beats, 0.9 s apart
    clock.advance(0.9);
    EXPECT_FALSE(watchdog->check());
    watchdog->beat(step);
  }
  EXPECT_EQ(calls, 0);
}

// An error the health check reports ends the run at the next check, long before the timeout, even while
// beats keep coming.
TEST(ProgressWatchdog, EndsAtOnceOnAnErrorTheHealthCheckReports) {
  ManualClock clock;
  std::string reason;
  bool broken = false;
  auto watchdog = ProgressWatchdog::without_thread(
      60.0, clock.now(), [&](const std::string& why) { reason = why; },
      [&]() -> std::optional<std::string> {
        if (broken) return std::string("NCCL asynchronous error: remote process exited");
        return std::nullopt;
      });
  watchdog->beat(7);
  EXPECT_FALSE(watchdog->check());
  broken = true;
  watchdog->beat(8);
  ASSERT_TRUE(watchdog->check());
  EXPECT_EQ(reason, "NCCL asynchronous error: remote process exited");
}

// Once set_health_check returns, the old check is neither running nor called again: the trainer clears it
// before the communicator it asks goes away. A check in progress holds the replacement back until it ends.
TEST(ProgressWatchdog, NeverCallsAHealthCheckAfterItIsReplaced) {
  ManualClock clock;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [](const std::string&) {});
  std::mutex mutex;
  std::condition_variable changed;
  bool inside = false;
  bool release = false;
  std::atomic<bool> replaced{false};
  int calls_after_replacement = 0;
  watchdog->set_health_check([&]() -> std::optional<std::string> {
    std::unique_lock<std::mutex> lock(mutex);
    if (replaced) ++calls_after_replacement;
    inside = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
    if (replaced) ++calls_after_replacement;
    return std::nullopt;
  });
  std::thread checking([&] { watchdog->check(); });
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return inside; });
  }
  std::thread replacing([&] {
    watchdog->set_health_check({});
    replaced = true;
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  changed.notify_all();
  checking.join();
  replacing.join();
  EXPECT_FALSE(watchdog->check());
  EXPECT_EQ(calls_after_replacement, 0);
}

// The real thing: its own thread notices the silence (here a millisecond) without anyone calling check().
TEST(ProgressWatchdog, ItsThreadCallsTheHandler) {
  std::mutex mutex;
  std::condition_variable called;
  std::string reason;
  ProgressWatchdog watchdog(0.001, [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    reason = why;
    called.notify_all();
  });
  watchdog.enter("training");
  std::unique_lock<std::mutex> lock(mutex);
  ASSERT_TRUE(called.wait_for(lock, std::chrono::seconds(30), [&] { return !reason.empty(); }))
      << "the handler was not called";
  // Not which phase: with a 1 ms timeout the thread may fire before enter() names one (the phase in the
  // reason is checked with a clock the test drives).
  EXPECT_NE(reason.find("no progress for"), std::string::npos) << reason;
}

// A rank that has drawn the initial parameters waits for the other ranks' draws of the same ones in the
// collective that follows, silently: twice its own draw's time is allowed for that on top of the timeout
// (under load rank 0's draw ended seconds after rank 1's, whose watchdog called that wait a hang). Beyond
// the allowance the silence is a stall again.
TEST(ProgressWatchdog, TheWaitForTheOtherRanksDrawsIsAllowedTwiceThisRanksDraw) {
  ManualClock clock;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(0.5, clock.now(), [&](const std::string&) { ++stalls; });
  watchdog->enter("drawing the initial parameters");
  models::ModelShape shape{2000, 64, 256, 2};
  const models::ParamLayout layout(shape);
  InitialParameters initial(layout, 7, *watchdog, 1);
  EXPECT_EQ(initial.take().size(), layout.total_size());
  const double draw = initial.draw_seconds();
  ASSERT_GT(draw, 0.0);
  clock.advance(0.5 + 1.9 * draw);
  EXPECT_FALSE(watchdog->check()) << "within the timeout and twice the draw (" << draw << " s)";
  clock.advance(0.2 * draw);
  EXPECT_TRUE(watchdog->check());
  EXPECT_EQ(stalls, 1);
}

}  // namespace
}  // namespace ddp::engine

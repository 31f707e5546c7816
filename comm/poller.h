// Paces a loop that polls MPI requests (MPI_Test*) instead of blocking in them, so that every wait can be
// checked against a deadline and a lost rank named instead of waited for forever.
//
// Right after progress the loop only yields the core, for kSpin: a reply is usually about to land, and on an
// oversubscribed node the yield lets the ranks that compute run. After that it sleeps, from kMinSleep
// doubling up to the larger of kMaxSleep and 1% of the time waited so far (never above kMaxLongSleep): the
// delay a sleep adds to a wait stays near 1% of it, and a rank idle for long (a server while workers
// evaluate) wakes rarely. On the quickstart it made a parameter-server step a third shorter than plain
// sleeps (benchmarks/RESULTS.md, "Poll pacing").
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <span>
#include <string>

#include "engine/base/running_clock.h"

namespace ddp::comm {

class Poller {
 public:
  // `confirm_spell`: how long a deadline must stay past before confirm_overdue() says so (tests shorten it).
  explicit Poller(std::chrono::milliseconds confirm_spell = kConfirmSpell);
  // Nothing arrived: yield or sleep before the next poll.
  void idle();
  // Something arrived: the next waits start short again.
  void progressed();
  // True once `past_deadline` has held on kConfirmPolls polls in a row and for the confirm spell: a rank that
  // was itself stalled (descheduled, stopped) first drains what arrived meanwhile before it blames another,
  // and a deadline on the RunningClock sees the stopped spell left out once the watchdog's thread noticed it.
  bool confirm_overdue(bool past_deadline);

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSpin{300};
  static constexpr std::chrono::microseconds kMinSleep{10};
  static constexpr std::chrono::microseconds kMaxSleep{50};
  static constexpr std::chrono::microseconds kMaxLongSleep{1000};
  static constexpr int kConfirmPolls = 8;
  // The watchdog's longest sleep and the slack after which it notices that this process was stopped.
  static constexpr std::chrono::milliseconds kConfirmSpell{1500};

  Clock::time_point waiting_since_;
  std::chrono::microseconds sleep_ = kMinSleep;
  const std::chrono::milliseconds confirm_spell_;
  int overdue_polls_ = 0;
  Clock::time_point overdue_since_{};
};

// Polls `requests` (MPI_Testall, paced by a Poller) until every one is complete. Once more than `timeout_s`
// of running time has passed since `since` (confirmed over several polls) it ends the job (ddp::fatal) with
// late_message(), which names what was waited for: the lost rank is named instead of waited for forever.
void wait_or_fatal(std::span<MPI_Request> requests, RunningClock::time_point since, double timeout_s,
                   const std::function<std::string()>& late_message);

}  // namespace ddp::comm

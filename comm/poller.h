// Paces a loop that polls MPI requests (MPI_Test*) instead of blocking in them, so that every wait can be
// checked against a deadline and a lost rank named instead of waited for forever.
//
// Right after progress the loop only yields the core, for kSpin: a reply is usually about to land, and on an
// oversubscribed node the yield lets the ranks that compute run. After that it sleeps, from kMinSleep
// doubling up to the larger of kMaxSleep and 1% of the time waited so far (never above kMaxLongSleep): the
// delay a sleep adds to a wait stays near 1% of it, and a rank idle for long (a server while workers
// evaluate) wakes rarely. Measured on the quickstart (benchmarks/RESULTS.md): a parameter-server step went
// from 1.5 ms with plain 10-250 us sleeps to about 1.0 ms.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <span>
#include <string>

namespace ddp::comm {

class Poller {
 public:
  Poller();
  // Nothing arrived: yield or sleep before the next poll.
  void idle();
  // Something arrived: the next waits start short again.
  void progressed();
  // True once `past_deadline` has held on kConfirmPolls polls in a row: a rank that was itself stalled
  // (descheduled, stopped) first drains what arrived meanwhile before it blames another.
  bool confirm_overdue(bool past_deadline);

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kSpin{300};
  static constexpr std::chrono::microseconds kMinSleep{10};
  static constexpr std::chrono::microseconds kMaxSleep{50};
  static constexpr std::chrono::microseconds kMaxLongSleep{1000};
  static constexpr int kConfirmPolls = 8;

  Clock::time_point waiting_since_;
  std::chrono::microseconds sleep_ = kMinSleep;
  int overdue_polls_ = 0;
};

// Polls `requests` (MPI_Testall, paced by a Poller) until every one is complete. Once more than `timeout_s`
// has passed since `since` (confirmed over several polls) it ends the job (ddp::fatal) with late_message(),
// which names what was waited for: the lost rank is named instead of waited for forever.
void wait_or_fatal(std::span<MPI_Request> requests, std::chrono::steady_clock::time_point since,
                   double timeout_s, const std::function<std::string()>& late_message);

}  // namespace ddp::comm

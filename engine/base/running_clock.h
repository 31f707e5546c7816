// The time this process was running: the steady clock less the spells it was stopped (SIGSTOP or Ctrl-Z, a
// job suspended by `scontrol suspend`, a suspended virtual machine). The deadlines that judge other ranks
// (the watchdog's comm.timeout_s, the parameter server's) read it, so that a whole job stopped and continued
// does not find every rank silent for the time all of them were stopped, and end itself as hung.
//
// A spell is noticed by a thread that sleeps for known periods (the watchdog's): one that wakes later than it
// asked for, by more than kStoppedSlack, was not running meanwhile, and reports that time. A deadline that
// is found past should be confirmed a little later (kStoppedSlack and a period), once such a report had time
// to come: the thread that reads the clock may run before the one that notices.
#pragma once

#include <atomic>
#include <chrono>

namespace ddp {

struct RunningClock {
  using duration = std::chrono::steady_clock::duration;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<RunningClock>;
  static constexpr bool is_steady = true;

  static time_point now() noexcept {
    return time_point(std::chrono::steady_clock::now().time_since_epoch() - stopped_total());
  }

  // The stopped time noticed so far, in this process.
  static duration stopped_total() noexcept { return duration(stopped_.load(std::memory_order_relaxed)); }

  // A sleep of `asked` that returned after `took` (steady time): the part of `took` the process did not run,
  // if it is more than the slack a busy machine's scheduler explains, is added to stopped_total() and
  // returned; else zero.
  static duration note_wake(duration asked, duration took) noexcept {
    const duration late = took - asked;
    if (late <= kStoppedSlack) return duration::zero();
    stopped_.fetch_add(late.count(), std::memory_order_relaxed);
    return late;
  }

  // Later than this, a wake was no scheduler's delay: the process was stopped.
  static constexpr duration kStoppedSlack = std::chrono::milliseconds(500);

 private:
  static inline std::atomic<rep> stopped_{0};
};

}  // namespace ddp

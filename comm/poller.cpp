#include "comm/poller.h"

#include <sys/prctl.h>

#include <algorithm>
#include <thread>

#include "comm/mpi_check.h"
#include "engine/base/errors.h"

namespace ddp::comm {
namespace {

// Linux rounds a sleep up by the thread's timer slack (50 us by default), which would turn every short sleep
// of a poll loop into 60 us or more; a polling thread asks for 1 us instead. Best effort: on failure the
// sleeps are only longer.
void ask_for_fine_timer_slack() {
  thread_local const bool asked = [] {
    prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
    return true;
  }();
  (void)asked;
}

}  // namespace

Poller::Poller(std::chrono::milliseconds confirm_spell)
    : waiting_since_(Clock::now()), confirm_spell_(confirm_spell) {
  ask_for_fine_timer_slack();
}

void Poller::idle() {
  const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - waiting_since_);
  if (waited < kSpin) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  const auto cap = std::clamp(waited / 100, kMaxSleep, kMaxLongSleep);
  sleep_ = std::min(sleep_ * 2, cap);
}

void Poller::progressed() {
  waiting_since_ = Clock::now();
  sleep_ = kMinSleep;
  overdue_polls_ = 0;
}

bool Poller::confirm_overdue(bool past_deadline) {
  if (!past_deadline) {
    overdue_polls_ = 0;
    return false;
  }
  if (overdue_polls_++ == 0) overdue_since_ = Clock::now();
  return overdue_polls_ >= kConfirmPolls && Clock::now() - overdue_since_ >= confirm_spell_;
}

void wait_or_fatal(std::span<MPI_Request> requests, RunningClock::time_point since, double timeout_s,
                   const std::function<std::string()>& late_message) {
  Poller poller;
  for (int done = 0;;) {
    DDP_CHECK_MPI(
        MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) return;
    const double waited = std::chrono::duration<double>(RunningClock::now() - since).count();
    if (poller.confirm_overdue(waited > timeout_s)) DDP_FATAL(late_message());
    poller.idle();
  }
}

}  // namespace ddp::comm

#include "comm/poller.h"

#include <sys/prctl.h>

#include <algorithm>
#include <thread>

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

Poller::Poller() : waiting_since_(Clock::now()) {
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
  overdue_polls_ = past_deadline ? overdue_polls_ + 1 : 0;
  return overdue_polls_ >= kConfirmPolls;
}

}  // namespace ddp::comm

#include "engine/watchdog.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "engine/base/errors.h"
#include "engine/base/running_clock.h"
#include "engine/base/slow_storage.h"

namespace ddp::engine {

namespace {

// A year: longer than any run, and far from the overflow of the clock's 64-bit nanoseconds.
constexpr double kLongestTimeoutS = 365.0 * 24 * 3600;

void end_the_job(const std::string& reason) {
  DDP_FATAL(reason + "; ending the job (a checkpoint written before stays for --resume auto)");
}

}  // namespace

ProgressWatchdog::ProgressWatchdog(double timeout_s, StallHandler on_stall, HealthCheck health,
                                   std::string timeout_setting)
    : ProgressWatchdog(
          timeout_s, std::move(on_stall), std::move(health), std::move(timeout_setting),
          [] { return Clock::time_point(RunningClock::now().time_since_epoch()); },
          /*watch_in_thread=*/true) {}

std::unique_ptr<ProgressWatchdog> ProgressWatchdog::without_thread(double timeout_s, Now now,
                                                                   StallHandler on_stall,
                                                                   HealthCheck health) {
  return std::unique_ptr<ProgressWatchdog>(new ProgressWatchdog(
      timeout_s, std::move(on_stall), std::move(health), "comm.timeout_s", std::move(now),
      /*watch_in_thread=*/false));
}

ProgressWatchdog::ProgressWatchdog(double timeout_s, StallHandler on_stall, HealthCheck health,
                                   std::string timeout_setting, Now now, bool watch_in_thread)
    : timeout_(std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double>(std::min(timeout_s, kLongestTimeoutS)))),
      period_(
          std::clamp<Clock::duration>(timeout_ / 10, std::chrono::milliseconds(1), std::chrono::seconds(1))),
      timeout_setting_(std::move(timeout_setting)),
      on_stall_(on_stall ? std::move(on_stall) : end_the_job),
      now_(std::move(now)),
      last_progress_(now_().time_since_epoch().count()),
      health_(std::move(health)) {
  DDP_CHECK(timeout_s > 0);
  if (watch_in_thread) thread_ = std::thread([this] { watch(); });
}

ProgressWatchdog::~ProgressWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressWatchdog::enter(const std::string& phase) {
  std::lock_guard<std::mutex> lock(mutex_);
  phase_ = phase;
  paused_ = false;
  allowance_.store(0, std::memory_order_relaxed);
  mark_progress();
}

void ProgressWatchdog::beat(int64_t global_step) {
  last_step_.store(global_step, std::memory_order_relaxed);
  allowance_.store(0, std::memory_order_relaxed);
  mark_progress();
}

void expect_file_work(ProgressWatchdog& watchdog, const std::string& what, std::size_t bytes) {
  if (bytes == 0) return;
  std::ostringstream words;
  words << what << " (" << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / 1e6 << " MB)";
  watchdog.allow_silence(std::chrono::duration<double>(slowest_storage_seconds(bytes)), words.str());
}

void ProgressWatchdog::allow_silence(std::chrono::duration<double> extra, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  allowance_reason_ = why;
  allowance_.store(std::chrono::duration_cast<Clock::duration>(extra).count(), std::memory_order_relaxed);
  mark_progress();
}

void ProgressWatchdog::proceed() {
  mark_progress();
}

void ProgressWatchdog::mark_progress() {
  last_progress_.store(now_().time_since_epoch().count(), std::memory_order_relaxed);
}

void ProgressWatchdog::pause() {
  std::lock_guard<std::mutex> lock(mutex_);
  paused_ = true;
}

void ProgressWatchdog::set_health_check(HealthCheck health) {
  std::lock_guard<std::mutex> lock(mutex_);
  health_ = std::move(health);
}

void ProgressWatchdog::set_stall_survey(StallSurvey survey) {
  std::lock_guard<std::mutex> lock(mutex_);
  survey_ = std::move(survey);
}

void ProgressWatchdog::set_stall_answer(StallAnswer answer) {
  std::lock_guard<std::mutex> lock(mutex_);
  answer_ = std::move(answer);
}

void ProgressWatchdog::set_stall_detail(StallDetail detail) {
  std::lock_guard<std::mutex> lock(mutex_);
  detail_ = std::move(detail);
}

double ProgressWatchdog::timeout_s() const {
  return std::chrono::duration<double>(timeout_).count();
}

bool ProgressWatchdog::check() {
  std::unique_lock<std::mutex> lock(mutex_);
  return check_locked(lock);
}

bool ProgressWatchdog::check_locked(std::unique_lock<std::mutex>& lock) {
  if (stalled_) return false;
  std::optional<std::string> reason;
  if (health_) reason = health_();
  if (!reason && !paused_) {
    const Clock::time_point last{Clock::duration(last_progress_.load(std::memory_order_relaxed))};
    const auto silent = now_() - last;
    const Clock::duration allowance{allowance_.load(std::memory_order_relaxed)};
    if (silent >= timeout_ + allowance) {
      std::ostringstream text;
      text << "no progress for " << std::fixed << std::setprecision(1)
           << std::chrono::duration<double>(silent).count() << " s (" << timeout_setting_ << " "
           << std::defaultfloat << std::setprecision(6) << std::chrono::duration<double>(timeout_).count();
      if (allowance.count() > 0) {
        text << " + " << std::fixed << std::setprecision(1)
             << std::chrono::duration<double>(allowance).count() << " s for " << allowance_reason_;
      }
      text << ") while " << phase_;
      const int64_t step = last_step_.load(std::memory_order_relaxed);
      if (step > 0) text << " (steps done: " << step << ")";
      stalled_ = true;
      const std::string detail = detail_ ? detail_() : "";
      std::string survey_words;
      if (survey_) {
        const StallSurvey survey = survey_;
        const std::string phase = phase_;
        lock.unlock();
        survey_words = survey(phase, step);
        lock.lock();
      }
      text << ": "
           << (survey_words.empty() ? "a rank is hung or lost, this one or one it waits for in a collective"
                                    : survey_words);
      if (!detail.empty()) text << "; " << detail;
      reason = text.str();
    }
  }
  if (!reason) {
    if (answer_) {
      const Clock::time_point last{Clock::duration(last_progress_.load(std::memory_order_relaxed))};
      answer_(phase_, last_step_.load(std::memory_order_relaxed),
              std::chrono::duration<double>(now_() - last).count());
    }
    return false;
  }
  stalled_ = true;
  lock.unlock();
  on_stall_(*reason);  // the default handler ends the job and does not return
  lock.lock();
  return true;
}

void ProgressWatchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const auto asleep = std::chrono::steady_clock::now();
    if (wake_.wait_for(lock, period_, [this] { return stopping_; })) return;
    // Woken far later than asked: this process was stopped meanwhile, and that time is no one's silence.
    RunningClock::note_wake(period_, std::chrono::steady_clock::now() - asleep);
    if (check_locked(lock)) return;
  }
}

}  // namespace ddp::engine

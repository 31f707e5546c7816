// Ends a training run that has stopped making progress. A rank that dies is noticed by the launcher (mpirun
// and srun end the job); a rank that hangs while alive (a GPU kernel or NCCL waiting on a peer that will
// never come, a read from a frozen file system, a stopped process) leaves every other rank waiting in the
// next all-reduce, where MPI and NCCL wait forever. The trainer beats once per step and per evaluation batch;
// a thread of its own notices when no beat came for the timeout and calls the stall handler, which ends the
// job (MPI_Abort from that thread: the waiting thread may be blocked in MPI, CUDA or NCCL and never return).
// The timeout (comm.timeout_s) must therefore exceed the longest pause of a healthy run between two beats,
// such as rank 0 writing a checkpoint while the others wait.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ddp::engine {

class ProgressWatchdog {
 public:
  // Receives the one-line reason; in the trainer it does not return (fatal()).
  using StallHandler = std::function<void(const std::string& reason)>;
  // Asked at every check: an error that dooms the run before the timeout would show it (NCCL's
  // asynchronous error); nothing while all is well.
  using HealthCheck = std::function<std::optional<std::string>()>;

  // Starts watching now, as if a beat had just come. `timeout_s` > 0.
  ProgressWatchdog(double timeout_s, StallHandler on_stall, HealthCheck health = {});
  ~ProgressWatchdog();  // stops watching; the handler is not called after it returns
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  // Progress was made; `global_step` (the steps trained so far) goes into the message. Costs a clock read
  // and two relaxed stores.
  void beat(int64_t global_step);

 private:
  void watch();

  using Clock = std::chrono::steady_clock;
  const Clock::duration timeout_;
  const StallHandler on_stall_;
  const HealthCheck health_;
  std::atomic<Clock::rep> last_beat_;  // Clock ticks since its epoch
  std::atomic<int64_t> last_step_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mutex_
  std::thread thread_;
};

}  // namespace ddp::engine

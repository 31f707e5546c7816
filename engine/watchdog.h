// Ends a job that has stopped making progress. A rank that dies is noticed by the launcher (mpirun and srun
// end the job); a rank that hangs while alive (a GPU kernel or NCCL waiting on a peer that will never come,
// a read from a frozen file system, a stopped process) leaves every other rank waiting in the next
// collective, where MPI and NCCL wait forever. That holds during start-up too (the topology's
// MPI_Comm_split_type, NCCL's ncclCommInitRank, the checkpoint's broadcast) and at the end (MPI_Finalize's
// fence), so main() arms a watchdog before MPI_Init and keeps one until MPI_Finalize has returned. The ranks
// name what they are doing (enter: "reading data.path ...", "training"); while training they beat once per
// step and per evaluation batch. A thread of its own notices when no progress came for the timeout and calls
// the stall handler, which ends the job (MPI_Abort from that thread: the waiting thread may be blocked in
// MPI, CUDA, NCCL or a read and never return). The timeout (comm.timeout_s) must therefore exceed the longest
// pause of a healthy rank between two signs of progress; file work of a known size (rank 0 writing a
// checkpoint while the others wait) gets patience sized to its bytes on top (expect_file_work).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ddp::engine {

class ProgressWatchdog {
 public:
  // Receives the one-line reason. The default ends the job (fatal(): MPI_Abort), saying that the last
  // checkpoint stays, and does not return.
  using StallHandler = std::function<void(const std::string& reason)>;
  // Asked at every check: an error that dooms the run before the timeout would show it (NCCL's
  // asynchronous error); nothing while all is well.
  using HealthCheck = std::function<std::optional<std::string>()>;
  // Asked once, on a stall found by silence, with this rank's phase and steps done: what the other ranks
  // say about it (comm/stall_census.h), which replaces "a rank is hung or lost, ..." in the message; "" where
  // they say nothing. May block (while another rank speaks for the job).
  using StallSurvey = std::function<std::string(const std::string& phase, int64_t steps_done)>;
  // Asked at every check while this rank has not stalled, with its phase, steps done and seconds since its
  // last progress: answers the ranks that stalled (comm/stall_census.h), so that they blame only the ranks
  // that are gone or frozen, not one alive and waiting (on a peer, or with deadlines of its own).
  using StallAnswer = std::function<void(const std::string& phase, int64_t steps_done, double silent_s)>;
  // Asked once, on a stall found by silence: what this rank is stuck in, if it knows (a file read that does
  // not return); "" where nothing. Appended to the message.
  using StallDetail = std::function<std::string()>;
  using Clock = std::chrono::steady_clock;
  // Where the watchdog reads the time.
  using Now = std::function<Clock::time_point()>;

  // Starts watching now, in the phase "starting", as if progress had just been made: a thread of its own
  // checks ten times per timeout (at most once a second, at least once a millisecond), so a stall is
  // reported at most 10% late. Silence is measured on the RunningClock (engine/base/running_clock.h), whose
  // stopped spells this thread notices: a job stopped and continued (Ctrl-Z, a suspended Slurm job) is no
  // stall. `timeout_s` > 0; `timeout_setting` names where it came from, for the message.
  ProgressWatchdog(double timeout_s, StallHandler on_stall = {}, HealthCheck health = {},
                   std::string timeout_setting = "comm.timeout_s");
  // The same judgement without the thread, on the time `now` gives: checks happen when check() is called.
  // For tests, which step their own clock.
  static std::unique_ptr<ProgressWatchdog> without_thread(double timeout_s, Now now, StallHandler on_stall,
                                                          HealthCheck health = {});
  ~ProgressWatchdog();  // stops watching; the handler is not called after it returns
  ProgressWatchdog(const ProgressWatchdog&) = delete;
  ProgressWatchdog& operator=(const ProgressWatchdog&) = delete;

  // Starts a phase (what this rank does now, for the message: "reading the checkpoint"), which counts as
  // progress, and watches again after pause().
  void enter(const std::string& phase);
  // Progress was made within the phase; `global_step` (the steps trained so far) goes into the message.
  // Costs a clock read and two relaxed stores.
  void beat(int64_t global_step);
  // A piece of the phase's work was done (a tensor initialised, a shape tried, a chunk of the data file
  // checked): start-up work that proceeds is no stall, however long it takes in all. Leaves a pause as it is.
  void proceed();
  // Work of a known size lies ahead that gives no sign of progress (rank 0 reading or writing a checkpoint,
  // the other ranks waiting for it in the next collective): until this rank's next enter() or beat(),
  // silence up to the timeout plus `extra` is no stall; `why` names it in the message. Counts as progress.
  void allow_silence(std::chrono::duration<double> extra, const std::string& why);
  // Stops judging until the next enter(), while code with deadlines of its own waits (the parameter
  // server's protocol names the rank it waits for). The health check still runs.
  void pause();
  // Replaces the health check; once it returns, the previous one is not running and is not called again
  // (so it may refer to a communicator about to be destroyed).
  void set_health_check(HealthCheck health);
  // Sets the survey, once MPI can carry it.
  void set_stall_survey(StallSurvey survey);
  // Sets the answer, once MPI can carry it; once it returns, a previous answer is not running.
  void set_stall_answer(StallAnswer answer);
  void set_stall_detail(StallDetail detail);

  // One check, now: the health check, then (unless paused) the silence since the last progress against the
  // timeout. Calls the stall handler on the first problem found and returns true; it is called once at most
  // in the watchdog's life. Without a problem, answers the stalled ranks (set_stall_answer).
  bool check();

  double timeout_s() const;
  const std::string& timeout_setting() const { return timeout_setting_; }

 private:
  ProgressWatchdog(double timeout_s, StallHandler on_stall, HealthCheck health, std::string timeout_setting,
                   Now now, bool watch_in_thread);
  void watch();
  // check() with mutex_ held by `lock`, which it releases while the handler runs.
  bool check_locked(std::unique_lock<std::mutex>& lock);
  void mark_progress();

  const Clock::duration timeout_;
  const Clock::duration period_;  // between two checks of the watching thread
  const std::string timeout_setting_;
  const StallHandler on_stall_;
  const Now now_;
  std::atomic<Clock::rep> last_progress_;  // Clock ticks since its epoch
  std::atomic<int64_t> last_step_{0};
  std::atomic<Clock::rep> allowance_{0};  // allow_silence's extra, in Clock ticks; 0 after a beat()
  std::mutex mutex_;  // guards the members below; held by the watching thread while it checks
  std::condition_variable wake_;
  HealthCheck health_;
  StallSurvey survey_;
  StallAnswer answer_;
  StallDetail detail_;
  std::string phase_ = "starting";
  std::string allowance_reason_;  // allow_silence's `why`
  bool paused_ = false;
  bool stopping_ = false;
  bool stalled_ = false;  // the handler has been called
  std::thread thread_;
};

// Lets `watchdog` wait, beyond the timeout and until its next enter() or beat(), as long as `bytes` of file
// work take at the slowest storage a run should survive (a busy network file system); `what` names the work
// in a stall's message. Nothing for 0 bytes.
void expect_file_work(ProgressWatchdog& watchdog, const std::string& what, std::size_t bytes);

}  // namespace ddp::engine

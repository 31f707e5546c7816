#include "engine/preemption.h"

#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <vector>

#include "comm/host_group.h"
#include "engine/base/errors.h"

namespace ddp::engine {
namespace {

volatile std::sig_atomic_t received_signal = 0;

void write_stderr(const char* text) {
  // write() is async-signal-safe; stdio is not. Nothing to do if stderr is gone.
  [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, text, std::strlen(text));
}

extern "C" void on_stop_signal(int signal_number) {
  if (received_signal == 0) {
    received_signal = signal_number;
    if (signal_number == SIGINT) {
      write_stderr(
          "\nddptrain: SIGINT: writing a checkpoint at the next step, then stopping (Ctrl-C again aborts "
          "without one)\n");
    }
    return;
  }
  if (signal_number != SIGINT) return;
  // Ctrl-C while stopping: the user will not wait for the checkpoint. Dying of SIGINT (not exiting) tells the
  // shell that started us that it was interrupted. SIGINT is blocked in here, so the raised one arrives on
  // return.
  write_stderr("\nddptrain: SIGINT while stopping: aborting without a checkpoint\n");
  std::signal(SIGINT, SIG_DFL);
  std::raise(SIGINT);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  // SIGHUP: the terminal or ssh session that started a lone rank closed; its run is checkpointed, not lost.
  // SIGPIPE: what read a lone rank's output (`| head`, `| tee` in a closed session) went away; by default it
  // would end the process at its next line, with no checkpoint.
  for (int signal_number : {SIGINT, SIGTERM, SIGUSR1, SIGHUP, SIGPIPE}) {
    struct sigaction previous {};
    if (sigaction(signal_number, nullptr, &previous) != 0) DDP_FATAL("sigaction failed");
    // A shell starts background jobs with SIGINT ignored so that Ctrl-C reaches only the foreground job,
    // nohup ignores SIGHUP, and launchers may ignore SIGPIPE: what was set to be ignored stays ignored.
    if (signal_number != SIGTERM && signal_number != SIGUSR1 && previous.sa_handler == SIG_IGN) continue;
    if (sigaction(signal_number, &action, nullptr) != 0) DDP_FATAL("sigaction failed");
  }
}

std::string stop_signal_name(int signal_number) {
  switch (signal_number) {
    case 0:
      return "";
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGHUP:
      return "SIGHUP";
    case SIGPIPE:
      return "SIGPIPE";
    default:
      return "signal " + std::to_string(signal_number);
  }
}

std::string stop_signal_received() {
  return stop_signal_name(received_signal);
}

int stop_signal_number_received() {
  return received_signal;
}

void clear_stop_signal() {
  received_signal = 0;
}

StopAgreement::StopAgreement(const comm::HostGroup& group, int every_polls)
    : group_(group.duplicate()), every_polls_(every_polls) {
  DDP_CHECK(every_polls >= 1);
}

// Every rank posted the same questions, so the last one (pending_'s) completes on all of them.
StopAgreement::~StopAgreement() = default;

void StopAgreement::complete_pending() {
  if (!pending_.active()) return;
  const auto max = static_cast<int>(pending_.wait());
  if (max != 0) {
    stopped_ = true;
    agreed_ = max;
  }
}

void StopAgreement::relay(int signal_number) {
  relayed_ = std::max(relayed_, signal_number);
}

bool StopAgreement::poll() {
  if (++polls_ % every_polls_ != 0) return stopped_;
  complete_pending();
  if (stopped_) return true;
  pending_ = group_.start_max(std::max(stop_signal_number_received(), relayed_));
  return false;
}

bool StopAgreement::now() {
  complete_pending();
  if (stopped_) return true;
  std::vector<int64_t> max{std::max(stop_signal_number_received(), relayed_)};
  group_.max(max);
  if (max[0] != 0) {
    stopped_ = true;
    agreed_ = static_cast<int>(max[0]);
  }
  return stopped_;
}

}  // namespace ddp::engine

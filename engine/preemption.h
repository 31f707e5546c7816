// Stopping cleanly when asked: SIGINT (Ctrl-C), SIGTERM (the end of a time limit, scancel, mpirun passing on
// a Ctrl-C), SIGUSR1 (Slurm's --signal=B:USR1@120, forwarded to the ranks), SIGHUP (the terminal or ssh
// session of a rank run alone closed) or SIGPIPE (what read its output went away). The handler only sets a
// flag; the training ranks agree on it (and on which signal it was) at a step boundary, rank 0 writes
// last.h5, and every rank exits with kExitPreempted, so no rank leaves while another waits in a collective. A
// second SIGTERM, SIGUSR1, SIGHUP or SIGPIPE changes nothing; a second SIGINT ends the process at once, as
// Ctrl-C twice does elsewhere.
#pragma once

#include <cstdint>
#include <string>

#include "comm/host_group.h"

namespace ddp::engine {

// Installs the handler for SIGINT, SIGTERM, SIGUSR1, SIGHUP and SIGPIPE (SA_RESTART, so interrupted reads and
// writes go on; a write to a closed pipe fails with EPIPE instead of ending the process). A SIGINT, SIGHUP or
// SIGPIPE ignored by whoever started this process (a shell's background job, nohup) stays ignored.
void install_stop_signal_handlers();
// The signal this process received, "" if none ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP", "SIGPIPE").
std::string stop_signal_received();
// Its number, 0 if none.
int stop_signal_number_received();
// Forgets a received signal (for tests, which raise one and go on in the same process).
void clear_stop_signal();
// "SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP", "SIGPIPE", else "signal N"; "" for 0.
std::string stop_signal_name(int signal_number);

// The training ranks' agreement on a stop signal, over its own duplicate of `group` (so its collectives never
// mix with the gradient exchange or the group's). Every rank makes the same sequence of calls.
class StopAgreement {
 public:
  // Asks every `every_polls` polls: 1 where the ranks step together anyway; more where they run apart
  // (the asynchronous parameter server, whose workers may be comm.max_staleness steps apart: asking each
  // step would hold every rank within a step of the slowest).
  explicit StopAgreement(const comm::HostGroup& group, int every_polls = 1);
  ~StopAgreement();
  StopAgreement(const StopAgreement&) = delete;
  StopAgreement& operator=(const StopAgreement&) = delete;

  // After each step, without blocking the step: every `every_polls` calls returns the answer to the question
  // asked that many calls before (a non-blocking all-reduce that had as many steps to complete) and asks it
  // again; the calls between return the last answer. True on every rank at the same call once some rank has
  // received a signal.
  bool poll();
  // At an epoch boundary: the answer for this moment (completes the pending question, then asks anew and
  // waits).
  bool now();
  // A signal received on this rank's behalf by a process that is not among the ranks that agree (a dedicated
  // parameter server): the next poll() or now() asks as if this rank had received it (0: none).
  void relay(int signal_number);
  // Whether a poll() or now() said stop.
  bool stopped() const { return stopped_; }
  // The signal that stopped the ranks ("SIGTERM", ...), the same on every rank (the highest signal number
  // among those the ranks had received when they agreed), "" if none.
  std::string signal_name() const { return stop_signal_name(agreed_); }
  int signal_number() const { return agreed_; }

 private:
  void complete_pending();

  comm::HostGroup group_;
  // Declared after group_, so that it goes first: the last question is waited for before the group goes.
  comm::PendingMax pending_;
  const int every_polls_;
  int64_t polls_ = 0;
  int relayed_ = 0;  // the highest signal relay() was given
  int agreed_ = 0;   // max_ of the answer that said stop
  bool stopped_ = false;
};

}  // namespace ddp::engine

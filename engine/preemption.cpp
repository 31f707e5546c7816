#include "engine/preemption.h"

#include <csignal>

#include "comm/mpi_check.h"

namespace ddp::engine {
namespace {

volatile std::sig_atomic_t received_signal = 0;

extern "C" void on_stop_signal(int signal_number) {
  if (received_signal == 0) received_signal = signal_number;
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal_number : {SIGUSR1, SIGTERM}) {
    if (sigaction(signal_number, &action, nullptr) != 0) DDP_FATAL("sigaction failed");
  }
}

std::string stop_signal_received() {
  switch (received_signal) {
    case 0:
      return "";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    default:
      return "signal " + std::to_string(received_signal);
  }
}

void clear_stop_signal() {
  received_signal = 0;
}

std::string StopAgreement::signal_name() const {
  return stopped_ ? stop_signal_received() : "";
}

StopAgreement::StopAgreement(MPI_Comm comm) {
  DDP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
}

StopAgreement::~StopAgreement() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Every rank posted the same questions, so the last one completes on all of them.
  if (pending_ != MPI_REQUEST_NULL) MPI_Wait(&pending_, MPI_STATUS_IGNORE);
  MPI_Comm_free(&comm_);
}

void StopAgreement::complete_pending() {
  if (pending_ == MPI_REQUEST_NULL) return;
  DDP_CHECK_MPI(MPI_Wait(&pending_, MPI_STATUS_IGNORE));
  if (any_ != 0) stopped_ = true;
}

bool StopAgreement::poll() {
  complete_pending();
  if (stopped_) return true;
  local_ = received_signal != 0 ? 1 : 0;
  DDP_CHECK_MPI(MPI_Iallreduce(&local_, &any_, 1, MPI_INT, MPI_MAX, comm_, &pending_));
  return false;
}

bool StopAgreement::now() {
  complete_pending();
  if (stopped_) return true;
  local_ = received_signal != 0 ? 1 : 0;
  DDP_CHECK_MPI(MPI_Allreduce(&local_, &any_, 1, MPI_INT, MPI_MAX, comm_));
  stopped_ = any_ != 0;
  return stopped_;
}

}  // namespace ddp::engine

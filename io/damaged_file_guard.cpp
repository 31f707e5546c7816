#include "io/damaged_file_guard.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "engine/base/errors.h"

namespace ddp::io {
namespace {

constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS};

// Initial-exec thread-local storage (this code links into the executable), so reading it in a signal handler
// allocates nothing.
thread_local const DamagedFileGuard* innermost_guard = nullptr;

// The outermost guard of every thread, for guarded_reads_note().
std::mutex open_guards_mutex;
std::vector<const DamagedFileGuard*> open_guards;

std::mutex install_mutex;
struct sigaction previous_segv {};
struct sigaction previous_bus {};

struct sigaction& previous_action(int signal_number) {
  return signal_number == SIGSEGV ? previous_segv : previous_bus;
}

// No allocation: called from the signal handler.
void write_all(std::string_view text) {
  const char* data = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written <= 0) return;  // stderr gone: nothing else to tell
    data += written;
    left -= static_cast<std::size_t>(written);
  }
}

extern "C" void on_fault_signal(int signal_number, siginfo_t* info, void*) {
  const DamagedFileGuard* guard = innermost_guard;
  if (guard == nullptr) {
    // Not a read we guard: give the fault back to the handler that was there before. Returning re-runs the
    // faulting instruction, which then reaches it; a signal sent by kill() or raise() is sent again.
    sigaction(signal_number, &previous_action(signal_number), nullptr);
    if (info == nullptr || info->si_code <= 0) raise(signal_number);
    return;
  }
  write_all(guard->before_signal());
  write_all(signal_number == SIGSEGV ? "SIGSEGV" : "SIGBUS");
  write_all(guard->after_signal());
  _exit(kExitUserError);
}

// Installed at every outermost guard rather than once: MPI_Init, after the first guard, may have put its own
// handler in place, which then becomes the one faults outside a guard go to.
void install_fault_handler() {
  std::lock_guard<std::mutex> lock(install_mutex);
  struct sigaction ours {};
  ours.sa_sigaction = on_fault_signal;
  ours.sa_flags = SA_SIGINFO;
  sigemptyset(&ours.sa_mask);
  for (const int signal_number : kFaultSignals) {
    struct sigaction current {};
    if (sigaction(signal_number, nullptr, &current) != 0) continue;
    const bool installed = (current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == on_fault_signal;
    if (installed) continue;
    previous_action(signal_number) = current;
    sigaction(signal_number, &ours, nullptr);
  }
}

}  // namespace

DamagedFileGuard::DamagedFileGuard(const std::string& path)
    : outer_(innermost_guard), path_(path), since_(std::chrono::steady_clock::now()) {
  // A command without a launcher (predict, evaluate) has no rank to name.
  static const std::string where = launcher_rank() == "?"
                                       ? " (host " + host_name() + ")"
                                       : " (rank " + launcher_rank() + " on host " + host_name() + ")";
  const std::string shown = one_line(path);
  before_signal_ = "ddptrain: error: " + shown + ": the HDF5 library crashed reading this file (";
  after_signal_ = "): the file is damaged; h5dump " + shown + " shows where" + where + "\n";
  if (outer_ == nullptr) {
    install_fault_handler();
    const std::lock_guard<std::mutex> lock(open_guards_mutex);
    open_guards.push_back(this);
  }
  innermost_guard = this;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // in place before the first HDF5 call
}

DamagedFileGuard::~DamagedFileGuard() {
  std::atomic_signal_fence(std::memory_order_seq_cst);  // after the last HDF5 call
  innermost_guard = outer_;
  if (outer_ == nullptr) {
    const std::lock_guard<std::mutex> lock(open_guards_mutex);
    std::erase(open_guards, this);
  }
}

std::string guarded_reads_note(std::chrono::steady_clock::time_point now) {
  const std::lock_guard<std::mutex> lock(open_guards_mutex);
  std::string note;
  for (const DamagedFileGuard* guard : open_guards) {
    const std::string shown = one_line(guard->path());
    note += fmt::format(
        "{}this rank has been inside the HDF5 library reading {} for {:.1f} s: a file system that stopped "
        "answering, or a damaged file that HDF5 reads in a loop (h5dump {} tells which)",
        note.empty() ? "" : "; ", shown, std::chrono::duration<double>(now - guard->since()).count(), shown);
  }
  return note;
}

}  // namespace ddp::io

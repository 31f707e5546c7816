// libhdf5 trusts the offsets and sizes a file holds: in a damaged file (one flipped byte in the heap that
// holds variable-length strings, say) it can read out of bounds and kill the process with a crash report
// that names neither the file nor the cause. While a thread holds a DamagedFileGuard, a SIGSEGV or SIGBUS on
// that thread ends the process with one error line naming the file, and exit status 2, as any other bad
// input does. A fault anywhere else goes to the handler that was there before (the default, a sanitizer's,
// MPI's), so our own bugs still crash loudly.
#pragma once

#include <chrono>
#include <string>

namespace ddp::io {

class DamagedFileGuard {
 public:
  // `path`: the file about to be read, for the message. Guards nest; the innermost names the file.
  explicit DamagedFileGuard(const std::string& path);
  ~DamagedFileGuard();
  DamagedFileGuard(const DamagedFileGuard&) = delete;
  DamagedFileGuard& operator=(const DamagedFileGuard&) = delete;

  // Written by the fault handler around the signal's name: "<before>SIGSEGV<after>".
  const std::string& before_signal() const { return before_signal_; }
  const std::string& after_signal() const { return after_signal_; }
  const std::string& path() const { return path_; }
  std::chrono::steady_clock::time_point since() const { return since_; }

 private:
  std::string before_signal_;
  std::string after_signal_;
  const DamagedFileGuard* outer_;
  std::string path_;
  std::chrono::steady_clock::time_point since_;
};

// For a stall's message: how long this process's threads have been inside a guarded read, and of which file
// (a file system that stopped answering, or a damaged file that libhdf5 reads in a loop, holds a thread
// there); "" where no thread is.
std::string guarded_reads_note(std::chrono::steady_clock::time_point now);

}  // namespace ddp::io

// Faults and stalls inside reads of a damaged file (io/damaged_file_guard.h).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <csignal>

#include <chrono>
#include <string>
#include <thread>

#include "engine/base/errors.h"
#include "io/damaged_file_guard.h"

namespace ddp::io {
namespace {

// A fault inside a guarded read (libhdf5 reading out of bounds in a damaged file) is a bad input: one line
// naming the innermost guard's file, exit status 2. Outside any guard, or once the guards are gone, a fault
// reaches the handler that was there before.
TEST(DamagedFileGuard, AFaultWhileReadingNamesTheFileAndExitsAsBadInput) {
  EXPECT_EXIT(
      {
        const DamagedFileGuard outer("/data/outer.h5");
        { const DamagedFileGuard inner("/data/inner.h5"); }
        std::raise(SIGSEGV);
      },
      ::testing::ExitedWithCode(kExitUserError),
      "^ddptrain: error: /data/outer.h5: the HDF5 library crashed reading this file \\(SIGSEGV\\): the file "
      "is "
      "damaged; h5dump /data/outer.h5 shows where \\((rank .* on )?host .*\\)\n$");
  EXPECT_EXIT(
      {
        const DamagedFileGuard outer("/data/outer.h5");
        const DamagedFileGuard inner("/data/inner\nline.h5");
        std::raise(SIGBUS);
      },
      ::testing::ExitedWithCode(kExitUserError), "^ddptrain: error: /data/inner\\\\nline.h5: .*\\(SIGBUS\\)");
  EXPECT_EXIT(
      {
        { const DamagedFileGuard done("/data/done.h5"); }
        std::raise(SIGSEGV);
      },
      // Killed by the signal; under a sanitizer its own report and exit status.
      [](int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != kExitUserError; }, "");
}

// A stall's message says which file a thread has been reading, and for how long: the outermost guard of each
// thread, while it lives.
TEST(DamagedFileGuard, TheReadsUnderWayAreNamedForAStall) {
  using Clock = std::chrono::steady_clock;
  EXPECT_EQ(guarded_reads_note(Clock::now()), "");
  std::string note;
  {
    const DamagedFileGuard outer("/data/frozen.h5");
    const DamagedFileGuard inner("/data/inner.h5");
    note = guarded_reads_note(Clock::now() + std::chrono::seconds(30));
  }
  EXPECT_EQ(note.find("this rank has been inside the HDF5 library reading /data/frozen.h5 for 30.0 s"), 0u)
      << note;
  EXPECT_NE(note.find("(h5dump /data/frozen.h5 tells which)"), std::string::npos) << note;
  EXPECT_EQ(note.find("inner.h5"), std::string::npos) << note;
  EXPECT_EQ(guarded_reads_note(Clock::now()), "");
  // Another thread's read is named too.
  std::string other_thread;
  std::thread reader([&] {
    const DamagedFileGuard guard("/data/prefetched.h5");
    other_thread = guarded_reads_note(Clock::now());
  });
  reader.join();
  EXPECT_NE(other_thread.find("reading /data/prefetched.h5"), std::string::npos) << other_thread;
}

}  // namespace
}  // namespace ddp::io

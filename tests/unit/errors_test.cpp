// Fatal errors (engine/base/errors.h): the message, the rank, the exit status, and throwing scopes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "engine/base/errors.h"

namespace ddp {
namespace {

TEST(FatalErrors, EndTheProcessWithTheMessage) {
  EXPECT_EXIT(DDP_CHECK(1 + 1 == 3), ::testing::ExitedWithCode(kExitInternalError),
              "ddptrain: fatal: check failed: 1 \\+ 1 == 3 \\(.*errors_test.cpp:[0-9]+, host .*, rank .*\\)");
}

TEST(FatalErrors, NameTheLaunchersRankBeforeMpiStarts) {
  // The watchdog may end a rank that waits in MPI_Init: MPI cannot say its rank yet, its launcher can.
  const char* saved = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string previous = saved != nullptr ? saved : "";
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_EXIT(DDP_FATAL("stalled"), ::testing::ExitedWithCode(kExitInternalError),
              "ddptrain: fatal: stalled \\(.*, host .*, rank 3\\)");
  if (saved != nullptr) {
    ::setenv("OMPI_COMM_WORLD_RANK", previous.c_str(), 1);
  } else {
    ::unsetenv("OMPI_COMM_WORLD_RANK");
  }
}

// A rank stuck in MPI_Finalize leaves without MPI: its stdout (the run's last lines) is flushed, the reason
// and the launcher's rank go to stderr, and the exit status is the one given.
TEST(FatalErrors, LeavingWithoutFinalizingKeepsTheOutputAndTheStatus) {
  const std::string output = ::testing::TempDir() + "leaving_without_finalizing.txt";
  std::remove(output.c_str());
  EXPECT_EXIT(
      {
        if (std::freopen(output.c_str(), "w", stdout) == nullptr) std::abort();
        std::printf("the run's result\n");  // buffered: stdout is a file
        leave_without_finalizing("waited in MPI_Finalize", kExitPreempted);
      },
      ::testing::ExitedWithCode(kExitPreempted),
      "ddptrain: error: waited in MPI_Finalize; leaving without MPI, so that the launcher ends the job "
      "\\(host "
      ".*, rank .*\\)");
  std::ifstream written(output);
  std::string line;
  std::getline(written, line);
  EXPECT_EQ(line, "the run's result");
  std::remove(output.c_str());
}

TEST(FatalErrors, ThrowWhileAScopeAsksForIt) {
  {
    const ThrowFatalErrors outer;
    {
      const ThrowFatalErrors inner;
      EXPECT_THROW(DDP_FATAL("inner"), FatalError);
    }
    try {
      DDP_CHECK(1 + 1 == 3);
      ADD_FAILURE() << "DDP_CHECK did not throw";
    } catch (const FatalError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("check failed: 1 + 1 == 3 (", 0), 0u) << what;
      EXPECT_NE(what.find("errors_test.cpp:"), std::string::npos) << what;
    }
  }
  // Outside every scope it ends the process again.
  EXPECT_EXIT(DDP_FATAL("after"), ::testing::ExitedWithCode(kExitInternalError), "ddptrain: fatal: after");
}

}  // namespace
}  // namespace ddp

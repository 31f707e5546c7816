// The stall census across processes: a rank alive answers a stalled rank's notice from its watchdog's
// thread, so the message blames only the ranks that said nothing; a notice answered early counts when the
// answering rank stalls later itself.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "comm/stall_census.h"
#include "engine/base/errors.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp::comm {
namespace {

using testing::world_rank;
using testing::world_size;

// The last rank stalls; rank 0 is alive and answers as its watchdog would, every 20 ms; the ranks between
// (in jobs of 3 and more) say nothing. Then rank 0 stalls too.
TEST(StallCensusAcrossRanks, TheStalledRankBlamesOnlyTheSilentOnes) {
  StallCensus census(MPI_COMM_WORLD);
  const int rank = world_rank();
  const int last = world_size() - 1;
  const std::string host = host_name();
  const auto listen = std::chrono::milliseconds(1000);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == last) {
    const std::string words = census.survey("waiting for rank 0", 18, listen);
    if (last == 1) {
      EXPECT_EQ(words,
                "every rank answered: the stalled rank 1 waits for rank 0 (host " + host +
                    "), alive but slower than the timeout: rank 0 while writing last.h5 (last progress "
                    "4.5 s ago)");
    } else {
      const std::string silent = last == 2
                                     ? "rank 1 (host " + host + ") is"
                                     : "ranks 1-" + std::to_string(last - 1) + " (host " + host + ") are";
      EXPECT_EQ(words.find(silent + " hung, lost or slower than the timeout:"), 0u) << words;
      EXPECT_NE(words.find(" the stalled rank " + std::to_string(last) + " within "), std::string::npos)
          << words;
      EXPECT_NE(words.find("; alive: rank 0 while writing last.h5 (last progress 4.5 s ago)"),
                std::string::npos)
          << words;
    }
  } else if (rank == 0) {
    const auto until = std::chrono::steady_clock::now() + listen + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < until) {
      census.answer("writing last.h5", 18, 4.5);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Rank 0 stalls now: the last rank's notice, heard while answering, counts; nobody answers this time.
  if (rank == 0) {
    const std::string words = census.survey("writing last.h5", 18, std::chrono::milliseconds(300));
    if (last == 1) {
      EXPECT_EQ(
          words,
          "every rank stalled (none failed to answer); rank 1 while waiting for rank 0 (steps done: 18); "
          "rank 0 while writing last.h5 (steps done: 18)");
    } else {
      EXPECT_NE(words.find(" the stalled ranks 0, " + std::to_string(last) + " within "), std::string::npos)
          << words;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace ddp::comm

// The agreement on a stop signal: one rank's signal stops every rank, at the same call, one step late for
// poll() (its question had a step to complete) and at once for now().
#include <gtest/gtest.h>

#include <csignal>

#include "engine/preemption.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp::engine {
namespace {

using testing::world_rank;
using testing::world_size;

class StopAgreementTest : public ::testing::Test {
 protected:
  void SetUp() override { install_stop_signal_handlers(); }
  void TearDown() override { clear_stop_signal(); }
};

TEST_F(StopAgreementTest, OneRanksSignalStopsEveryRankAtTheSameCall) {
  const bool signalled = world_rank() == world_size() - 1;
  StopAgreement agreement(MPI_COMM_WORLD);
  EXPECT_FALSE(agreement.poll());
  EXPECT_FALSE(agreement.poll());
  if (signalled) std::raise(SIGUSR1);
  EXPECT_FALSE(agreement.poll());  // the answer to the question asked before the signal
  EXPECT_TRUE(agreement.poll());
  EXPECT_TRUE(agreement.stopped());
  EXPECT_TRUE(agreement.now());  // stays stopped
  EXPECT_EQ(stop_signal_received(), signalled ? "SIGUSR1" : "");
}

TEST_F(StopAgreementTest, NowAnswersAtOnceAndNothingStopsWithoutASignal) {
  StopAgreement agreement(MPI_COMM_WORLD);
  EXPECT_FALSE(agreement.now());
  EXPECT_FALSE(agreement.poll());
  EXPECT_FALSE(agreement.now());  // completes the pending question first
  if (world_rank() == 0) std::raise(SIGTERM);
  EXPECT_TRUE(agreement.now());
  EXPECT_EQ(stop_signal_received(), world_rank() == 0 ? "SIGTERM" : "");
}

}  // namespace
}  // namespace ddp::engine

// The agreement on a stop signal: one rank's signal stops every rank, at the same call, one step late for
// poll() (its question had a step to complete) and at once for now(); every rank then names the same signal.
#include <gtest/gtest.h>

#include <csignal>
#include <string>
#include <vector>

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

  comm::HostGroup world_{MPI_COMM_WORLD};
};

TEST_F(StopAgreementTest, OneRanksSignalStopsEveryRankAtTheSameCall) {
  const bool signalled = world_rank() == world_size() - 1;
  StopAgreement agreement(world_);
  EXPECT_FALSE(agreement.poll());
  EXPECT_FALSE(agreement.poll());
  if (signalled) std::raise(SIGUSR1);
  EXPECT_FALSE(agreement.poll());  // the answer to the question asked before the signal
  EXPECT_TRUE(agreement.poll());
  EXPECT_TRUE(agreement.stopped());
  EXPECT_TRUE(agreement.now());  // stays stopped
  EXPECT_EQ(stop_signal_received(), signalled ? "SIGUSR1" : "");
  EXPECT_EQ(agreement.signal_name(), "SIGUSR1");  // also where no signal came
}

TEST_F(StopAgreementTest, NowAnswersAtOnceAndNothingStopsWithoutASignal) {
  StopAgreement agreement(world_);
  EXPECT_FALSE(agreement.now());
  EXPECT_FALSE(agreement.poll());
  EXPECT_FALSE(agreement.now());  // completes the pending question first
  if (world_rank() == 0) std::raise(SIGTERM);
  EXPECT_TRUE(agreement.now());
  EXPECT_EQ(stop_signal_received(), world_rank() == 0 ? "SIGTERM" : "");
  EXPECT_EQ(agreement.signal_name(), "SIGTERM");
}

TEST_F(StopAgreementTest, RanksWithDifferentSignalsAgreeOnOneName) {
  StopAgreement agreement(world_);
  EXPECT_EQ(agreement.signal_name(), "");
  // Rank 0 a Ctrl-C, the last rank a SIGUSR1, any rank between a SIGTERM: every rank must name the same one.
  const int rank = world_rank();
  const int last = world_size() - 1;
  std::raise(rank == 0 ? SIGINT : rank == last ? SIGUSR1 : SIGTERM);
  EXPECT_TRUE(agreement.now());
  const std::string mine = agreement.signal_name();
  char text[32] = {};
  mine.copy(text, sizeof(text) - 1);
  std::vector<char> all(sizeof(text) * static_cast<std::size_t>(world_size()));
  MPI_Allgather(text, sizeof(text), MPI_CHAR, all.data(), sizeof(text), MPI_CHAR, MPI_COMM_WORLD);
  for (int r = 0; r < world_size(); ++r)
    EXPECT_STREQ(all.data() + r * sizeof(text), text) << "rank " << r << " names another signal";
  // The highest signal number among those received.
  EXPECT_EQ(mine, world_size() > 2 ? "SIGTERM" : "SIGUSR1");
  // A later poll() keeps the agreed name.
  EXPECT_TRUE(agreement.poll());
  EXPECT_EQ(agreement.signal_name(), mine);
}

TEST_F(StopAgreementTest, ASignalRelayedForAnotherProcessStopsEveryRank) {
  // The last rank relays a SIGUSR1 its dedicated parameter server received; no rank received one itself.
  StopAgreement agreement(world_);
  agreement.relay(0);  // nothing to relay
  EXPECT_FALSE(agreement.now());
  if (world_rank() == world_size() - 1) agreement.relay(SIGUSR1);
  EXPECT_FALSE(agreement.poll());  // the answer to the question asked before the relay
  EXPECT_TRUE(agreement.poll());
  EXPECT_EQ(stop_signal_received(), "");
  EXPECT_EQ(agreement.signal_name(), "SIGUSR1");
}

TEST_F(StopAgreementTest, AskingEveryFewPollsAnswersAtTheSamePollOnEveryRank) {
  // Every third poll asks (and completes the question of three polls before); the polls between only repeat
  // the last answer, so ranks may be up to three polls apart without waiting for each other.
  StopAgreement agreement(world_, 3);
  std::vector<int> answers;
  for (int poll = 1; poll <= 9; ++poll) {
    answers.push_back(agreement.poll() ? 1 : 0);
    if (poll == 3 && world_rank() == world_size() - 1) std::raise(SIGTERM);  // after the third poll asked
  }
  // Poll 6 completes poll 3's question (asked before the signal); poll 9 completes poll 6's.
  EXPECT_EQ(answers, (std::vector<int>{0, 0, 0, 0, 0, 0, 0, 0, 1}));
  EXPECT_EQ(agreement.signal_name(), "SIGTERM");
}

TEST(StopSignalName, NamesTheStopSignals) {
  EXPECT_EQ(stop_signal_name(0), "");
  EXPECT_EQ(stop_signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(stop_signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(stop_signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(stop_signal_name(SIGHUP), "SIGHUP");
  EXPECT_EQ(stop_signal_name(SIGQUIT), "signal " + std::to_string(SIGQUIT));
}

}  // namespace
}  // namespace ddp::engine

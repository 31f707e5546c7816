// The poll pacing of the parameter server's waits (comm/poller.h): when a deadline counts as passed.
#include "comm/poller.h"

#include <gtest/gtest.h>

namespace ddp::comm {
namespace {

TEST(Poller, ADeadlineCountsOnlyAfterSeveralLatePollsInARow) {
  Poller poller;
  for (int poll = 1; poll < 8; ++poll) EXPECT_FALSE(poller.confirm_overdue(true)) << "poll " << poll;
  EXPECT_TRUE(poller.confirm_overdue(true));
}

TEST(Poller, AnOnTimePollOrProgressStartsTheCountAgain) {
  Poller poller;
  for (int poll = 0; poll < 7; ++poll) poller.confirm_overdue(true);
  EXPECT_FALSE(poller.confirm_overdue(false));
  for (int poll = 0; poll < 7; ++poll) EXPECT_FALSE(poller.confirm_overdue(true));
  poller.progressed();
  for (int poll = 0; poll < 7; ++poll) EXPECT_FALSE(poller.confirm_overdue(true));
  EXPECT_TRUE(poller.confirm_overdue(true));
}

}  // namespace
}  // namespace ddp::comm

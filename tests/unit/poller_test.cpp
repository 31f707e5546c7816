// The poll pacing of the parameter server's waits (comm/poller.h): when a deadline counts as passed.
#include "comm/poller.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace ddp::comm {
namespace {

using std::chrono::milliseconds;

TEST(Poller, ADeadlineCountsOnlyAfterSeveralLatePollsInARow) {
  Poller poller(milliseconds(0));
  for (int poll = 1; poll < 8; ++poll) EXPECT_FALSE(poller.confirm_overdue(true)) << "poll " << poll;
  EXPECT_TRUE(poller.confirm_overdue(true));
}

TEST(Poller, AnOnTimePollOrProgressStartsTheCountAgain) {
  Poller poller(milliseconds(0));
  for (int poll = 0; poll < 7; ++poll) poller.confirm_overdue(true);
  EXPECT_FALSE(poller.confirm_overdue(false));
  for (int poll = 0; poll < 7; ++poll) EXPECT_FALSE(poller.confirm_overdue(true));
  poller.progressed();
  for (int poll = 0; poll < 7; ++poll) EXPECT_FALSE(poller.confirm_overdue(true));
  EXPECT_TRUE(poller.confirm_overdue(true));
}

// A deadline found past must stay past for the confirm spell too: a process that was stopped finds its
// deadlines past until the watchdog's thread notices the stop and the running clock leaves it out.
TEST(Poller, ADeadlineCountsOnlyOnceItStayedPastForTheSpell) {
  Poller patient(std::chrono::hours(1));
  for (int poll = 0; poll < 1000; ++poll) EXPECT_FALSE(patient.confirm_overdue(true)) << "poll " << poll;
  Poller poller(milliseconds(2));
  for (int poll = 0; poll < 8; ++poll) poller.confirm_overdue(true);
  std::this_thread::sleep_for(milliseconds(3));
  EXPECT_TRUE(poller.confirm_overdue(true));
}

}  // namespace
}  // namespace ddp::comm

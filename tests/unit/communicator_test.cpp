// What the communicator interface promises without any peer: agree_on_errors marks the errors it agreed on,
// and AbortOnUnwind aborts a communicator only when an exception leaves its scope.
#include <gtest/gtest.h>

#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/stall_census.h"
#include "engine/base/errors.h"

namespace ddp::comm {
namespace {

// One rank on its own; counts abort() calls.
class LoneCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "lone"; }
  void broadcast(std::span<float>, int) override {}
  void broadcast(std::span<double>, int) override {}
  void start_average(std::span<float>) override {}
  void finish_average() override {}
  std::vector<int32_t> start_average_rows(std::span<float>, std::size_t, std::span<const int32_t>) override {
    return {};
  }
  void sum(std::span<double>) override {}
  void barrier() override {}
  std::vector<std::string> gather(const std::string& text, int) override { return {text}; }
  std::string scatter(const std::vector<std::string>& texts, int) override { return texts.at(0); }
  std::optional<std::string> first_error(const std::optional<std::string>& mine) override { return mine; }
  void abort() override { ++aborts; }

  int aborts = 0;
};

TEST(AgreeOnErrors, ThrowsTheAgreedErrorAsSuch) {
  LoneCommunicator comm;
  try {
    agree_on_errors(comm, [] { throw UserError("bad key"); });
    FAIL() << "no error";
  } catch (const AgreedUserError& e) {
    EXPECT_STREQ(e.what(), "bad key");
  }
  EXPECT_NO_THROW(agree_on_errors(comm, [] {}));
}

TEST(AbortOnUnwind, AbortsOnlyWhenAnExceptionLeavesTheScope) {
  LoneCommunicator comm;
  { const AbortOnUnwind guard(&comm); }
  EXPECT_EQ(comm.aborts, 0);
  try {
    const AbortOnUnwind guard(&comm);
    throw std::runtime_error("a failed step");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(comm.aborts, 1);
  // A guard made while another exception is already unwinding (in a destructor) counts from there.
  struct UnwindingDestructor {
    LoneCommunicator& comm;
    ~UnwindingDestructor() { const AbortOnUnwind guard(&comm); }
  };
  try {
    const UnwindingDestructor outer{comm};
    throw std::runtime_error("outer");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(comm.aborts, 1);
  { const AbortOnUnwind no_communicator(nullptr); }
}

// The one message of a stalled job names the ranks that did not answer, with their hosts; where every rank
// answered it says what each was doing.
TEST(StallCensus, NamesTheRanksThatDidNotAnswer) {
  StallFacts facts;
  facts.world_size = 6;
  facts.hosts = {"a", "a", "b", "b", "c", "c"};
  facts.listened_s = 1.04;
  facts.stalled = {{0, "training", 12}, {2, "training", 12}, {3, "training", 12}, {5, "training", 12}};
  EXPECT_EQ(
      describe_stall(facts, 0),
      "ranks 1, 4 (hosts a, c) are hung, lost or slower than the timeout: they did not answer the stalled "
      "ranks 0, 2-3, 5 within 1.0 s");
  facts.stalled = {{0, "training", 12},
                   {1, "reading data.path x.h5", 0},
                   {2, "training", 12},
                   {3, "training", 12},
                   {4, "training", 12}};
  EXPECT_EQ(
      describe_stall(facts, 0),
      "rank 5 (host c) is hung, lost or slower than the timeout: it did not answer the stalled ranks 0-4 "
      "within 1.0 s; rank 1 was reading data.path x.h5");
  facts.world_size = 2;
  facts.stalled = {{0, "training", 12}, {1, "reading data.path x.h5", 0}};
  EXPECT_EQ(describe_stall(facts, 0),
            "every rank stalled (none failed to answer); rank 1 while reading data.path x.h5; rank 0 while "
            "training (steps done: 12)");
  facts.stalled = {{0, "training", 12}, {1, "training", 12}};
  EXPECT_EQ(describe_stall(facts, 0), "every rank stalled (none failed to answer), all while the same thing");
}

}  // namespace
}  // namespace ddp::comm

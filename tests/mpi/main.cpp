// MPI tests: every rank runs every test; the job fails if any rank fails. Rank 0 prints gtest's report; the
// other ranks print only their failures, named by rank, so a failure seen on one rank alone is diagnosable.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

class FailuresOnlyPrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailuresOnlyPrinter(int rank) : rank_(rank) {}

  // The test's name is kept here: asking gtest for it inside OnTestPartResult would wait on the lock
  // gtest holds while it reports.
  void OnTestStart(const ::testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 result.file_name() ? result.file_name() : "?", result.line_number(), result.message());
    std::fflush(stderr);
    if (failed_.empty() || failed_.back() != test_) failed_.push_back(test_);
  }

  // Once more at the end, where a log cut in the middle still shows it.
  void OnTestProgramEnd(const ::testing::UnitTest& /*unit_test*/) override {
    if (failed_.empty()) return;
    std::string names;
    for (const auto& name : failed_) names += " " + name;
    std::fprintf(stderr, "rank %d: failed tests:%s\n", rank_, names.c_str());
  }

 private:
  int rank_;
  std::string test_;
  std::vector<std::string> failed_;
};

}  // namespace

int main(int argc, char** argv) {
  // As ddptrain asks (the MPI backend starts its progress thread only on jobs of several nodes: tests/cluster
  // runs them, and the hierarchy's tests on pseudo-nodes).
  int threading = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &threading);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailuresOnlyPrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::fprintf(stderr, "a test failed on another rank\n");
  MPI_Finalize();
  return any_failed;
}

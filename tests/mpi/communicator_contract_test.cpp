// The MPI backend against the communicator contract (tests/communicator_contract.h), at every rank count
// ctest runs this binary with.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/average_check.h"
#include "comm/communicator.h"
#include "tests/communicator_contract.h"

namespace ddp {
namespace {

TEST(CommunicatorContract, MpiAverages) {
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  std::vector<std::unique_ptr<std::vector<float>>> buffers;
  const testing::CheckBufferFactory host = [&](std::size_t floats) {
    buffers.push_back(std::make_unique<std::vector<float>>(floats));
    return comm::host_check_buffer(*buffers.back());
  };
  testing::expect_averages(*comm, host, comm::kAverageTolerance);
}

TEST(CommunicatorContract, MpiHostCollectives) {
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  testing::expect_host_collectives(*comm);
}

TEST(CommunicatorContract, MpiRowAverages) {
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  testing::expect_row_averages(*comm, 100, 9);  // a few rows: the sparse path
  testing::expect_row_averages(*comm, 20, 19);  // nearly every row: the whole matrix is averaged
  testing::expect_row_averages(*comm, 50, 1);   // fewer rows than ranks
}

// The check itself: a communicator that does not reduce must fail it (with one rank averaging is the
// identity, so only a job of several ranks can tell).
class NotReducing final : public comm::Communicator {
 public:
  explicit NotReducing(std::unique_ptr<comm::Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "not reducing"; }
  void broadcast(std::span<float> d, int root) override { inner_->broadcast(d, root); }
  void broadcast(std::span<double> d, int root) override { inner_->broadcast(d, root); }
  void start_average(std::span<float>) override {}
  void finish_average() override {}
  std::vector<int32_t> start_average_rows(std::span<float>, std::size_t,
                                          std::span<const int32_t> r) override {
    return {r.begin(), r.end()};
  }
  void sum(std::span<double> d) override { inner_->sum(d); }
  void barrier() override { inner_->barrier(); }
  std::vector<std::string> gather(const std::string& t, int root) override { return inner_->gather(t, root); }
  std::optional<std::string> first_error(const std::optional<std::string>& m) override {
    return inner_->first_error(m);
  }

 private:
  std::unique_ptr<comm::Communicator> inner_;
};

TEST(CommunicatorContract, FailsACommunicatorThatDoesNotReduce) {
  NotReducing comm(comm::make_mpi_communicator(MPI_COMM_WORLD));
  std::vector<float> data(64);
  const std::vector<std::size_t> sizes{64};
  const comm::AverageCheckResult result =
      comm::check_average(comm, comm::host_check_buffer(data), sizes, comm::kAverageTolerance);
  EXPECT_FALSE(result.ok) << "every rank must see the failure, the middle one of an odd count too";
  EXPECT_NE(result.where.find("on rank "), std::string::npos) << result.where;
}

}  // namespace
}  // namespace ddp

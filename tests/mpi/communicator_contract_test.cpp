// Every gradient reducer against the contract (tests/communicator_contract.h) in one typed suite
// (Communicators), at every rank count ctest runs this binary with: the MPI backend here (flat, bf16, fp16,
// and hierarchical on pseudo-nodes); staged MPI and NCCL (with each wire compression) where every rank has a
// GPU of its own (skipped, with the reason, elsewhere). The host collectives, which every backend shares,
// once for comm::HostGroup (HostGroupContract).
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/average_check.h"
#include "comm/backend_choice.h"
#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/base/errors.h"
#include "engine/device.h"
#include "engine/self_check.h"
#include "engine/topology.h"
#include "tests/communicator_contract.h"

namespace ddp {
namespace {

// The check itself: a reducer that does not reduce must fail it (with one rank averaging is the identity, so
// only a job of several ranks can tell).
class NotReducing final : public comm::GradientReducer {
 public:
  explicit NotReducing(std::unique_ptr<comm::GradientReducer> inner) : inner_(std::move(inner)) {}
  int size() const override { return inner_->size(); }
  std::string backend() const override { return "not reducing"; }
  void start_average(std::span<float>) override {}
  void finish_average() override {}
  std::vector<int32_t> start_average_rows(std::span<float>, std::size_t,
                                          std::span<const int32_t> r) override {
    return {r.begin(), r.end()};
  }

 private:
  std::unique_ptr<comm::GradientReducer> inner_;
};

TEST(CommunicatorContract, FailsACommunicatorThatDoesNotReduce) {
  comm::HostGroup world(MPI_COMM_WORLD);
  NotReducing reducer(comm::make_mpi_reducer(world));
  std::vector<float> data(64);
  const std::vector<std::size_t> sizes{64};
  const comm::AverageCheckResult result =
      comm::check_average(world, reducer, comm::host_check_buffer(data), sizes, comm::kAverageTolerance);
  EXPECT_FALSE(result.ok) << "every rank must see the failure, the middle one of an odd count too";
  EXPECT_NE(result.where.find("on rank "), std::string::npos) << result.where;
}

// This rank's GPU where every rank has one of its own (device = auto's binding), or why the job cannot run
// the GPU communicators (every rank skips).
struct GpuPerRank {
  int device = -1;
  std::string why_not;
};
GpuPerRank gpu_per_rank() {
  comm::HostGroup world(MPI_COMM_WORLD);
  const engine::Topology topology = engine::discover_topology(world, "auto");
  int everyone = topology.gpu >= 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &everyone, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (everyone == 1) return {topology.gpu, ""};
  return {-1, topology.gpu >= 0 ? "another rank has no GPU of its own"
                                : "rank " + std::to_string(topology.rank) + ": " + topology.device_reason};
}

// Buffers in the memory of `device`, kept alive by `owned`.
testing::CheckBufferFactory device_buffers(int device,
                                           std::vector<std::unique_ptr<engine::DeviceBuffer>>& owned) {
  return [device, &owned](std::size_t floats) {
    owned.push_back(std::make_unique<engine::DeviceBuffer>(device, floats * sizeof(float)));
    engine::DeviceBuffer& memory = *owned.back();
    return comm::CheckBuffer{
        std::span<float>(static_cast<float*>(memory.data()), floats),
        [&memory](std::span<const float> host) { memory.upload(host.data(), host.size_bytes()); },
        [&memory](std::span<float> host) { memory.download(host.data(), host.size_bytes()); }};
  };
}

// One typed suite over every reducer: each Kind says how to make it (over a group of every rank), whether its
// gradient buffers live in device memory (then every rank needs a GPU of its own, or all skip) and how close
// its average must be.
template <typename Kind>
class Communicators : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Kind::kDeviceMemory) {
      const GpuPerRank gpu = gpu_per_rank();  // collective: every rank learns whether all have a GPU
      if (gpu.device < 0) GTEST_SKIP() << gpu.why_not;
      device_ = gpu.device;
    }
    reducer_ = Kind::make(group_);
  }
  // Buffers in the reducer's memory, kept until the test ends.
  testing::CheckBufferFactory buffers() {
    if (Kind::kDeviceMemory) return device_buffers(device_, device_owned_);
    return [this](std::size_t floats) {
      host_owned_.push_back(std::make_unique<std::vector<float>>(floats));
      return comm::host_check_buffer(*host_owned_.back());
    };
  }

  int device_ = -1;
  comm::HostGroup group_{MPI_COMM_WORLD};
  // Declared before the reducer, so that it goes first and no reduction outlives its buffers.
  std::vector<std::unique_ptr<std::vector<float>>> host_owned_;
  std::vector<std::unique_ptr<engine::DeviceBuffer>> device_owned_;
  std::unique_ptr<comm::GradientReducer> reducer_;
};

struct MpiKind {
  static constexpr bool kDeviceMemory = false;
  static std::unique_ptr<comm::GradientReducer> make(comm::HostGroup& group) {
    return comm::make_mpi_reducer(group);
  }
  static double tolerance(int) { return comm::kAverageTolerance; }
};

// The MPI all-reduce with gradients as bfloat16 (an all-to-all, float sums, an all-gather).
// The MPI all-reduce with gradients on a 16-bit wire: `kWire` is bf16 or fp16 (scaled per chunk).
template <const char* kWire>
struct Mpi16BitKind {
  static constexpr bool kDeviceMemory = false;
  static std::unique_ptr<comm::GradientReducer> make(comm::HostGroup& group) {
    return comm::make_mpi_reducer(group, kWire);
  }
  static double tolerance(int size) { return comm::average_tolerance(kWire, size); }
};

// The MPI all-reduce's hierarchy on pseudo-nodes of consecutive rank pairs: at 3 and 4 ranks a reduce per
// node, an all-reduce across the leaders and a broadcast per node (at 2 ranks one node: the flat path).
struct MpiHierarchyKind {
  static constexpr bool kDeviceMemory = false;
  static std::unique_ptr<comm::GradientReducer> make(comm::HostGroup& group) {
    return comm::make_mpi_reducer(group, comm::MpiReducerOptions{"none", "auto", group.rank() / 2});
  }
  static double tolerance(int) { return comm::kAverageTolerance; }
};

struct StagedMpiKind {
  static constexpr bool kDeviceMemory = true;
  static std::unique_ptr<comm::GradientReducer> make(comm::HostGroup& group) {
    return comm::make_staged_mpi_reducer(group, nullptr);
  }
  static double tolerance(int) { return comm::kAverageTolerance; }
};

// NCCL with gradients on the wire as `kWire` says: none, fp16 or bf16.
template <const char* kWire>
struct NcclKind {
  static constexpr bool kDeviceMemory = true;
  static std::unique_ptr<comm::GradientReducer> make(comm::HostGroup& group) {
    return comm::make_nccl_reducer(group, nullptr, kWire);
  }
  static double tolerance(int size) { return comm::average_tolerance(kWire, size); }
};
constexpr char kNone[] = "none";
constexpr char kFp16[] = "fp16";
constexpr char kBf16[] = "bf16";

using CommunicatorKinds =
    ::testing::Types<MpiKind, Mpi16BitKind<kBf16>, Mpi16BitKind<kFp16>, MpiHierarchyKind, StagedMpiKind,
                     NcclKind<kNone>, NcclKind<kFp16>, NcclKind<kBf16>>;
struct KindName {
  template <typename Kind>
  static std::string GetName(int index) {
    return std::vector<std::string>{"mpi",        "mpi_bf16", "mpi_fp16",  "mpi_hierarchy",
                                    "staged_mpi", "nccl",     "nccl_fp16", "nccl_bf16"}
        .at(static_cast<std::size_t>(index));
  }
};
TYPED_TEST_SUITE(Communicators, CommunicatorKinds, KindName);

TYPED_TEST(Communicators, Averages) {
  testing::expect_averages(this->group_, *this->reducer_, this->buffers(),
                           TypeParam::tolerance(this->reducer_->size()));
}

// Rows of a matrix in host memory: the backends whose gradients live there.
TYPED_TEST(Communicators, RowAverages) {
  if (TypeParam::kDeviceMemory) GTEST_SKIP() << "the row exchange is tested on host memory";
  const double tolerance = std::max(1e-6, TypeParam::tolerance(this->reducer_->size()));
  comm::HostGroup& group = this->group_;
  comm::GradientReducer& reducer = *this->reducer_;
  testing::expect_row_averages(group, reducer, 100, 9, tolerance);  // a few rows: the sparse path
  testing::expect_row_averages(group, reducer, 20, 19, tolerance);  // nearly every row: the whole matrix
  testing::expect_row_averages(group, reducer, 50, 1, tolerance);   // fewer rows than ranks
}

// The GPU self-check of the communicator (engine/self_check.h) on the segments of the IMDB model.
TEST(CommunicatorContract, NcclSelfCheckPasses) {
  const auto [device, why_not] = gpu_per_rank();
  if (device < 0) GTEST_SKIP() << why_not;
  comm::HostGroup world(MPI_COMM_WORLD);
  auto reducer = comm::make_nccl_reducer(world, nullptr, "bf16");
  const std::vector<std::size_t> sizes{20000 * 128, 131584, 129};
  const engine::SelfCheckReport report =
      engine::check_gpu_communicator(world, *reducer, device, sizes, "bf16");
  EXPECT_TRUE(report.ok) << report.failure;
}

// Where a rank cannot even get its GPU buffer, every rank learns it and none waits in a collective.
TEST(CommunicatorContract, SelfCheckAgreesOnAFailureToStart) {
  const engine::GpuInventory inventory = engine::probe_gpus();
  int gpus = static_cast<int>(inventory.gpus.size());
  MPI_Allreduce(MPI_IN_PLACE, &gpus, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (gpus > 0) GTEST_SKIP() << "a GPU is visible: the failure to start cannot be made here";
  comm::HostGroup world(MPI_COMM_WORLD);
  auto reducer = comm::make_mpi_reducer(world);
  const std::vector<std::size_t> sizes{64, 3};
  const engine::SelfCheckReport report = engine::check_gpu_communicator(world, *reducer, 0, sizes, "none");
  EXPECT_FALSE(report.ok);
  EXPECT_NE(report.failure.find("rank 0: a GPU call failed"), std::string::npos) << report.failure;
}

// The host collectives every backend shares, once: they live in comm::HostGroup alone.
TEST(HostGroupContract, HostCollectives) {
  comm::HostGroup world(MPI_COMM_WORLD);
  testing::expect_host_collectives(world);
}

// What the engine asks of a group beyond the contract's collectives: integers, a maximum that completes
// later, every rank's text, and the groups made from it.
TEST(HostGroupContract, IntegersTextsAndSubgroups) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  const int rank = world.rank();
  std::vector<int64_t> values{int64_t{1} << 40, rank, -rank};
  world.broadcast(std::span<int64_t>(values), n - 1);
  EXPECT_EQ(values, (std::vector<int64_t>{int64_t{1} << 40, n - 1, 1 - n}));
  std::vector<int64_t> sums{1, rank};
  world.sum(std::span<int64_t>(sums));
  EXPECT_EQ(sums, (std::vector<int64_t>{n, n * (n - 1) / 2}));
  std::vector<int64_t> maxima{rank, -rank};
  world.max(std::span<int64_t>(maxima));
  EXPECT_EQ(maxima, (std::vector<int64_t>{n - 1, 0}));
  comm::PendingMax pending = world.start_max(rank == 1 % n ? 15 : rank);
  EXPECT_TRUE(pending.active());
  world.barrier();  // other collectives may run while it is under way
  EXPECT_EQ(pending.wait(), std::max<int64_t>(15, n - 1));
  EXPECT_FALSE(pending.active());

  std::vector<std::byte> bytes(3, std::byte{static_cast<unsigned char>(rank)});
  world.broadcast(std::span<std::byte>(bytes), 0);
  EXPECT_EQ(bytes, std::vector<std::byte>(3, std::byte{0}));
  const std::vector<std::string> all = world.all_gather(std::string(static_cast<std::size_t>(rank), 'x'));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], std::string(r, 'x'));

  comm::HostGroup copy = world.duplicate();
  EXPECT_EQ(copy.rank(), rank);
  EXPECT_EQ(copy.size(), n);
  comm::HostGroup node = world.node();  // ctest runs every rank on one node
  EXPECT_EQ(node.size(), n);
  EXPECT_EQ(node.rank(), rank);
  std::optional<comm::HostGroup> odd = world.subgroup(rank % 2 == 1);
  ASSERT_EQ(odd.has_value(), rank % 2 == 1);
  if (odd) {
    EXPECT_EQ(odd->size(), n / 2);
    EXPECT_EQ(odd->rank(), rank / 2);
    EXPECT_EQ(odd->all_gather(std::to_string(rank)).back(), std::to_string(n - 1 - (n % 2)));
  }
}

// This process alone: every collective is the identity, and no MPI is needed for it.
TEST(HostGroupContract, AloneIsTheIdentity) {
  comm::HostGroup alone = comm::HostGroup::alone();
  EXPECT_EQ(alone.rank(), 0);
  EXPECT_EQ(alone.size(), 1);
  std::vector<double> d{2.5};
  alone.sum(d);
  alone.broadcast(d, 0);
  EXPECT_EQ(d[0], 2.5);
  EXPECT_EQ(alone.gather("me", 0), std::vector<std::string>{"me"});
  EXPECT_EQ(alone.scatter({"mine"}, 0), "mine");
  EXPECT_EQ(alone.first_error(std::string("bad")), std::optional<std::string>("bad"));
  EXPECT_EQ(alone.start_max(7).wait(), 7);
  EXPECT_FALSE(alone.subgroup(false).has_value());
  EXPECT_EQ(alone.node().size(), 1);
}

// The colocated parameter server's exchange (comm/sharded_exchange.h) against the same closed form: each
// rank's shard of the reduce-scatter is the average, the shards tile the vector, and the all-gather, the
// gather to rank 0 and the scatter from it move every float to its place.
// fp16 on the MPI all-reduce is scaled per chunk: values far above fp16's largest (65504) and far below its
// smallest normal (6e-5) average as in float, within fp16's 11 bits of their chunk's largest, and every rank
// ends with the same bits. Each rank's value at i is (rank + 1) x 10^(e(i)) with e(i) from -9 to 9 along the
// segment, so every chunk spans a few decades.
TEST(CommunicatorContract, MpiFp16KeepsWideMagnitudes) {
  comm::HostGroup world(MPI_COMM_WORLD);
  auto reducer = comm::make_mpi_reducer(world, "fp16");
  const int ranks = world.size();
  constexpr std::size_t kSize = 1900;
  std::vector<float> segment(kSize);
  std::vector<double> expected(kSize);
  const auto exponent = [](std::size_t i) { return -9.0 + 18.0 * static_cast<double>(i) / (kSize - 1); };
  for (std::size_t i = 0; i < kSize; ++i) {
    const double magnitude = std::pow(10.0, exponent(i)) * ((i % 2) ? -1.0 : 1.0);
    segment[i] = static_cast<float>((world.rank() + 1) * magnitude);
    expected[i] = magnitude * (ranks + 1) / 2.0;
  }
  reducer->start_average(segment);
  reducer->finish_average();
  // Each chunk's largest expected magnitude bounds the error of its values (two roundings to 11 bits).
  for (int r = 0; r < ranks; ++r) {
    const std::size_t begin = kSize * static_cast<std::size_t>(r) / static_cast<std::size_t>(ranks);
    const std::size_t end = kSize * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(ranks);
    double largest = 0;
    for (std::size_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(expected[i]));
    for (std::size_t i = begin; i < end; ++i) {
      ASSERT_TRUE(std::isfinite(segment[i])) << i;
      ASSERT_NEAR(segment[i], expected[i], largest * std::ldexp(1.0, -10)) << i << " of chunk " << r;
    }
  }
  // Values near the top, above fp16's range, keep their relative precision.
  EXPECT_NEAR(segment[kSize - 1] / expected[kSize - 1], 1.0, std::ldexp(1.0, -9));
  std::vector<float> first = segment;
  world.broadcast(std::span<float>(first), 0);
  EXPECT_EQ(std::memcmp(first.data(), segment.data(), kSize * sizeof(float)), 0) << "ranks differ";
}

}  // namespace
}  // namespace ddp

namespace ddp {
namespace {

// Two ranks on one GPU board (overlapping CUDA_VISIBLE_DEVICES, MIG slices of one GPU) are refused before
// NCCL's init, which would end the job in its "Duplicate GPU detected" from inside an abort: one UserError
// on every rank, naming both ranks and the board.
TEST(ChooseBackend, RefusesNcclForRanksThatShareAGpuBoard) {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2) GTEST_SKIP() << "needs 2 ranks";
  comm::BackendRequest request;
  request.backend = "nccl";
  request.on_gpu = true;
  request.gpu_board = "node7 PCI 0000:3b:00.0";  // every rank names the same board
  try {
    comm::HostGroup world(MPI_COMM_WORLD);
    comm::choose_backend(request, world);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 share the GPU at node7 PCI 0000:3b:00.0"),
              std::string::npos)
        << e.what();
  }
}

// model.precision = fp16 on a GPU rank skips the steps that overflowed on every rank alike, which the
// parameter server cannot: one UserError on every rank. CPU ranks compute in float32 and keep the server.
TEST(ChooseBackend, RefusesTheParameterServerForFp16OnGpuRanks) {
  comm::HostGroup world(MPI_COMM_WORLD);
  if (world.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  comm::BackendRequest request;
  request.backend = "ps";
  request.skips_nonfinite = true;
  request.on_gpu = world.rank() == 0;
  try {
    comm::choose_backend(request, world);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("comm.backend = ps: model.precision = fp16 needs an all-reduce backend"),
        std::string::npos)
        << e.what();
  }
  request.on_gpu = false;
  EXPECT_TRUE(comm::choose_backend(request, world).parameter_server);
}

// The progress period's override (DDPTRAIN_MPI_PROGRESS_US) is checked before any collective, on every rank.
TEST(MpiReducer, RefusesAProgressPeriodThatIsNotMicroseconds) {
  comm::HostGroup world(MPI_COMM_WORLD);
  for (const char* bad : {"fast", "-5", "200us", "2000000"}) {
    setenv("DDPTRAIN_MPI_PROGRESS_US", bad, 1);
    try {
      comm::make_mpi_reducer(world);
      ADD_FAILURE() << bad << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("DDPTRAIN_MPI_PROGRESS_US = ") + bad),
                std::string::npos)
          << e.what();
    }
  }
  setenv("DDPTRAIN_MPI_PROGRESS_US", "0", 1);
  EXPECT_NO_THROW(comm::make_mpi_reducer(world));
  unsetenv("DDPTRAIN_MPI_PROGRESS_US");
}

TEST(ChooseBackend, FindsTheFirstTwoRanksOnOneBoard) {
  EXPECT_EQ(comm::first_shared_board({"a PCI 1", "a PCI 2", "b PCI 1"}), std::nullopt);
  EXPECT_EQ(comm::first_shared_board({"a PCI 1", "a PCI 2", "a PCI 2", "a PCI 1"}), (std::pair{1, 2}));
  EXPECT_EQ(comm::first_shared_board({"", ""}), std::nullopt) << "unknown boards are no evidence";
  EXPECT_EQ(comm::first_shared_board({}), std::nullopt);
}

}  // namespace
}  // namespace ddp

// Data parallelism across MPI ranks: the communicator's closed forms, replicas staying bit-identical, and
// gradient averaging giving the same update as one replica on the whole batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/all_reduce_step.h"
#include "engine/optimizer/optimizer.h"
#include "models/initializers.h"
#include "models/replica.h"
#include "tests/forwarding_replica.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

using ddp::testing::SharedDir;
using ddp::testing::world_rank;
using ddp::testing::world_size;

struct TokenBatch {
  std::vector<int32_t> tokens;
  std::vector<float> labels;
  int batch = 0;
  int seq = 0;
  BatchView view(int first, int count) const {
    return {tokens.data() + static_cast<std::size_t>(first) * seq, labels.data() + first, count, seq};
  }
};

TokenBatch random_batch(int batch, int seq, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  TokenBatch b{{}, {}, batch, seq};
  for (int i = 0; i < batch * seq; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
  for (int i = 0; i < batch; ++i) b.labels.push_back(static_cast<float>(rng() % 2));
  return b;
}

TEST(Communicator, AverageAndBroadcastClosedForms) {
  comm::HostGroup world(MPI_COMM_WORLD);
  auto comm = comm::make_mpi_reducer(world);
  const int n = world.size();
  std::vector<float> a(1000, static_cast<float>(world.rank()));
  std::vector<float> b(7, static_cast<float>(2 * world.rank() + 1));
  comm->start_average(a);
  comm->start_average(b);
  comm->finish_average();
  for (float x : a) ASSERT_FLOAT_EQ(x, static_cast<float>(n - 1) / 2.0f);
  for (float x : b) ASSERT_FLOAT_EQ(x, static_cast<float>(n));  // mean of 1, 3, 5, ... = n

  std::vector<float> c(5, static_cast<float>(world.rank() + 10));
  world.broadcast(c, n - 1);
  for (float x : c) ASSERT_EQ(x, static_cast<float>(n + 9));

  std::vector<double> s{1.0, static_cast<double>(world.rank())};
  world.sum(s);
  EXPECT_EQ(s[0], n);
  EXPECT_EQ(s[1], n * (n - 1) / 2);

  const std::vector<std::string> texts = world.gather("rank" + std::to_string(world.rank()), 0);
  if (world.rank() == 0) {
    ASSERT_EQ(static_cast<int>(texts.size()), n);
    EXPECT_EQ(texts[static_cast<std::size_t>(n - 1)], "rank" + std::to_string(n - 1));
  }
}

// Rank r touches rows {r, r + 10} of a [40, 3] matrix with value r + 1: the union is {0..n-1, 10..10+n-1} and
// each of its rows holds (r + 1) / n, every other row stays zero. With 40 rows the union stays sparse; with
// 4 rows it covers the matrix and the dense path runs; both must give the same closed form.
TEST(Communicator, AverageRowsSendsTheUnion) {
  comm::HostGroup world(MPI_COMM_WORLD);
  auto comm = comm::make_mpi_reducer(world);
  const int n = world.size();
  const int r = world.rank();
  for (const std::size_t total_rows : {std::size_t{40}, static_cast<std::size_t>(2 * n)}) {
    const std::size_t width = 3;
    const int32_t second = total_rows == 40 ? r + 10 : r + n;
    std::vector<float> matrix(total_rows * width, 0.0f);
    const std::vector<int32_t> mine{r, second};
    for (int32_t row : mine) {
      for (std::size_t j = 0; j < width; ++j)
        matrix[static_cast<std::size_t>(row) * width + j] = float(r + 1);
    }
    // A dense segment in flight beside the rows: both complete at finish_average().
    std::vector<float> dense(5, float(r + 1));
    comm->start_average(dense);
    const std::vector<int32_t> rows = comm->start_average_rows(matrix, width, mine);
    comm->finish_average();
    for (float x : dense) ASSERT_FLOAT_EQ(x, static_cast<float>(n + 1) / 2.0f);
    ASSERT_EQ(static_cast<int>(rows.size()), 2 * n);
    for (std::size_t row = 0; row < total_rows; ++row) {
      const auto it = std::find(rows.begin(), rows.end(), static_cast<int32_t>(row));
      const int offset = total_rows == 40 ? 10 : n;  // where each rank's second row starts
      const int owner = static_cast<int>(row) < n ? static_cast<int>(row) : static_cast<int>(row) - offset;
      const float expected = it == rows.end() ? 0.0f : static_cast<float>(owner + 1) / static_cast<float>(n);
      for (std::size_t j = 0; j < width; ++j) ASSERT_FLOAT_EQ(matrix[row * width + j], expected) << row;
    }
  }
}

TEST(Communicator, FirstErrorIsSharedByAllRanks) {
  comm::HostGroup world(MPI_COMM_WORLD);
  EXPECT_FALSE(world.first_error(std::nullopt).has_value());
  std::optional<std::string> mine;
  if (world.rank() >= 1) mine = "bad input on rank " + std::to_string(world.rank());
  const auto first = world.first_error(mine);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "bad input on rank 1");
}

// Each rank trains on its own data (through the trainer's step, sparse or dense embedding exchange, and with
// the delayed exchange of comm.overlap = delayed); after N steps (and the delayed one's flush) all replicas
// hold bit-identical parameters.
class ReplicasStayBitIdentical : public ::testing::TestWithParam<std::tuple<bool, bool>> {
};  // sparse, delayed

TEST_P(ReplicasStayBitIdentical, AfterTwelveSteps) {
  const auto [sparse, delayed] = GetParam();
  comm::HostGroup world(MPI_COMM_WORLD);
  auto comm = comm::make_mpi_reducer(world);
  const models::ModelShape shape{97, 12, 10, 2};
  auto replica = models::make_cpu_replica(shape);
  std::vector<float> initial(replica->layout().total_size());
  if (world.rank() == 0) models::initialize_keras(replica->layout(), initial, 7);
  world.broadcast(initial, 0);
  replica->copy_params_from_host(initial);
  auto adam = optim::make_optimizer(optim::OptimizerSettings{}, replica->layout().total_size());
  engine::AllReduceStep step(*replica, *comm, *adam, sparse, 0, delayed);
  for (int i = 0; i < 12; ++i) {
    const TokenBatch b =
        random_batch(8, 15, shape.vocab_size, 1000 * static_cast<uint64_t>(world.rank()) + i);
    step.run(b.view(0, b.batch));
  }
  step.flush();
  EXPECT_EQ(adam->iterations(), 12) << "every step's gradient applied";
  std::vector<float> reference(replica->params().begin(), replica->params().end());
  world.broadcast(reference, 0);
  EXPECT_EQ(std::memcmp(reference.data(), replica->params().data(), reference.size() * sizeof(float)), 0)
      << "rank " << world.rank() << " diverged from rank 0";
}

// The delayed exchange's sparse bookkeeping (the rows it copies aside, and those it clears after each apply)
// gives the parameters of its dense exchange, which has none: identical replicas alone would not show a row
// left over from an earlier step, averaged alike on every rank.
TEST(DataParallel, TheDelayedSparseExchangeEqualsTheDenseOne) {
  comm::HostGroup world(MPI_COMM_WORLD);
  auto comm = comm::make_mpi_reducer(world);
  const models::ModelShape shape{97, 12, 10, 2};
  std::vector<std::vector<float>> params;
  for (const bool sparse : {true, false}) {
    auto replica = models::make_cpu_replica(shape);
    std::vector<float> initial(replica->layout().total_size());
    models::initialize_keras(replica->layout(), initial, 7);
    replica->copy_params_from_host(initial);
    auto adam = optim::make_optimizer(optim::OptimizerSettings{}, replica->layout().total_size());
    engine::AllReduceStep step(*replica, *comm, *adam, sparse, 0, /*delayed=*/true);
    for (int i = 0; i < 12; ++i) {
      const TokenBatch b =
          random_batch(8, 15, shape.vocab_size, 1000 * static_cast<uint64_t>(world.rank()) + i);
      step.run(b.view(0, b.batch));
    }
    step.flush();
    params.emplace_back(replica->params().begin(), replica->params().end());
  }
  double largest = 0;
  for (std::size_t i = 0; i < params[0].size(); ++i)
    largest = std::max(largest, static_cast<double>(std::abs(params[0][i] - params[1][i])));
  EXPECT_LT(largest, 1e-6) << "rank " << world.rank();
}

INSTANTIATE_TEST_SUITE_P(DataParallel, ReplicasStayBitIdentical,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()), [](const auto& test) {
                           return std::string(std::get<0>(test.param) ? "Sparse" : "Dense") +
                                  (std::get<1>(test.param) ? "Delayed" : "");
                         });

// A replica that finishes its segments front to back (embedding first, dense last): the opposite of the order
// the step starts their reductions in, and not the CPU replica's own.
class FrontToBackReplica final : public ddp::testing::ForwardingReplica {
 public:
  using ForwardingReplica::ForwardingReplica;
  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    inner().train_step(batch, {});
    for (const models::ParamSegment& segment : layout().segments()) on_ready(segment);
  }
};

// Ranks whose replicas report their segments in different orders (a GPU rank and a CPU rank of one job, which
// exchange the embedding densely) still pair up their reductions: every rank ends bit-identical to a run
// where all ranks report alike.
TEST(DataParallel, RanksReportingSegmentsInOtherOrdersAverageTheSameOnes) {
  comm::HostGroup world(MPI_COMM_WORLD);
  auto comm = comm::make_mpi_reducer(world);
  const models::ModelShape shape{53, 6, 5, 2};
  std::vector<float> initial(models::ParamLayout(shape).total_size());
  models::initialize_keras(models::ParamLayout(shape), initial, 9);
  std::vector<std::vector<float>> results;
  for (const bool mixed : {false, true}) {
    std::unique_ptr<models::Replica> replica = models::make_cpu_replica(shape);
    if (mixed && world.rank() % 2 == 1) replica = std::make_unique<FrontToBackReplica>(std::move(replica));
    replica->copy_params_from_host(initial);
    auto adam = optim::make_optimizer(optim::OptimizerSettings{}, replica->layout().total_size());
    engine::AllReduceStep step(*replica, *comm, *adam, /*sparse_exchange=*/false);
    for (int i = 0; i < 4; ++i) {
      const TokenBatch b =
          random_batch(6, 9, shape.vocab_size, 100 * static_cast<uint64_t>(world.rank()) + i);
      step.run(b.view(0, b.batch));
    }
    results.emplace_back(replica->params().begin(), replica->params().end());
  }
  ASSERT_NE(results[0], initial);
  EXPECT_EQ(results[1], results[0]) << "rank " << world.rank();
}

// 2 ranks x batch 16 give the same update as 1 rank x batch 32 (SGD with momentum, so the update is linear in
// the gradient and rounding differences stay at rounding size).
class TwoBySixteen : public ::testing::TestWithParam<bool> {};  // param: sparse embedding exchange

TEST_P(TwoBySixteen, EqualsOneRankOfThirtyTwo) {
  const int rank = world_rank();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : 1, rank, &pair);
  const bool in_pair = rank < 2 && world_size() >= 2;
  if (in_pair) {
    comm::HostGroup world(pair);
    auto comm = comm::make_mpi_reducer(world);
    const models::ModelShape shape{61, 16, 12, 1};
    optim::OptimizerSettings sgd;
    sgd.name = "sgd";
    sgd.learning_rate = 0.5;
    sgd.momentum = 0.9;

    auto single = models::make_cpu_replica(shape);
    auto split = models::make_cpu_replica(shape);
    models::initialize_keras(single->layout(), single->params(), 3);
    models::initialize_keras(split->layout(), split->params(), 3);
    auto single_opt = optim::make_optimizer(sgd, single->layout().total_size());
    auto split_opt = optim::make_optimizer(sgd, split->layout().total_size());
    engine::AllReduceStep split_step(*split, *comm, *split_opt, GetParam());
    for (int step = 0; step < 4; ++step) {
      const TokenBatch b = random_batch(32, 20, shape.vocab_size, 500 + static_cast<uint64_t>(step));
      single->train_step(b.view(0, 32), {});
      single_opt->step(single->params(), single->grads());
      split_step.run(b.view(16 * world.rank(), 16));
    }
    double max_diff = 0;
    double max_change = 0;
    std::vector<float> initial(single->layout().total_size());
    models::initialize_keras(single->layout(), initial, 3);
    for (std::size_t i = 0; i < initial.size(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(single->params()[i] - split->params()[i])));
      max_change = std::max(max_change, static_cast<double>(std::fabs(single->params()[i] - initial[i])));
    }
    EXPECT_GT(max_change, 1e-2) << "the updates are too small for the comparison to mean anything";
    EXPECT_LT(max_diff, 1e-5) << "largest parameter difference between 2x16 and 1x32";
  }
  MPI_Comm_free(&pair);
}

INSTANTIATE_TEST_SUITE_P(DataParallel, TwoBySixteen, ::testing::Values(false, true),
                         [](const auto& test) { return test.param ? "SparseEmbedding" : "DenseEmbedding"; });

}  // namespace
}  // namespace ddp

// Data parallelism across MPI ranks: the communicator's closed forms, replicas staying bit-identical, and
// gradient averaging giving the same update as one replica on the whole batch.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>
#include <random>

#include "comm/communicator.h"
#include "engine/optimizer.h"
#include "models/initializers.h"
#include "models/replica.h"

namespace ddp {
namespace {

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

struct TokenBatch {
  std::vector<int32_t> tokens;
  std::vector<float> labels;
  int batch = 0;
  int seq = 0;
  models::BatchView view(int first, int count) const {
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
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  const int n = comm->size();
  std::vector<float> a(1000, static_cast<float>(comm->rank()));
  std::vector<float> b(7, static_cast<float>(2 * comm->rank() + 1));
  comm->start_average(a);
  comm->start_average(b);
  comm->finish_average();
  for (float x : a) ASSERT_FLOAT_EQ(x, static_cast<float>(n - 1) / 2.0f);
  for (float x : b) ASSERT_FLOAT_EQ(x, static_cast<float>(n));  // mean of 1, 3, 5, ... = n

  std::vector<float> c(5, static_cast<float>(comm->rank() + 10));
  comm->broadcast(c, n - 1);
  for (float x : c) ASSERT_EQ(x, static_cast<float>(n + 9));

  std::vector<double> s{1.0, static_cast<double>(comm->rank())};
  comm->sum(s);
  EXPECT_EQ(s[0], n);
  EXPECT_EQ(s[1], n * (n - 1) / 2);

  const std::vector<std::string> texts = comm->gather("rank" + std::to_string(comm->rank()), 0);
  if (comm->rank() == 0) {
    ASSERT_EQ(static_cast<int>(texts.size()), n);
    EXPECT_EQ(texts[static_cast<std::size_t>(n - 1)], "rank" + std::to_string(n - 1));
  }
}

TEST(Communicator, FirstErrorIsSharedByAllRanks) {
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  EXPECT_FALSE(comm->first_error(std::nullopt).has_value());
  std::optional<std::string> mine;
  if (comm->rank() >= 1) mine = "bad input on rank " + std::to_string(comm->rank());
  const auto first = comm->first_error(mine);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "bad input on rank 1");
}

// Each rank trains on its own data; after N steps all replicas hold bit-identical parameters.
TEST(DataParallel, ReplicasStayBitIdentical) {
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  const models::ModelShape shape{97, 12, 10, 2};
  auto replica = models::make_cpu_replica(shape);
  if (comm->rank() == 0) models::initialize_keras(replica->layout(), replica->params(), 7);
  comm->broadcast(replica->params(), 0);
  auto adam = engine::make_optimizer(engine::OptimizerSettings{}, replica->layout().total_size());
  std::span<float> grads = replica->grads();
  for (int step = 0; step < 12; ++step) {
    const TokenBatch b = random_batch(8, 15, shape.vocab_size, 1000 * static_cast<uint64_t>(comm->rank()) + step);
    replica->train_step(b.view(0, b.batch), [&](const models::ParamSegment& s) {
      comm->start_average(grads.subspan(s.offset, s.size));
    });
    comm->finish_average();
    adam->step(replica->params(), grads);
  }
  std::vector<float> reference(replica->params().begin(), replica->params().end());
  comm->broadcast(reference, 0);
  EXPECT_EQ(std::memcmp(reference.data(), replica->params().data(), reference.size() * sizeof(float)), 0)
      << "rank " << comm->rank() << " diverged from rank 0";
}

// 2 ranks x batch 16 give the same update as 1 rank x batch 32 (SGD with momentum, so the update is linear in
// the gradient and rounding differences stay at rounding size).
TEST(DataParallel, TwoRanksOfSixteenEqualOneRankOfThirtyTwo) {
  const int rank = world_rank();
  MPI_Comm pair = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : 1, rank, &pair);
  const bool in_pair = rank < 2 && world_size() >= 2;
  if (in_pair) {
    auto comm = comm::make_mpi_communicator(pair);
    const models::ModelShape shape{61, 16, 12, 1};
    engine::OptimizerSettings sgd;
    sgd.name = "sgd";
    sgd.learning_rate = 0.5;
    sgd.momentum = 0.9;

    auto single = models::make_cpu_replica(shape);
    auto split = models::make_cpu_replica(shape);
    models::initialize_keras(single->layout(), single->params(), 3);
    models::initialize_keras(split->layout(), split->params(), 3);
    auto single_opt = engine::make_optimizer(sgd, single->layout().total_size());
    auto split_opt = engine::make_optimizer(sgd, split->layout().total_size());
    std::span<float> grads = split->grads();
    for (int step = 0; step < 4; ++step) {
      const TokenBatch b = random_batch(32, 20, shape.vocab_size, 500 + static_cast<uint64_t>(step));
      single->train_step(b.view(0, 32), {});
      single_opt->step(single->params(), single->grads());
      split->train_step(b.view(16 * comm->rank(), 16), [&](const models::ParamSegment& s) {
        comm->start_average(grads.subspan(s.offset, s.size));
      });
      comm->finish_average();
      split_opt->step(split->params(), grads);
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

}  // namespace
}  // namespace ddp

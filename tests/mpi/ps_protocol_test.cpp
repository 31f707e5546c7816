// The parameter-server protocol on a toy problem without a model: parameters p in R^n, worker w has a fixed
// target a_w and the gradient p - a_w plus noise seeded by (worker, step); the servers apply SGD to their
// shards. The last K ranks serve, the others work; with 2 ranks there is one worker and one server.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/ps_protocol.h"
#include "comm/wire_cast.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

using ddp::testing::SharedDir;
using ddp::testing::world_rank;
using ddp::testing::world_size;

using comm::PsOptions;
using comm::PsRoles;

constexpr float kLearningRate = 0.1f;

// The update every server applies to its shard; the reference applies it to the whole vector.
void sgd(std::span<float> params, std::span<const float> grads) {
  for (std::size_t i = 0; i < params.size(); ++i) params[i] -= kLearningRate * grads[i];
}

std::vector<float> initial_params(std::size_t n) {
  std::vector<float> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = 0.1f * static_cast<float>(i % 7);
  return p;
}

// Targets spread around base[i] = 1 + 0.5 (i mod 5) by 0.2 per worker; their mean is what async converges to.
std::vector<float> target(int worker, int workers, std::size_t n) {
  std::vector<float> a(n);
  const float offset = 0.2f * (static_cast<float>(worker) - 0.5f * static_cast<float>(workers - 1));
  for (std::size_t i = 0; i < n; ++i) a[i] = 1.0f + 0.5f * static_cast<float>(i % 5) + offset;
  return a;
}

std::vector<double> mean_target(int workers, std::size_t n) {
  std::vector<double> mean(n, 0.0);
  for (int w = 0; w < workers; ++w) {
    const std::vector<float> a = target(w, workers, n);
    for (std::size_t i = 0; i < n; ++i) mean[i] += static_cast<double>(a[i]) / workers;
  }
  return mean;
}

std::vector<float> gradient(int worker, int workers, int64_t step, std::span<const float> params) {
  const std::vector<float> a = target(worker, workers, params.size());
  std::mt19937 rng(static_cast<uint32_t>(1000 * worker + step));
  std::uniform_real_distribution<float> noise(-0.05f, 0.05f);
  std::vector<float> g(params.size());
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = params[i] - a[i] + noise(rng);
  return g;
}

// For the row-sparse cases: a 60 x 16 matrix at offset 10, as an embedding inside the flat vector.
constexpr comm::RowRegion kRows{10, 60, 16};

// The rows of kRows that worker w's step t touches (about one in five, different per worker and step).
std::vector<int32_t> touched_rows(int worker, int64_t step) {
  std::vector<int32_t> rows;
  for (int32_t r = 0; r < static_cast<int32_t>(kRows.rows); ++r) {
    if ((7 * r + 3 * worker + step) % 5 == 0) rows.push_back(r);
  }
  return rows;
}

// gradient(), and for a row-sparse case zero in kRows outside the touched rows, as a CPU replica's
// embedding gradient is.
std::vector<float> step_gradient(bool row_sparse, int worker, int workers, int64_t step,
                                 std::span<const float> params) {
  std::vector<float> g = gradient(worker, workers, step, params);
  if (!row_sparse) return g;
  std::vector<char> touched(kRows.rows, 0);
  for (const int32_t r : touched_rows(worker, step)) touched[static_cast<std::size_t>(r)] = 1;
  for (std::size_t r = 0; r < kRows.rows; ++r) {
    if (!touched[r])
      std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(kRows.offset + r * kRows.width), kRows.width, 0.0f);
  }
  return g;
}

float through_bfloat16(float x) {
  return comm::bfloat16_to_float(comm::float_to_bfloat16(x));
}

// The synchronous server's arithmetic done locally: gradients summed in worker order, scaled by 1/W, SGD.
// bf16 (PsOptions::wire): each gradient rounded to bfloat16 before the sum, and the update rounded to
// bfloat16 before it is added.
void reference_step(std::vector<float>& params, int workers, int64_t step, bool row_sparse,
                    bool bf16 = false) {
  std::vector<float> mean(params.size(), 0.0f);
  for (int w = 0; w < workers; ++w) {
    std::vector<float> g = step_gradient(row_sparse, w, workers, step, params);
    if (bf16) std::transform(g.begin(), g.end(), g.begin(), through_bfloat16);
    if (w == 0) mean = g;
    for (std::size_t i = 0; w > 0 && i < mean.size(); ++i) mean[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(workers);
  for (float& x : mean) x *= scale;
  std::vector<float> updated = params;
  sgd(updated, mean);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i] = bf16 ? params[i] + through_bfloat16(updated[i] - params[i]) : updated[i];
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  if (a.size() != b.size()) return false;
  return a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;  // empty: null data
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return diff;
}

// True on every worker iff all workers hold the same bits as the first one.
bool workers_agree(MPI_Comm workers, std::span<const float> params) {
  std::vector<float> first(params.begin(), params.end());
  MPI_Bcast(first.data(), static_cast<int>(first.size()), MPI_FLOAT, 0, workers);
  int same = same_bits(first, params) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, workers);
  return same == 1;
}

// The servers' shard of `params`.
std::vector<float> shard_of(const PsRoles& roles, int rank, std::span<const float> params) {
  const int j = roles.server_index(rank);
  const std::size_t begin = roles.shard_begin(j, params.size());
  const std::size_t end = roles.shard_end(j, params.size());
  return {params.begin() + begin, params.begin() + end};
}

struct SyncCase {
  int servers;
  std::size_t size;
  bool row_sparse = false;  // gradients zero in kRows outside each step's touched rows, pushed as such
  comm::WireFormat wire = comm::WireFormat::kFloat;  // PsOptions::wire
};

class SyncParameterServer : public ::testing::TestWithParam<SyncCase> {};

// (a) after every step the workers hold exactly the parameters of SGD on the average of all workers'
// gradients computed locally, and within rounding those of the all-reduce backend; (b) all workers agree
// bit for bit after each step. A pull between steps (as evaluation would) changes nothing. Row-sparse pushes
// give the same bits as dense ones, in fewer bytes. Under bf16 the same holds of the gradients and updates
// rounded to bfloat16, in half the bytes; under fp16 (a scale per message) (b), closeness and the bytes.
TEST_P(SyncParameterServer, EqualsSgdOnTheAveragedGradients) {
  const auto [servers, n, row_sparse, wire] = GetParam();
  // The reference rounds as bfloat16 does; fp16's scale per message is checked by agreement and closeness.
  const bool bf16 = wire == comm::WireFormat::kBfloat16;
  const bool fp16 = wire == comm::WireFormat::kHalf;
  if (servers >= world_size())
    GTEST_SKIP() << servers << " servers need more than " << world_size() << " ranks";
  const int rank = world_rank();
  const PsRoles roles = PsRoles::make(world_size(), servers);
  const int workers = roles.workers();
  PsOptions options;
  options.servers = servers;
  options.timeout_s = 30;
  if (row_sparse) options.sparse_exchange_rows = kRows;
  options.wire = wire;
  constexpr int kSteps = 20;

  std::vector<float> reference = initial_params(n);
  MPI_Comm worker_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, roles.is_server(rank) ? 1 : 0, rank, &worker_comm);

  if (roles.is_server(rank)) {
    std::vector<float> shard = shard_of(roles, rank, reference);
    const comm::PsServerStats stats = comm::run_parameter_server(MPI_COMM_WORLD, options, n, shard, sgd);
    for (int t = 0; t < kSteps; ++t) reference_step(reference, workers, t, row_sparse, bf16);
    const auto dense_bytes = static_cast<int64_t>(workers * kSteps * shard.size() * sizeof(float));
    const int64_t exponent_words = fp16 ? workers * kSteps * 2 : 0;  // fp16's scale, a word per push
    if (row_sparse) {
      EXPECT_LT(stats.gradient_bytes, dense_bytes / (bf16 || fp16 ? 3 : 2))
          << "row-sparse pushes must be smaller";
    } else {
      EXPECT_EQ(stats.gradient_bytes, bf16 || fp16 ? dense_bytes / 2 + exponent_words : dense_bytes);
    }
    EXPECT_EQ(stats.steps, kSteps);
    EXPECT_EQ(stats.updates, kSteps);
    EXPECT_LE(stats.max_gap, 1);
    if (!fp16) {
      EXPECT_TRUE(same_bits(shard, shard_of(roles, rank, reference))) << "server rank " << rank;
    }
  } else {
    comm::ParameterClient client(MPI_COMM_WORLD, options, n);
    comm::HostGroup workers_group(worker_comm);
    auto allreduce = comm::make_mpi_reducer(workers_group);
    std::vector<float> params(n, std::numeric_limits<float>::quiet_NaN());
    client.pull(params);
    EXPECT_TRUE(same_bits(params, reference)) << "the initial pull must return the servers' shards";
    std::vector<float> allreduce_params = reference;

    bool exact = true;
    bool agree = true;
    double allreduce_diff = 0;
    for (int t = 0; t < kSteps; ++t) {
      const std::vector<float> g = step_gradient(row_sparse, rank, workers, t, params);
      if (row_sparse) {
        client.push_pull(g, touched_rows(rank, t), params);
      } else {
        client.push_pull(g, params);
      }
      reference_step(reference, workers, t, row_sparse, bf16);
      exact = exact && (fp16 || same_bits(params, reference));
      agree = workers_agree(worker_comm, params) && agree;

      std::vector<float> reduced = step_gradient(row_sparse, rank, workers, t, allreduce_params);
      allreduce->average(reduced);
      sgd(allreduce_params, reduced);
      allreduce_diff = std::max(allreduce_diff, max_abs_diff(params, allreduce_params));

      if (t == kSteps / 2) {
        std::vector<float> pulled(n, std::numeric_limits<float>::quiet_NaN());
        client.pull(pulled);
        EXPECT_TRUE(same_bits(pulled, params)) << "a pull between steps must return the current parameters";
      }
    }
    EXPECT_EQ(client.step(), kSteps);
    EXPECT_TRUE(exact) << "worker rank " << rank << " differs from SGD on the averaged gradients";
    EXPECT_TRUE(agree) << "workers hold different parameters";
    // bf16: rounding of about 2^-9 of each gradient and update, which SGD's contraction keeps bounded.
    EXPECT_LT(allreduce_diff, bf16 || fp16 ? 0.05 : 1e-6) << "largest difference from the all-reduce backend";
    if (bf16 || fp16) {
      EXPECT_GT(allreduce_diff, 0) << "bf16 must round something";
    }
    EXPECT_GT(max_abs_diff(params, initial_params(n)), 0.5) << "the updates are too small to mean anything";
    client.finish();
  }
  MPI_Comm_free(&worker_comm);
}

INSTANTIATE_TEST_SUITE_P(ParameterServer, SyncParameterServer,
                         ::testing::Values(SyncCase{1, 1001}, SyncCase{2, 1001}, SyncCase{2, 1},
                                           SyncCase{1, 1001, true}, SyncCase{2, 1001, true},
                                           SyncCase{1, 1001, false, comm::WireFormat::kBfloat16},
                                           SyncCase{2, 1001, true, comm::WireFormat::kBfloat16},
                                           SyncCase{1, 1001, false, comm::WireFormat::kHalf},
                                           SyncCase{2, 1001, true, comm::WireFormat::kHalf}),
                         [](const auto& test) {
                           return std::to_string(test.param.servers) + "Servers" +
                                  std::to_string(test.param.size) + "Params" +
                                  (test.param.row_sparse ? "RowSparse" : "") +
                                  (test.param.wire == comm::WireFormat::kBfloat16 ? "Bf16"
                                   : test.param.wire == comm::WireFormat::kHalf   ? "Fp16"
                                                                                  : "");
                         });

class AsyncParameterServer : public ::testing::TestWithParam<int> {};  // param: servers

// (c) async with max_staleness 2 and a straggler (the last worker sleeps 5 ms a step): the parameters reach
// the mean target, every gradient is applied once, and no worker's push count gets more than s + 1 ahead of
// the slowest's on any server.
TEST_P(AsyncParameterServer, ConvergesWithBoundedStaleness) {
  const int servers = GetParam();
  if (servers >= world_size())
    GTEST_SKIP() << servers << " servers need more than " << world_size() << " ranks";
  const int rank = world_rank();
  const PsRoles roles = PsRoles::make(world_size(), servers);
  const int workers = roles.workers();
  constexpr std::size_t n = 257;
  constexpr int kSteps = 60;
  PsOptions options;
  options.servers = servers;
  options.async = true;
  options.max_staleness = 2;
  options.timeout_s = 30;

  const std::vector<double> mean = mean_target(workers, n);
  const auto distance_to_mean = [&](std::span<const float> p, std::size_t offset) {
    double d = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      d = std::max(d, std::fabs(static_cast<double>(p[i]) - mean[offset + i]));
    return d;
  };
  MPI_Comm worker_comm = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, roles.is_server(rank) ? 1 : 0, rank, &worker_comm);

  if (roles.is_server(rank)) {
    std::vector<float> shard = shard_of(roles, rank, initial_params(n));
    const comm::PsServerStats stats = comm::run_parameter_server(MPI_COMM_WORLD, options, n, shard, sgd);
    EXPECT_EQ(stats.updates, static_cast<int64_t>(workers) * kSteps);
    EXPECT_LE(stats.max_gap, options.max_staleness + 1) << "a worker got too far ahead";
    if (workers >= 2) {
      EXPECT_GE(stats.max_gap, 1) << "the straggler never fell behind: the test shows nothing";
    }
    const std::size_t offset = roles.shard_begin(roles.server_index(rank), n);
    EXPECT_LT(distance_to_mean(shard, offset), 0.1) << "server rank " << rank;
    if (rank == world_size() - 1)
      std::printf("async: largest push gap seen by server rank %d: %lld\n", rank,
                  static_cast<long long>(stats.max_gap));
  } else {
    comm::ParameterClient client(MPI_COMM_WORLD, options, n);
    std::vector<float> params(n);
    client.pull(params);
    const bool straggler = rank == workers - 1;
    for (int t = 0; t < kSteps; ++t) {
      if (straggler) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      client.push_pull(gradient(rank, workers, t, params), params);
    }
    MPI_Barrier(worker_comm);  // every gradient is in: the servers' shards are final
    client.pull(params);
    EXPECT_TRUE(workers_agree(worker_comm, params));
    EXPECT_LT(distance_to_mean(params, 0), 0.1) << "worker rank " << rank;
    EXPECT_GT(distance_to_mean(initial_params(n), 0), 0.5) << "the start must be far from the target";
    client.finish();
  }
  MPI_Comm_free(&worker_comm);
}

INSTANTIATE_TEST_SUITE_P(ParameterServer, AsyncParameterServer, ::testing::Values(1, 2),
                         [](const auto& test) { return std::to_string(test.param) + "Servers"; });

// (d) the shards cover [0, total) once, in order, as evenly as possible (larger shards first).
// A dedicated server is not among the training ranks that agree on a stop: its replies carry the stop signal
// its process received, and every worker's client reports it from the first reply that says so.
TEST(ParameterServer, RepliesCarryTheServersStopSignal) {
  if (world_size() < 2) GTEST_SKIP() << "a server and a worker need 2 ranks";
  const PsRoles roles = PsRoles::make(world_size(), 1);
  const int rank = world_rank();
  constexpr std::size_t kSize = 64;
  PsOptions options;
  options.servers = 1;
  options.timeout_s = 30;
  std::vector<float> params = initial_params(kSize);
  if (roles.is_server(rank)) {
    int replies = 0;  // the signal "arrives" after step 1's replies
    options.stop_signal = [&] { return ++replies > 2 * roles.workers() ? SIGTERM : 0; };
    comm::run_parameter_server(MPI_COMM_WORLD, options, kSize, params, sgd);
  } else {
    comm::ParameterClient client(MPI_COMM_WORLD, options, kSize);
    const std::vector<float> zeros(kSize, 0.0f);
    std::vector<int> seen;
    for (int t = 0; t < 4; ++t) {
      client.push_pull(zeros, params);
      seen.push_back(client.servers_stop_signal());
    }
    EXPECT_EQ(seen, (std::vector<int>{0, 0, SIGTERM, SIGTERM})) << "worker rank " << rank;
    client.finish();
  }
}

TEST(ParameterServer, ShardsCoverTheVectorOnce) {
  const std::pair<std::size_t, int> cases[] = {{0, 1}, {1, 1}, {10, 3},  {1001, 2},
                                               {3, 5}, {7, 7}, {100, 1}, {1000003, 4}};
  for (const auto& [total, servers] : cases) {
    const PsRoles roles = PsRoles::make(servers + 2, servers);
    EXPECT_EQ(roles.workers(), 2);
    EXPECT_FALSE(roles.is_server(1));
    EXPECT_TRUE(roles.is_server(2));
    EXPECT_EQ(roles.server_rank(servers - 1), servers + 1);
    std::size_t covered = 0;
    for (int j = 0; j < servers; ++j) {
      const std::size_t begin = roles.shard_begin(j, total);
      const std::size_t end = roles.shard_end(j, total);
      ASSERT_EQ(begin, covered) << total << " over " << servers << ", server " << j;
      ASSERT_LE(begin, end);
      const std::size_t size = end - begin;
      EXPECT_TRUE(size == total / servers || size == total / servers + 1);
      if (j > 0) {
        EXPECT_LE(size, roles.shard_end(j - 1, total) - roles.shard_begin(j - 1, total));
      }
      covered = end;
    }
    EXPECT_EQ(covered, total) << total << " over " << servers;
  }
  EXPECT_THROW(PsRoles::make(2, 2), UserError);  // no worker left
  EXPECT_THROW(PsRoles::make(4, 0), UserError);
}

// (e) the header check that guards every message: matching headers pass, a wrong step or kind yields one
// line naming both steps and both ranks. (The real path ends the job through DDP_FATAL.)
TEST(ParameterServer, HeaderMismatchNamesStepsAndRanks) {
  using comm::PsKind;
  const auto grads = static_cast<int64_t>(PsKind::kGrads);
  const int grads_tag = static_cast<int>(PsKind::kGrads);
  EXPECT_EQ(comm::ps_header_error({4, grads}, grads_tag, PsKind::kGrads, 4, 1, 3, true), "");

  const std::string step = comm::ps_header_error({5, grads}, grads_tag, PsKind::kGrads, 4, 1, 3, true);
  EXPECT_EQ(
      step,
      "worker rank 1 sent grads for step 5 but parameter server rank 3 expected step 4: workers and servers "
      "disagree on the step");

  const auto params = static_cast<int64_t>(PsKind::kParams);
  const int params_tag = static_cast<int>(PsKind::kParams);
  const std::string reply = comm::ps_header_error({7, params}, params_tag, PsKind::kParams, 6, 2, 0, false);
  EXPECT_NE(reply.find("parameter server rank 2"), std::string::npos) << reply;
  EXPECT_NE(reply.find("worker rank 0"), std::string::npos) << reply;
  EXPECT_NE(reply.find("step 7"), std::string::npos) << reply;
  EXPECT_NE(reply.find("step 6"), std::string::npos) << reply;

  const std::string kind = comm::ps_header_error({4, params}, grads_tag, PsKind::kGrads, 4, 1, 3, true);
  EXPECT_NE(kind.find("params header with tag grads"), std::string::npos) << kind;

  // A reply's stop signal is a signal number or 0; anything else is a corrupt header, not a signal to relay.
  EXPECT_EQ(comm::ps_header_error({6, params, SIGTERM}, params_tag, PsKind::kParams, 6, 2, 0, false), "");
  for (const int64_t bad : {int64_t{-1}, int64_t{NSIG}, int64_t{1} << 40}) {
    const std::string signal =
        comm::ps_header_error({6, params, bad}, params_tag, PsKind::kParams, 6, 2, 0, false);
    EXPECT_NE(signal.find("with stop signal " + std::to_string(bad) + ", which is no signal number"),
              std::string::npos)
        << signal;
  }
}

}  // namespace
}  // namespace ddp

// The MPI all-reduce's hierarchy (comm.hierarchy, mpi_reducer.cpp) on pseudo-nodes of one machine
// (MpiReducerOptions::test_node): at 4 ranks 2 nodes of 2, at 3 ranks nodes of 2 and 1, in blocks of
// consecutive ranks and interleaved. Its average equals the flat all-reduce's within float rounding, every
// rank holds the same bits, with several segments in flight and over repeated steps; on a 16-bit wire its
// average is, bit for bit, the node sums' exchange across the leaders worked out here; where it does not
// apply (one node, a node per rank, off) the reducer is the flat one, bit for bit.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/wire_payload.h"
#include "engine/base/errors.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

// The segments of one step: odd sizes, one float, one large, many small.
std::vector<std::size_t> segment_sizes() {
  std::vector<std::size_t> sizes{7, 1, 4099, 100003};
  sizes.insert(sizes.end(), 20, 100);
  return sizes;
}

// Averages `data` segment by segment, every segment started before any finishes.
void average_in_segments(comm::GradientReducer& reducer, std::vector<float>& data) {
  std::size_t at = 0;
  for (const std::size_t n : segment_sizes()) {
    reducer.start_average(std::span<float>(data).subspan(at, n));
    at += n;
  }
  reducer.finish_average();
}

std::size_t total_size() {
  std::size_t total = 0;
  for (const std::size_t n : segment_sizes()) total += n;
  return total;
}

// Pseudo-nodes: consecutive pairs of ranks (0 1 | 2 3, or 0 1 | 2), or ranks interleaved (0 2 | 1 3).
int paired(int rank, int) {
  return rank / 2;
}
int interleaved(int rank, int) {
  return rank % 2;
}
int own_node(int rank, int) {
  return rank;
}
int one_node(int, int) {
  return 7;
}

TEST(MpiHierarchy, AppliesWhereNodesShareRanksAndTheJobSpansSeveral) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  const comm::MpiHierarchy pairs = comm::mpi_hierarchy(world, {"none", "auto", paired(world.rank(), n)});
  EXPECT_EQ(pairs.on, n >= 3);
  EXPECT_EQ(pairs.nodes, (n + 1) / 2);
  EXPECT_EQ(pairs.largest_node, std::min(n, 2));
  EXPECT_FALSE(comm::mpi_hierarchy(world, {"none", "off", paired(world.rank(), n)}).on);
  EXPECT_EQ(comm::mpi_hierarchy(world, {"bf16", "auto", paired(world.rank(), n)}).on, n >= 3);
  EXPECT_EQ(comm::mpi_hierarchy(world, {"fp16", "auto", paired(world.rank(), n)}).on, n >= 3);
  EXPECT_FALSE(comm::mpi_hierarchy(world, {"none", "auto", own_node(world.rank(), n)}).on);
  EXPECT_FALSE(comm::mpi_hierarchy(world, {"none", "auto", one_node(world.rank(), n)}).on);
  EXPECT_FALSE(comm::mpi_hierarchy(world, {}).on) << "ctest runs every rank on one node";
  EXPECT_THROW(comm::mpi_hierarchy(world, {"none", "on"}), UserError);
}

TEST(MpiHierarchy, AveragesAsTheFlatAllReduceWithTheSameBitsOnEveryRank) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  if (n < 3) GTEST_SKIP() << "2 ranks make no node of several ranks beside another node";
  auto flat = comm::make_mpi_reducer(world, comm::MpiReducerOptions{"none", "off"});
  for (const auto node_of : {paired, interleaved}) {
    const comm::MpiReducerOptions options{"none", "auto", node_of(world.rank(), n)};
    ASSERT_TRUE(comm::mpi_hierarchy(world, options).on);
    auto hierarchical = comm::make_mpi_reducer(world, options);
    for (int step = 0; step < 3; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      std::vector<float> expected = testing::rounding_gradients(world.rank(), step, total_size());
      std::vector<float> got = expected;
      average_in_segments(*flat, expected);
      average_in_segments(*hierarchical, got);
      ASSERT_TRUE(testing::same_bits_everywhere(world, got)) << "the replicas would drift apart";
      double largest = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        // A sum of n terms in another order: a few units of the last place of the largest term.
        const double scale = std::max(1.0, static_cast<double>(n) * std::abs(expected[i]));
        largest = std::max(largest, std::abs(static_cast<double>(got[i]) - expected[i]) / scale);
      }
      EXPECT_LT(largest, 4.0 * n * 1.2e-7) << "relative to the flat average";
    }
  }
}

// `values` in `format` and back, as the wire carries them (fp16: scaled by its own power of two).
std::vector<float> through_the_wire(std::span<const float> values, comm::WireFormat format) {
  std::vector<unsigned char> bytes(comm::wire_payload_bytes(values.size(), 0, format));
  comm::encode_values(values, bytes.data(), format);
  std::vector<float> back(values.size());
  comm::decode_values(bytes.data(), values.size(), format, back.data());
  return back;
}

// The hierarchy's average on a 16-bit wire, worked out from every rank's gradients: each node's sum in float
// in node rank order; the leaders (in rank order) split each segment into one chunk per leader, and chunk
// c's average is the sum, in leader order, of every leader's chunk c through the wire, times 1/size, itself
// through the wire once.
std::vector<float> expected_16_bit_average(const std::vector<std::vector<float>>& of_rank,
                                           const std::vector<int>& node_of, comm::WireFormat format) {
  const int ranks = static_cast<int>(of_rank.size());
  std::vector<int> leaders;  // each node's lowest rank, in rank order
  std::vector<std::vector<float>> node_sums;
  for (int r = 0; r < ranks; ++r) {
    const int leader =
        static_cast<int>(std::find(node_of.begin(), node_of.end(), node_of[r]) - node_of.begin());
    if (leader == r) {
      leaders.push_back(r);
      node_sums.push_back(of_rank[r]);
      continue;
    }
    const auto node =
        static_cast<std::size_t>(std::find(leaders.begin(), leaders.end(), leader) - leaders.begin());
    for (std::size_t i = 0; i < of_rank[r].size(); ++i) node_sums[node][i] += of_rank[r][i];
  }
  const std::size_t chunks = leaders.size();
  std::vector<float> average(of_rank[0].size());
  std::size_t at = 0;
  for (const std::size_t n : segment_sizes()) {
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t begin = at + n * c / chunks;
      const std::size_t end = at + n * (c + 1) / chunks;
      std::vector<float> sum(end - begin, 0.0f);
      for (const std::vector<float>& node_sum : node_sums) {
        const std::vector<float> wired =
            through_the_wire(std::span<const float>(node_sum).subspan(begin, end - begin), format);
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += wired[i];
      }
      for (float& x : sum) x *= 1.0f / static_cast<float>(ranks);
      const std::vector<float> wired = through_the_wire(sum, format);
      std::copy(wired.begin(), wired.end(), average.begin() + static_cast<std::ptrdiff_t>(begin));
    }
    at += n;
  }
  return average;
}

TEST(MpiHierarchy, SixteenBitWiresCrossTheLinksOnlyBetweenTheNodeSums) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  if (n < 3) GTEST_SKIP() << "2 ranks make no node of several ranks beside another node";
  for (const std::string compression : {"bf16", "fp16"}) {
    for (const auto node_of : {paired, interleaved}) {
      SCOPED_TRACE(compression);
      const comm::MpiReducerOptions options{compression, "auto", node_of(world.rank(), n)};
      ASSERT_TRUE(comm::mpi_hierarchy(world, options).on);
      auto reducer = comm::make_mpi_reducer(world, options);
      std::vector<int> nodes;
      for (int r = 0; r < n; ++r) nodes.push_back(node_of(r, n));
      for (int step = 0; step < 2; ++step) {
        std::vector<std::vector<float>> of_rank;
        for (int r = 0; r < n; ++r) of_rank.push_back(testing::rounding_gradients(r, step, total_size()));
        std::vector<float> got = of_rank[static_cast<std::size_t>(world.rank())];
        average_in_segments(*reducer, got);
        ASSERT_TRUE(testing::same_bits_everywhere(world, got)) << "the replicas would drift apart";
        const std::vector<float> expected =
            expected_16_bit_average(of_rank, nodes, comm::wire_format(compression));
        std::size_t differ = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          differ += std::memcmp(&got[i], &expected[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << "values of " << got.size() << " differ from the node sums' 16-bit exchange";
      }
    }
  }
}

// The row exchange sends its packed rows as a segment; beside dense segments in flight. The union of the
// rows goes through the leaders too, and is the flat one.
TEST(MpiHierarchy, AveragesRowsBesideSegments) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  for (const std::string compression : {"none", "bf16"}) {
    SCOPED_TRACE(compression);
    // bf16 keeps 8 bits of each value: the flat float average is the reference within that.
    const double tolerance = compression == "none" ? 1e-5 : 1.0 / 128;
    auto flat = comm::make_mpi_reducer(world, comm::MpiReducerOptions{"none", "off"});
    auto hierarchical = comm::make_mpi_reducer(world, {compression, "auto", paired(world.rank(), n)});
    const std::size_t width = 5;
    const std::size_t total_rows = 40;
    for (int step = 0; step < 2; ++step) {
      std::vector<std::vector<float>> results;
      std::vector<std::vector<int32_t>> unions;
      for (comm::GradientReducer* reducer : {flat.get(), hierarchical.get()}) {
        std::vector<float> dense = testing::rounding_gradients(world.rank(), step, 333);
        std::vector<float> matrix(total_rows * width, 0.0f);
        std::vector<int32_t> rows;
        for (std::size_t row = static_cast<std::size_t>(world.rank() + step); row < total_rows; row += 7) {
          rows.push_back(static_cast<int32_t>(row));
          for (std::size_t j = 0; j < width; ++j)
            matrix[row * width + j] = static_cast<float>(row + j) * 0.37f;
        }
        reducer->start_average(std::span<float>(dense).first(300));
        const std::vector<int32_t> all = reducer->start_average_rows(matrix, width, rows);
        reducer->start_average(std::span<float>(dense).subspan(300));
        reducer->finish_average();
        EXPECT_TRUE(testing::same_bits_everywhere(world, matrix));
        EXPECT_TRUE(testing::same_bits_everywhere(world, dense));
        EXPECT_FALSE(all.empty());
        unions.push_back(all);
        matrix.insert(matrix.end(), dense.begin(), dense.end());
        results.push_back(std::move(matrix));
      }
      EXPECT_EQ(unions[1], unions[0]) << "the leaders' union of the rows differs from the flat one";
      ASSERT_EQ(results[0].size(), results[1].size());
      for (std::size_t i = 0; i < results[0].size(); ++i) {
        ASSERT_NEAR(results[1][i], results[0][i], tolerance * std::max(1.0f, std::abs(results[0][i]))) << i;
      }
    }
  }
}

// Where the hierarchy does not apply, the reducer is today's flat all-reduce: the same bits.
TEST(MpiHierarchy, WhereItDoesNotApplyTheBitsAreTheFlatOnes) {
  comm::HostGroup world(MPI_COMM_WORLD);
  const int n = world.size();
  auto flat = comm::make_mpi_reducer(world, comm::MpiReducerOptions{"none", "off"});
  for (const auto node_of : {own_node, one_node}) {
    auto reducer = comm::make_mpi_reducer(world, {"none", "auto", node_of(world.rank(), n)});
    std::vector<float> expected = testing::rounding_gradients(world.rank(), 5, total_size());
    std::vector<float> got = expected;
    average_in_segments(*flat, expected);
    average_in_segments(*reducer, got);
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace ddp

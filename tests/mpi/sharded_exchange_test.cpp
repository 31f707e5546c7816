// The colocated parameter server's exchange (comm/sharded_exchange.h), flat and through pseudo-nodes of one
// machine (ExchangeNodes::test_node), at every rank count ctest runs: at 4 ranks 2 nodes of 2, of
// consecutive ranks and interleaved; at 3 nodes of 2 and 1, which take the flat exchange and say why. Every
// form against closed forms (the averages, the gathers, the rows pushed and fetched); the shards cover the
// vector once, and through the nodes the rank j of node m owns piece m of slice j; a 16-bit update leaves
// every copy the same bits; and through the nodes the averages equal the flat ones within rounding.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "comm/average_check.h"
#include "comm/host_group.h"
#include "comm/sharded_exchange.h"
#include "comm/wire_payload.h"
#include "engine/base/errors.h"
#include "tests/mpi/mpi_test_util.h"

namespace ddp {
namespace {

// How the ranks are grouped into nodes, and whether the exchange may go through them.
struct Grouping {
  const char* name;
  comm::ExchangeNodes (*nodes)(int rank);
};
const Grouping kGroupings[] = {
    {"flat", [](int) { return comm::ExchangeNodes{}; }},
    {"consecutive pairs",
     [](int rank) {
       return comm::ExchangeNodes{true, rank / 2};
     }},
    {"interleaved pairs",
     [](int rank) {
       return comm::ExchangeNodes{true, rank % 2};
     }},
    {"one machine's shared memory",
     [](int) {
       return comm::ExchangeNodes{true, -1};
     }},
};

// Pairs make the hierarchy at 4 ranks only: 2 ranks are nodes of one, 3 are nodes of unequal counts.
bool through_nodes(const Grouping& grouping) {
  return testing::world_size() == 4 && grouping.nodes(0).hierarchy && grouping.nodes(0).test_node >= 0;
}

bool same_bits_everywhere(const std::vector<float>& data) {
  comm::HostGroup world(MPI_COMM_WORLD);
  return testing::same_bits_everywhere(world, data);
}

// Runs `check` on a float-wire exchange of 1, 7 and 4099 floats under each grouping.
void for_each_exchange(const std::function<void(comm::ShardedExchange&, const Grouping&)>& check) {
  for (const Grouping& grouping : kGroupings) {
    SCOPED_TRACE(grouping.name);
    for (const std::size_t total : {std::size_t{1}, std::size_t{7}, std::size_t{4099}}) {
      SCOPED_TRACE(std::to_string(total) + " floats");
      comm::ShardedExchange exchange(MPI_COMM_WORLD, total, comm::WireFormat::kFloat,
                                     grouping.nodes(testing::world_rank()));
      check(exchange, grouping);
    }
  }
}

TEST(ShardedExchange, ShardsCoverTheVectorOnceInSlicesOfNodes) {
  for_each_exchange([](comm::ShardedExchange& exchange, const Grouping& grouping) {
    const std::size_t total = exchange.total();
    std::vector<std::pair<std::size_t, std::size_t>> shards;
    for (int r = 0; r < exchange.size(); ++r) shards.emplace_back(exchange.begin(r), exchange.end(r));
    std::sort(shards.begin(), shards.end());
    std::size_t at = 0;
    for (const auto& [begin, end] : shards) {
      EXPECT_EQ(begin, at);
      at = end;
    }
    EXPECT_EQ(at, total);
    EXPECT_EQ(exchange.total(), total);

    const std::string& line = exchange.hierarchy_line();
    if (through_nodes(grouping)) {
      EXPECT_EQ(line.rfind("hierarchical across 2 nodes of 2 ranks", 0), 0u) << line;
      // Node m = its ranks' pair; j = the rank's place in it. Slice j of the vector, piece m of the slice.
      const bool consecutive = grouping.nodes(1).test_node == 0;
      for (int r = 0; r < 4; ++r) {
        const int m = consecutive ? r / 2 : r % 2;
        const int j = consecutive ? r % 2 : r / 2;
        const std::size_t slice_begin = static_cast<std::size_t>(j) * (total / 2) + (j > 0 ? total % 2 : 0);
        const std::size_t slice = total / 2 + (j < static_cast<int>(total % 2) ? 1 : 0);
        const std::size_t piece_begin =
            slice_begin + static_cast<std::size_t>(m) * (slice / 2) + (m > 0 ? slice % 2 : 0);
        EXPECT_EQ(exchange.begin(r), piece_begin) << "rank " << r << " of " << total;
      }
    } else if (grouping.nodes(0).hierarchy && testing::world_size() == 3 &&
               grouping.nodes(0).test_node >= 0) {
      EXPECT_NE(line.find("not hierarchical: its nodes hold 1 to 2 ranks"), std::string::npos) << line;
    } else {
      EXPECT_EQ(line, "");
      for (int r = 1; r < exchange.size(); ++r) EXPECT_EQ(exchange.begin(r), exchange.end(r - 1));
    }
  });
}

// MPI's counts are ints: a vector of more floats than an int counts is one clear error, and on a 16-bit wire,
// whose payloads travel as bytes of a float-spaced buffer, four times fewer. Nothing large is allocated.
TEST(ShardedExchange, RefusesMoreParametersThanAnMpiMessageHolds) {
  const std::size_t ints = static_cast<std::size_t>(INT_MAX);
  EXPECT_NO_THROW(comm::ShardedExchange(MPI_COMM_WORLD, ints / 4 + 1, comm::WireFormat::kFloat));
  for (const auto& [total, wire] : {std::pair{ints + 1, comm::WireFormat::kFloat},
                                    std::pair{ints / 4 + 1, comm::WireFormat::kBfloat16}}) {
    try {
      comm::ShardedExchange exchange(MPI_COMM_WORLD, total, wire);
      ADD_FAILURE() << total << " parameters: no error";
    } catch (const UserError& e) {
      EXPECT_NE(
          std::string(e.what()).find(std::to_string(total) + " parameters are more than one MPI message"),
          std::string::npos)
          << e.what();
    }
  }
}

TEST(ShardedExchange, AveragesAndGathers) {
  for_each_exchange([](comm::ShardedExchange& exchange, const Grouping& /*grouping*/) {
    const std::size_t total = exchange.total();
    std::vector<float> full(total);
    for (std::size_t i = 0; i < total; ++i) full[i] = comm::average_pattern_value(exchange.rank(), i);
    std::vector<float> shard(exchange.shard_size());
    exchange.reduce_scatter_average(full, shard);
    for (std::size_t i = 0; i < shard.size(); ++i) {
      const double expected = comm::average_pattern_expected(exchange.size(), exchange.begin() + i);
      ASSERT_NEAR(shard[i], expected, comm::kAverageTolerance * std::max(1.0, expected))
          << total << ", " << i;
    }
    std::vector<float> gathered(total, -1.0f);
    std::copy(shard.begin(), shard.end(), gathered.begin() + static_cast<std::ptrdiff_t>(exchange.begin()));
    exchange.all_gather(gathered);
    for (std::size_t i = 0; i < total; ++i) {
      ASSERT_NEAR(gathered[i], comm::average_pattern_expected(exchange.size(), i), 1e-5)
          << total << ", " << i;
    }
    EXPECT_TRUE(same_bits_everywhere(gathered));
    std::vector<float> on_root(total, -1.0f);
    exchange.gather_to_root(shard, on_root);
    if (exchange.rank() == 0) {
      EXPECT_EQ(on_root, gathered);
    }
    std::vector<float> back(exchange.shard_size());
    exchange.scatter_from_root(gathered, back);
    EXPECT_EQ(back, shard);
  });
}

// The row-sparse forms against the same closed form, on `region` with 6 floats after it (and region.offset
// before): the average of the rows the ranks touched (the others average to zero, also after a call that
// wrote them, or that went dense), the shards outside the region gathered, and fetched rows whole from their
// owners (through the nodes: from the node rank whose slice holds them, a row that two slices cut in two
// from both).
void expect_row_exchange(const comm::RowRegion& region, const comm::ExchangeNodes& nodes) {
  const std::size_t total = region.end() + 6;
  comm::ShardedExchange exchange(MPI_COMM_WORLD, total, comm::WireFormat::kFloat, nodes);
  const int ranks = exchange.size();
  // Rank r touches the rows that `touches` says; its gradient is the pattern there and outside the region.
  auto round = [&](const std::function<bool(int, std::size_t)>& touches) {
    std::vector<float> full(total, 0.0f);
    std::vector<int32_t> touched;
    for (std::size_t i = 0; i < total; ++i) {
      const bool inside = i >= region.offset && i < region.end();
      const std::size_t row = inside ? (i - region.offset) / region.width : 0;
      if (!inside || touches(exchange.rank(), row)) full[i] = comm::average_pattern_value(exchange.rank(), i);
      if (inside && touches(exchange.rank(), row) &&
          (touched.empty() || touched.back() != static_cast<int32_t>(row)))
        touched.push_back(static_cast<int32_t>(row));
    }
    // The pieces, made dense: sorted, inside the shard, not overlapping.
    std::vector<float> shard(exchange.shard_size(), 0.0f);
    std::size_t at = 0;
    for (const GradientPiece& piece : exchange.reduce_scatter_average_rows(full, region, touched)) {
      ASSERT_GE(piece.offset, at);
      ASSERT_LE(piece.offset + piece.values.size(), shard.size());
      std::copy(piece.values.begin(), piece.values.end(),
                shard.begin() + static_cast<std::ptrdiff_t>(piece.offset));
      at = piece.offset + piece.values.size();
    }
    for (std::size_t k = 0; k < shard.size(); ++k) {
      const std::size_t i = exchange.begin() + k;
      const bool inside = i >= region.offset && i < region.end();
      double expected = 0;
      for (int r = 0; r < ranks; ++r) {
        if (!inside || touches(r, (i - region.offset) / region.width))
          expected += comm::average_pattern_value(r, i);
      }
      expected /= ranks;
      ASSERT_NEAR(shard[k], expected, comm::kAverageTolerance * std::max(1.0, std::abs(expected))) << i;
    }
  };
  round([](int r, std::size_t row) { return row % static_cast<std::size_t>(r + 2) == 0; });
  round([](int r, std::size_t row) { return (row + 1) % static_cast<std::size_t>(r + 3) == 0; });
  round([](int /*r*/, std::size_t row) { return row != 4; });  // nearly every row: sent dense
  round([](int r, std::size_t row) { return row == static_cast<std::size_t>(r); });

  // The owners' floats, -1 where a rank has not received them.
  auto owned = [](std::size_t i) { return 0.5f * static_cast<float>(i) + 1.0f; };
  std::vector<float> full(total, -1.0f);
  for (std::size_t i = exchange.begin(); i < exchange.end(); ++i) full[i] = owned(i);
  exchange.all_gather_outside(full, region);
  auto mine = [&](std::size_t i) { return i >= exchange.begin() && i < exchange.end(); };
  for (std::size_t i = 0; i < total; ++i) {
    const bool inside = i >= region.offset && i < region.end();
    ASSERT_EQ(full[i], !inside || mine(i) ? owned(i) : -1.0f) << i;
  }
  std::vector<int32_t> rows;
  for (int32_t row = -2; row < 40; ++row) {  // ids outside the region are skipped
    if ((row + 3) % 3 == exchange.rank() % 3) rows.push_back(row);
  }
  exchange.fetch_rows(full, region, rows);
  for (std::size_t i = region.offset; i < region.end(); ++i) {
    const auto row = static_cast<int32_t>((i - region.offset) / region.width);
    const bool asked = std::binary_search(rows.begin(), rows.end(), row);
    // Through the nodes a rank also holds the rows its node fetched for its slice: never stale ones.
    if (asked || mine(i)) {
      ASSERT_EQ(full[i], owned(i)) << i;
    } else if (full[i] != -1.0f) {
      ASSERT_EQ(full[i], owned(i)) << i;
    }
  }
  // Every row again, and the gathered vector: every copy the owners' floats.
  exchange.all_gather(full);
  for (std::size_t i = 0; i < total; ++i) ASSERT_EQ(full[i], owned(i)) << i;
}

TEST(ShardedExchange, MovesRowsOnly) {
  for (const Grouping& grouping : kGroupings) {
    SCOPED_TRACE(grouping.name);
    // Also a small region deep in the vector, which some ranks' shards do not meet at all.
    for (const comm::RowRegion region : {comm::RowRegion{5, 37, 7}, comm::RowRegion{200, 3, 7}}) {
      expect_row_exchange(region, grouping.nodes(testing::world_rank()));
    }
  }
}

// A few steps of the sync exchange with a made-up update (each owner adds its averaged gradient times a
// rate): on every wire, through the nodes or not, every rank's copy has the same bits after every step;
// through the nodes, the copies stay within the wire's rounding of the flat exchange's.
TEST(ShardedExchange, UpdatesKeepEveryCopyTheSameBitsThroughTheNodes) {
  constexpr std::size_t kTotal = 10007;
  const comm::RowRegion region{1000, 500, 16};  // rows exchanged, as the embedding's
  for (const comm::WireFormat wire :
       {comm::WireFormat::kFloat, comm::WireFormat::kBfloat16, comm::WireFormat::kHalf}) {
    std::vector<std::vector<float>> finals;
    for (const Grouping& grouping : kGroupings) {
      SCOPED_TRACE(std::string(grouping.name) + ", wire " + std::to_string(static_cast<int>(wire)));
      comm::ShardedExchange exchange(MPI_COMM_WORLD, kTotal, wire, grouping.nodes(testing::world_rank()));
      std::vector<float> params(kTotal);
      for (std::size_t i = 0; i < kTotal; ++i) params[i] = std::sin(static_cast<float>(i));
      for (int step = 0; step < 3; ++step) {
        std::vector<float> grads = testing::rounding_gradients(exchange.rank(), step, kTotal);
        std::vector<int32_t> touched;
        for (int32_t row = 0; row < 500; ++row) {
          if ((row + exchange.rank() + step) % 5 == 0) {
            touched.push_back(row);
          } else {
            std::fill_n(grads.begin() + 1000 + 16 * row, 16, 0.0f);
          }
        }
        const std::span<float> shard(params.data() + exchange.begin(), exchange.shard_size());
        const std::vector<float> before(shard.begin(), shard.end());
        std::vector<float> average(exchange.shard_size(), 0.0f);
        for (const GradientPiece& piece : exchange.reduce_scatter_average_rows(grads, region, touched)) {
          std::copy(piece.values.begin(), piece.values.end(),
                    average.begin() + static_cast<std::ptrdiff_t>(piece.offset));
        }
        for (std::size_t i = 0; i < shard.size(); ++i) shard[i] -= 0.01f * average[i];
        exchange.all_gather_update(params, region, before);
        // Every row each copy may read next: the rows some rank touched.
        std::vector<int32_t> every_row(500);
        for (int32_t row = 0; row < 500; ++row) every_row[static_cast<std::size_t>(row)] = row;
        exchange.fetch_rows(params, region, every_row);
        ASSERT_TRUE(same_bits_everywhere(params)) << "step " << step;
      }
      finals.push_back(params);
    }
    // Every grouping near the flat exchange: a step moves a parameter by 0.01 x a gradient of a few units,
    // which a 16-bit wire rounds to 2^-8 of itself (twice: the gradient, the update).
    const double tolerance = wire == comm::WireFormat::kFloat ? 1e-6 : 3 * 0.01 * 16 * std::ldexp(1.0, -8);
    for (std::size_t g = 1; g < finals.size(); ++g) {
      for (std::size_t i = 0; i < kTotal; ++i)
        ASSERT_NEAR(finals[g][i], finals[0][i], tolerance) << kGroupings[g].name << " at " << i;
    }
  }
}

}  // namespace
}  // namespace ddp

// The contract every gradient reducer of comm/gradient_reducer.h keeps, in closed form, for any rank count,
// and that of the host collectives (comm/host_group.h): the MPI tests run them at 2, 3 and 4 ranks
// (tests/mpi/communicator_contract_test.cpp); a GPU reducer runs the same checks with a CheckBuffer in device
// memory. Removing or breaking any reduction fails it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/average_check.h"
#include "comm/gradient_reducer.h"
#include "comm/host_group.h"

namespace ddp::testing {

// A buffer of at least `floats` floats in the reducer's memory.
using CheckBufferFactory = std::function<comm::CheckBuffer(std::size_t floats)>;

// `reducer` averages over the ranks of `group`.
inline void expect_averages(comm::HostGroup& group, comm::GradientReducer& reducer,
                            const CheckBufferFactory& make_buffer, double tolerance) {
  const std::vector<std::vector<std::size_t>> cases{
      {1},                               // one float
      {7, 1, 4099},                      // odd sizes, several in flight
      {262144},                          // 1 MiB
      std::vector<std::size_t>(33, 100)  // many small buckets in one round
  };
  for (const auto& sizes : cases) {
    std::size_t total = 0;
    for (const std::size_t s : sizes) total += s;
    const comm::CheckBuffer buffer = make_buffer(total);
    for (int round = 0; round < 2; ++round) {  // a second round on the same buffer starts afresh
      const comm::AverageCheckResult result = comm::check_average(group, reducer, buffer, sizes, tolerance);
      EXPECT_TRUE(result.ok) << reducer.backend() << " at " << reducer.size() << " ranks, " << sizes.size()
                             << " segment(s), round " << round << ": largest error " << result.largest_error
                             << " at " << result.where;
    }
  }
}

// The host-memory collectives every backend shares: broadcast from every root, sum, gather, scatter,
// first_error.
inline void expect_host_collectives(comm::HostGroup& comm) {
  const int n = comm.size();
  const int rank = comm.rank();
  for (int root = 0; root < n; ++root) {
    std::vector<float> f(5, static_cast<float>(rank * 10 + 1));
    comm.broadcast(std::span<float>(f), root);
    for (const float x : f)
      EXPECT_EQ(x, static_cast<float>(root * 10 + 1)) << "float broadcast from " << root;
    // A double that a float would round: the broadcast must keep all its bits.
    std::vector<double> d{1.0 + 1e-12 * root, static_cast<double>(rank)};
    comm.broadcast(std::span<double>(d), root);
    EXPECT_EQ(d[0], 1.0 + 1e-12 * root) << "double broadcast from " << root;
    EXPECT_EQ(d[1], static_cast<double>(root));
  }
  std::vector<double> s{1.0, static_cast<double>(rank), 0.5 * rank * rank};
  comm.sum(s);
  EXPECT_EQ(s[0], n);
  EXPECT_EQ(s[1], n * (n - 1) / 2);
  EXPECT_EQ(s[2], 0.5 * (n - 1) * n * (2 * n - 1) / 6);

  const std::vector<std::string> texts = comm.gather("rank " + std::to_string(rank), n - 1);
  if (rank == n - 1) {
    ASSERT_EQ(texts.size(), static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) EXPECT_EQ(texts[static_cast<std::size_t>(r)], "rank " + std::to_string(r));
  } else {
    EXPECT_TRUE(texts.empty());
  }

  // Scatter undoes gather, bytes of every value and texts of different lengths (an empty one among them).
  for (const int root : {0, n - 1}) {
    std::vector<std::string> own(static_cast<std::size_t>(rank == root ? n : 0));
    for (int r = 0; r < static_cast<int>(own.size()); ++r) {
      std::string& text = own[static_cast<std::size_t>(r)];
      for (int i = 0; i < 3 * r; ++i) text.push_back(static_cast<char>(255 - 40 * r - i));
    }
    const std::string mine = comm.scatter(own, root);
    std::string expected;
    for (int i = 0; i < 3 * rank; ++i) expected.push_back(static_cast<char>(255 - 40 * rank - i));
    EXPECT_EQ(mine, expected) << "scatter from " << root;
    const std::vector<std::string> back = comm.gather(mine, root);
    if (rank == root) {
      EXPECT_EQ(back, own);
    }
  }

  EXPECT_FALSE(comm.first_error(std::nullopt).has_value());
  // Every rank above 0 fails: all get the lowest failing rank's message.
  const std::optional<std::string> mine =
      rank > 0 ? std::optional<std::string>("failed on " + std::to_string(rank)) : std::nullopt;
  const std::optional<std::string> first = comm.first_error(mine);
  if (n > 1) {
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(*first, "failed on 1");
  } else {
    EXPECT_FALSE(first.has_value());
  }
}

// start_average_rows on a host-memory reducer over the ranks of `group`: rank r touches rows {r, r + n, ...}
// below `touched_below` and row `rows - 1`; the union comes back, its rows averaged in closed form, every
// other row exactly zero. With touched_below close to `rows` the union covers most of the matrix (the dense
// path). `tolerance` is relative, as the reducer's wire allows (comm::average_tolerance).
inline void expect_row_averages(comm::HostGroup& group, comm::GradientReducer& comm, std::size_t rows,
                                std::size_t touched_below, double tolerance = 1e-6) {
  constexpr std::size_t kWidth = 3;
  const int n = group.size();
  const auto rank = static_cast<std::size_t>(group.rank());
  std::vector<float> matrix(rows * kWidth, 0.0f);
  std::vector<int32_t> mine;
  for (std::size_t row = rank; row < touched_below; row += static_cast<std::size_t>(n)) {
    mine.push_back(static_cast<int32_t>(row));
  }
  if (mine.empty() || mine.back() != static_cast<int32_t>(rows - 1))
    mine.push_back(static_cast<int32_t>(rows - 1));
  for (const int32_t row : mine) {
    for (std::size_t j = 0; j < kWidth; ++j) {
      matrix[static_cast<std::size_t>(row) * kWidth + j] = static_cast<float>((rank + 1) * (j + 1));
    }
  }
  const std::vector<int32_t> all = comm.start_average_rows(matrix, kWidth, mine);
  comm.finish_average();
  std::vector<int32_t> expected_union;
  for (std::size_t row = 0; row < std::min(touched_below, rows); ++row)
    expected_union.push_back(static_cast<int32_t>(row));
  if (expected_union.empty() || expected_union.back() != static_cast<int32_t>(rows - 1))
    expected_union.push_back(static_cast<int32_t>(rows - 1));
  EXPECT_EQ(all, expected_union) << comm.backend() << ": the union of the touched rows";
  for (std::size_t row = 0; row < rows; ++row) {
    // Which ranks touched this row: the one with rank == row % n (below touched_below), and all at the end.
    double sum_of_factors = 0;
    if (row == rows - 1) {
      sum_of_factors = n * (n + 1) / 2.0;
    } else if (row < touched_below) {
      sum_of_factors = static_cast<double>(row % static_cast<std::size_t>(n) + 1);
    }
    for (std::size_t j = 0; j < kWidth; ++j) {
      const double expected = sum_of_factors * static_cast<double>(j + 1) / n;
      EXPECT_NEAR(matrix[row * kWidth + j], expected, tolerance * std::max(1.0, expected))
          << comm.backend() << ": row " << row << ", column " << j;
    }
  }
}

}  // namespace ddp::testing

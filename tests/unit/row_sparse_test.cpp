// The parameter server's row-sparse gradient messages (comm/row_sparse.h): every cut of the vector into a
// shard round-trips, the message is smaller than the dense shard, and a corrupt one is named.
#include "comm/row_sparse.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace ddp::comm {
namespace {

// 3 floats before the region, 10 rows of 4, 5 floats after: 48 floats.
constexpr RowRegion kRegion{3, 10, 4};
constexpr std::size_t kTotal = 48;
const std::vector<int32_t> kTouched{1, 4, 5, 9};

// Non-zero everywhere except in the region's rows that were not touched.
std::vector<float> gradients() {
  std::vector<float> grads(kTotal);
  for (std::size_t i = 0; i < kTotal; ++i) grads[i] = 0.5f + static_cast<float>(i);
  for (std::size_t row = 0; row < kRegion.rows; ++row) {
    if (std::find(kTouched.begin(), kTouched.end(), static_cast<int32_t>(row)) != kTouched.end()) continue;
    for (std::size_t c = 0; c < kRegion.width; ++c) grads[kRegion.offset + row * kRegion.width + c] = 0;
  }
  return grads;
}

TEST(RowSparse, EveryShardRoundTrips) {
  const std::vector<float> grads = gradients();
  int sparse_messages = 0;
  for (std::size_t begin = 0; begin < kTotal; ++begin) {
    for (std::size_t end = begin + 1; end <= kTotal; ++end) {
      std::vector<float> payload(end - begin, -1.0f);
      const std::size_t size = encode_row_sparse(grads, begin, end, kRegion, kTouched, payload);
      if (size == 0) continue;  // the caller sends this shard dense
      ++sparse_messages;
      ASSERT_LT(size, end - begin) << "[" << begin << ", " << end << ")";
      std::vector<float> dense(end - begin, -1.0f);
      const std::string error =
          decode_row_sparse(std::span<const float>(payload).first(size), begin, end, kRegion, dense);
      ASSERT_EQ(error, "") << "[" << begin << ", " << end << ")";
      for (std::size_t i = begin; i < end; ++i) ASSERT_EQ(dense[i - begin], grads[i]) << "element " << i;
    }
  }
  EXPECT_GT(sparse_messages, 500);  // most cuts hold enough untouched rows to be worth it
}

TEST(RowSparse, ShardsWithoutTheRegionOrWithEveryRowTouchedStayDense) {
  const std::vector<float> grads = gradients();
  std::vector<float> payload(kTotal);
  EXPECT_EQ(encode_row_sparse(grads, 0, 3, kRegion, kTouched, payload), 0u);
  EXPECT_EQ(encode_row_sparse(grads, 43, 48, kRegion, kTouched, payload), 0u);
  const std::vector<int32_t> all{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(encode_row_sparse(grads, 0, kTotal, kRegion, all, payload), 0u);
  EXPECT_GT(encode_row_sparse(grads, 0, kTotal, kRegion, kTouched, payload), 0u);
}

TEST(RowSparse, CorruptMessagesAreNamed) {
  const std::vector<float> grads = gradients();
  std::vector<float> payload(kTotal);
  const std::size_t size = encode_row_sparse(grads, 0, kTotal, kRegion, kTouched, payload);
  ASSERT_GT(size, 0u);
  std::vector<float> dense(kTotal);
  const auto decode = [&](std::vector<float> message) {
    return decode_row_sparse(message, 0, kTotal, kRegion, dense);
  };
  const std::vector<float> good(payload.begin(), payload.begin() + static_cast<std::ptrdiff_t>(size));
  EXPECT_EQ(decode(good), "");

  std::vector<float> bad = good;
  const int32_t huge = 1000;
  std::memcpy(&bad[0], &huge, sizeof(huge));
  EXPECT_NE(decode(bad).find("row count of 1000"), std::string::npos) << decode(bad);

  bad = good;
  std::swap(bad[1], bad[2]);  // rows 4, 1: out of order
  EXPECT_NE(decode(bad).find("out of order"), std::string::npos) << decode(bad);

  bad = good;
  bad.pop_back();
  EXPECT_NE(decode(bad).find("expected"), std::string::npos) << decode(bad);

  EXPECT_NE(decode_row_sparse(good, 0, 3, kRegion, dense).find("holds no row"), std::string::npos);
}

}  // namespace
}  // namespace ddp::comm

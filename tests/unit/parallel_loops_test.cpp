// The compute threads' split of a loop (engine/base/parallel_loops.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "engine/base/parallel_loops.h"

namespace ddp::engine {
namespace {

TEST(ParallelLoops, RangesCoverEveryElementOnceAlignedOnAnyThreadCount) {
  for (const int threads : {1, 2, 3, 8}) {
    set_loop_threads(threads);
    for (const std::size_t n : {0ul, 1ul, 15ul, 16ul, 1000ul, 100003ul}) {
      std::vector<std::atomic<int>> seen(n);
      std::atomic<int> calls{0};
      parallel_ranges(n, 16, 100, [&](std::size_t begin, std::size_t end) {
        ++calls;
        EXPECT_LT(begin, end);
        EXPECT_TRUE(begin % 16 == 0) << begin;
        for (std::size_t i = begin; i < end; ++i) ++seen[i];
      });
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(seen[i].load(), 1) << n << " " << i;
      }
      EXPECT_LE(calls.load(), std::max(1, loop_threads())) << n;
      if (n == 0) {
        EXPECT_EQ(calls.load(), 0);
      }
    }
  }
  set_loop_threads(1);
}

}  // namespace
}  // namespace ddp::engine

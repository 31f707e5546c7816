// numpy's legacy RandomState shuffle (io/numpy_random_state.h).
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "engine/base/errors.h"
#include "io/numpy_random_state.h"

namespace ddp::io {
namespace {

// Reference permutations from numpy 1.24.2 (/usr/bin/python3 on Debian 12):
//   r = np.random.RandomState(seed); a = np.arange(n); r.shuffle(a); print(a.tolist())
// and, for the second shuffle, the same `r` shuffling np.arange(m) afterwards (as load_data does for test).
TEST(NumpyRandomState, ShufflesAsNumpyDoes) {
  auto shuffled = [](NumpyRandomState& rng, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    rng.shuffle(v);
    return v;
  };
  NumpyRandomState a(113);
  EXPECT_EQ(shuffled(a, 10), (std::vector<int64_t>{9, 3, 6, 1, 0, 7, 4, 8, 2, 5}));
  EXPECT_EQ(shuffled(a, 6), (std::vector<int64_t>{3, 1, 0, 5, 4, 2}));
  NumpyRandomState b(113);
  EXPECT_EQ(shuffled(b, 25), (std::vector<int64_t>{18, 19, 3,  8,  13, 14, 1,  6,  9,  24, 4, 17, 11,
                                                   7,  22, 21, 20, 15, 0,  16, 23, 12, 10, 2, 5}));
  NumpyRandomState c(0);
  EXPECT_EQ(shuffled(c, 12), (std::vector<int64_t>{6, 11, 4, 10, 2, 8, 1, 7, 9, 3, 0, 5}));
  NumpyRandomState d(4294967295);
  EXPECT_EQ(shuffled(d, 9), (std::vector<int64_t>{5, 1, 8, 7, 0, 6, 4, 2, 3}));
  NumpyRandomState e(113);
  EXPECT_EQ(shuffled(e, 1), std::vector<int64_t>{0});
  EXPECT_EQ(shuffled(e, 0), std::vector<int64_t>{});
  // IMDB's sizes: the first and last entries of both shuffles of load_data.
  NumpyRandomState f(113);
  const std::vector<int64_t> train = shuffled(f, 25000);
  const std::vector<int64_t> test = shuffled(f, 25000);
  EXPECT_EQ(std::vector<int64_t>(train.begin(), train.begin() + 4),
            (std::vector<int64_t>{7798, 13226, 18078, 793}));
  EXPECT_EQ(std::vector<int64_t>(train.end() - 3, train.end()), (std::vector<int64_t>{22690, 4828, 14501}));
  EXPECT_EQ(std::vector<int64_t>(test.begin(), test.begin() + 4),
            (std::vector<int64_t>{22748, 4083, 8015, 13688}));
  EXPECT_EQ(std::vector<int64_t>(test.end() - 2, test.end()), (std::vector<int64_t>{20869, 16517}));

  EXPECT_THROW(NumpyRandomState(uint64_t{1} << 32), UserError);
}

TEST(NumpyRandomState, RandomIntervalStaysInRange) {
  NumpyRandomState rng(7);
  for (uint64_t max : {uint64_t{1}, uint64_t{2}, uint64_t{5}, uint64_t{1} << 31, (uint64_t{1} << 32) - 1,
                       uint64_t{1} << 32, (uint64_t{1} << 40) + 3}) {
    for (int i = 0; i < 200; ++i) ASSERT_LE(rng.random_interval(max), max) << max;
  }
  EXPECT_EQ(rng.random_interval(0), 0u);
}

}  // namespace
}  // namespace ddp::io

// NumPy's legacy RandomState shuffle, so that files made for Keras are shuffled here exactly as there.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace ddp::io {

// numpy.random.RandomState(seed): the legacy generator, MT19937 seeded with init_genrand(seed), which is
// exactly std::mt19937(seed). Seeds above 2^32 - 1 are refused, as numpy does.
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint64_t seed);
  // numpy's random_interval(max): uniform in [0, max], by masking 32-bit (64-bit above 2^32 - 1) draws to
  // the next power of two minus one and rejecting values above max.
  uint64_t random_interval(uint64_t max);
  // RandomState.shuffle: Fisher-Yates from the end, `for i in reversed(range(1, n)): swap(x[i],
  // x[random_interval(i)])`.
  void shuffle(std::span<int64_t> values);

 private:
  std::mt19937 mt_;
};

}  // namespace ddp::io

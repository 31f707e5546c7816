// splitmix64's finalizer: a strong 64-bit mixer (every input bit flips about half of the output bits). The
// data order, the synthetic dataset and the row order of `prepare text` derive their seeds with it, so they
// are the same on every platform.
#pragma once

#include <cstdint>
#include <random>

namespace ddp::io {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Independent generator streams of one seed (splitmix64 of seed and stream number).
inline uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return mix64(mix64(seed + 0x9E3779B97F4A7C15ULL) ^ stream);
}

// Uniform in [0, n), n > 0, by rejection: the same numbers with every standard library, unlike
// std::uniform_int_distribution whose algorithm is unspecified.
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n: values below it would favour small results
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

}  // namespace ddp::io

// splitmix64's finalizer: a strong 64-bit mixer (every input bit flips about half of the output bits). The
// data order and the synthetic dataset derive their seeds with it, so they are the same on every platform.
#pragma once

#include <cstdint>

namespace ddp::io {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace ddp::io

#include "io/numpy_random_state.h"

#include <string>
#include <utility>

#include "engine/base/errors.h"

namespace ddp::io {

NumpyRandomState::NumpyRandomState(uint64_t seed) {
  if (seed > 0xFFFFFFFFull) {
    throw UserError("seed " + std::to_string(seed) + " is out of numpy RandomState's range 0..4294967295");
  }
  mt_.seed(static_cast<std::mt19937::result_type>(seed));
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  for (int shift = 1; shift <= 32; shift *= 2) mask |= mask >> shift;
  uint64_t value = 0;
  if (max <= 0xFFFFFFFFull) {
    do {
      value = static_cast<uint64_t>(mt_()) & mask;
    } while (value > max);
  } else {
    do {
      const auto high = static_cast<uint64_t>(mt_());  // numpy's next_uint64: the first draw is high
      const auto low = static_cast<uint64_t>(mt_());
      value = ((high << 32) | low) & mask;
    } while (value > max);
  }
  return value;
}

void NumpyRandomState::shuffle(std::span<int64_t> values) {
  for (size_t i = values.size(); i-- > 1;) std::swap(values[i], values[random_interval(i)]);
}

}  // namespace ddp::io

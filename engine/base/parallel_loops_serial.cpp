// A build without OpenMP: every loop runs on the calling thread.
#include <algorithm>

#include "engine/base/parallel_loops.h"

namespace ddp {

void set_loop_threads(int /*threads*/) {}

int loop_threads() {
  return 1;
}

void parallel_ranges(std::size_t n, std::size_t /*align*/, std::size_t /*min_per_thread*/,
                     const std::function<void(std::size_t, std::size_t)>& body) {
  if (n > 0) body(0, n);
}

}  // namespace ddp

#include <omp.h>

#include <algorithm>

#include "engine/base/parallel_loops.h"

namespace ddp {
namespace {
thread_local int loop_threads_of_this_thread = 1;
}  // namespace

void set_loop_threads(int threads) {
  loop_threads_of_this_thread = std::max(1, threads);
}

int loop_threads() {
  return loop_threads_of_this_thread;
}

void parallel_ranges(std::size_t n, std::size_t align, std::size_t min_per_thread,
                     const std::function<void(std::size_t, std::size_t)>& body) {
  align = std::max<std::size_t>(1, align);
  const std::size_t by_size = n / std::max<std::size_t>(1, min_per_thread);
  const int threads = static_cast<int>(std::min<std::size_t>(loop_threads_of_this_thread, by_size));
  if (threads <= 1) {
    if (n > 0) body(0, n);
    return;
  }
  // Equal ranges, rounded up to `align`, one per thread: the loops are memory-bound and uniform.
  const std::size_t per_thread = (n + threads - 1) / threads;
  const std::size_t chunk = (per_thread + align - 1) / align * align;
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(n, static_cast<std::size_t>(t) * chunk);
    const std::size_t end = std::min(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

}  // namespace ddp

// Element-wise loops over millions of values (the optimizers' updates) on the rank's compute threads. A rank
// has one pool of compute threads, shared by every library in its step: where the CPU replica's recurrent
// layers run on oneDNN or the packed tiles, that pool is OpenMP's, and these loops run on it too; elsewhere
// (the builtin kernels, whose pool is the BLAS's own) the loops stay on the calling thread, so that two pools
// never spin against each other. CMake compiles parallel_loops_openmp.cpp where OpenMP is found, else
// parallel_loops_serial.cpp.
#pragma once

#include <cstddef>
#include <functional>

namespace ddp {

// The threads the calling thread's loops may use (1 until set). Per thread: a parameter server's own thread
// keeps 1, as the rank's compute threads belong to its trainer.
void set_loop_threads(int threads);
int loop_threads();

// Calls body(begin, end) over consecutive ranges that cover [0, n), each a multiple of `align` long (but
// the last), on up to loop_threads() threads; ranges shorter than `min_per_thread` elements are not split
// off. body must only touch its own range. Returns when all are done.
void parallel_ranges(std::size_t n, std::size_t align, std::size_t min_per_thread,
                     const std::function<void(std::size_t, std::size_t)>& body);

}  // namespace ddp

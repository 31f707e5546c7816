// Sets the BLAS's thread count for this process. CMake compiles the file for the BLAS it found.
#pragma once

#include <string>

namespace ddp::models {

// Returns false if this BLAS cannot be told (then its own environment variable, e.g. MKL_NUM_THREADS, rules).
bool set_blas_threads(int threads);
// "OpenBLAS 0.3.21 (pthreads)" or the vendor's name, for the start-up log.
std::string blas_description();

}  // namespace ddp::models

// The rank's one pool of compute threads (train.threads wide), given to the library that runs the CPU
// replica's step: OpenMP's pool for every kind but builtin (oneDNN's primitives, or our cells over its sgemm
// or the packed tiles with the batch's rows split between the threads, and the optimizer's loops share it;
// the BLAS runs on each calling thread alone), the BLAS's own pool for the builtin kernels (the optimizer's
// loops then stay on the calling thread). Two pools in one step would spin against each other between their
// turns.
#pragma once

#include <string>

#include "models/replica.h"

namespace ddp::models {

struct CpuThreadPlan {
  int threads = 1;
  bool blas_told = true;  // false: the BLAS cannot be told, its own environment variable rules
  std::string pool;       // whose threads they are, for the start log
};

// Sizes the pools of this process for a step on `kernels` with `threads` threads, from the calling thread
// (the one that runs the step).
CpuThreadPlan plan_cpu_threads(int threads, CpuKernels kernels);

}  // namespace ddp::models

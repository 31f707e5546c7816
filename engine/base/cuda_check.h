// Return-code checks for the CUDA runtime, shared by every file of the CUDA build. A failed call is a bug or
// a broken device: the job ends through ddp::fatal() with the call's text and the runtime's message. In
// destructors, which must not end the job, failures are printed as warnings instead.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "engine/base/errors.h"

namespace ddp {

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) fatal(std::string(call) + " failed: " + cudaGetErrorString(status), file, line);
}

inline void warn_cuda(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    std::fprintf(stderr, "ddptrain: warning: %s: %s\n", call, cudaGetErrorString(status));
}

}  // namespace ddp

#define DDP_CUDA_CHECK(call) ::ddp::check_cuda((call), #call, __FILE__, __LINE__)

namespace ddp {

// After a kernel launch: a bad launch configuration shows here, a fault inside the kernel at the next sync.
// The message is built only on failure: launches are in the step's hot path.
inline void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    fatal(std::string("launch of ") + kernel + " failed: " + cudaGetErrorString(status), file, line);
}

}  // namespace ddp

#define DDP_CUDA_CHECK_LAUNCH(kernel) ::ddp::check_launch((kernel), __FILE__, __LINE__)

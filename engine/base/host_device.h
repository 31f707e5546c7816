// DDP_HOST_DEVICE marks a function that nvcc compiles for the host and for the GPU, so that a kernel and the
// host code (and the host tests) share one definition of their element-wise math; other compilers see a
// plain inline function. Such functions use only what both sides have: arithmetic, the C math functions of
// the global namespace (::sqrtf, ::exp, ::log1p), and memcpy for bit casts.
#pragma once

#if defined(__CUDACC__)
#define DDP_HOST_DEVICE __host__ __device__ inline
#else
#define DDP_HOST_DEVICE inline
#endif

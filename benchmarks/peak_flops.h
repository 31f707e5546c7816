// The physical floor's denominator: the peak rate of fused multiply-adds this machine's cores reach, measured
// with a kernel that does nothing else (many independent accumulators in vector registers, no memory
// traffic), not with a GEMM, whose rate already includes its own losses.
#pragma once

#include <string>

struct PeakFlops {
  double gflops = 0;  // float GFLOP/s over all the threads (one FMA = 2 FLOP)
  std::string isa;    // the vector width used: "AVX-512", "AVX2+FMA" or "scalar"
};

// Runs the kernel on `threads` threads at once for about `seconds`.
PeakFlops measure_peak_flops(int threads, double seconds);

// How fast one core runs fused multiply-adds at each vector width, measured with kernels that do nothing
// else (12 independent accumulators in registers, no memory traffic). Two uses: model.cpu_kernels = auto,
// whose fastest kernels differ between cores that run a 512-bit FMA as two 256-bit halves (AMD's Zen 4:
// AVX-512 at AVX2's FLOP rate) and cores with two 512-bit FMA units (Intel's Xeons: twice it); and the
// physical floor that the benchmarks compare the step with. CMake compiles fma_rate_x86.cpp for x86-64, else
// fma_rate_none.cpp (scalar only).
#pragma once

#include <optional>

namespace ddp::models {

enum class FmaWidth { kScalar, kAvx2, kAvx512 };

// The widest this CPU runs (AVX2 counts with FMA only).
FmaWidth widest_fma();
// Floats per vector at `width`.
int fma_lanes(FmaWidth width);
// Runs `rounds` rounds of 12 independent FMAs on full vectors of `width`, which the CPU must run; returns a
// value that depends on them all, so that no compiler drops the work.
float fma_rounds(FmaWidth width, long rounds);

// Whether this core's 512-bit FMAs reach at least 1.4x the FLOP rate of its 256-bit ones (1.7-2x with two
// 512-bit units, 1x on halves). Measured once per process, the first time it is asked (a few ms: pairs of
// short runs of each width; the best rates and the pairs' median ratio must both say so), and kept, so that
// every caller in the process gets the same answer. False without AVX-512.
bool avx512_fma_outpaces_avx2();
// Replaces this process's answer with the one its job agreed on (engine: the ranks' majority), so that one
// rank whose measurement met another process's load does not run other kernels than the rest. No effect
// without AVX-512.
void settle_avx512_fma_outpaces_avx2(bool verdict);
// The answer this process has, measured or settled, without measuring: nothing before either (and without
// AVX-512). Checkpoints record it, so that a resumed run chooses the kernels the run it continues chose.
std::optional<bool> known_avx512_fma_verdict();

namespace detail {
// The scalar kernel, which every architecture runs.
inline float fma_rounds_scalar(long rounds) {
  constexpr int kAccumulators = 12;
  float acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = static_cast<float>(i) * 1e-3f;
  for (long r = 0; r < rounds; ++r) {
    for (float& x : acc) x = x * 0.999999f + 1e-7f;
  }
  float total = 0;
  for (const float x : acc) total += x;
  return total;
}
}  // namespace detail

}  // namespace ddp::models

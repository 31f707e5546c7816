#include "peak_flops.h"

#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Each kernel runs `rounds` rounds of 12 independent FMAs on full vector registers (enough to cover the FMA
// units' latency x throughput) and returns a value that depends on them, so the compiler keeps the work.
__attribute__((target("avx512f"))) float fma_rounds_avx512(long rounds) {
  __m512 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (auto& x : acc) x = _mm512_fmadd_ps(x, a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float lanes[16];
  _mm512_storeu_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}

__attribute__((target("avx2,fma"))) float fma_rounds_avx2(long rounds) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (auto& x : acc) x = _mm256_fmadd_ps(x, a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  float total = 0;
  for (float x : lanes) total += x;
  return total;
}

float fma_rounds_scalar(long rounds) {
  float acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = static_cast<float>(i) * 1e-3f;
  for (long r = 0; r < rounds; ++r) {
    for (float& x : acc) x = x * 0.999999f + 1e-7f;
  }
  float total = 0;
  for (float x : acc) total += x;
  return total;
}

}  // namespace

PeakFlops measure_peak_flops(int threads, double seconds) {
  PeakFlops peak;
  float (*kernel)(long) = fma_rounds_scalar;
  int lanes = 1;
  peak.isa = "scalar";
  if (__builtin_cpu_supports("avx512f")) {
    kernel = fma_rounds_avx512;
    lanes = 16;
    peak.isa = "AVX-512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernel = fma_rounds_avx2;
    lanes = 8;
    peak.isa = "AVX2+FMA";
  }
  // Rounds for the wanted time, from a short calibration run.
  long rounds = 1 << 20;
  for (;;) {
    const auto start = Clock::now();
    volatile float sink = kernel(rounds);
    (void)sink;
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    if (took > 0.02) {
      rounds = static_cast<long>(static_cast<double>(rounds) * seconds / took);
      break;
    }
    rounds *= 4;
  }
  std::atomic<int> ready{0};
  std::vector<double> took(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ++ready;
      while (ready.load() < threads) {
      }
      const auto start = Clock::now();
      volatile float sink = kernel(rounds);
      (void)sink;
      took[static_cast<std::size_t>(t)] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& thread : pool) thread.join();
  for (double s : took) peak.gflops += static_cast<double>(rounds) * 12.0 * lanes * 2.0 / s / 1e9;
  return peak;
}

// The FMA kernels on x86-64: AVX-512 and AVX2 + FMA under target attributes on the kernels alone, used only
// where the CPU reports them, and a scalar one.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>

#include "models/fma_rate.h"

namespace ddp::models {
namespace {

constexpr int kAccumulators = 12;  // enough to cover two FMA units' latency (4-5 cycles) at any width

__attribute__((target("avx512f"))) float fma_rounds_avx512(long rounds) {
  __m512 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (auto& x : acc) x = _mm512_fmadd_ps(x, a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm512_add_ps(sum, acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

__attribute__((target("avx2,fma"))) float fma_rounds_avx2(long rounds) {
  __m256 acc[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (long r = 0; r < rounds; ++r) {
    for (auto& x : acc) x = _mm256_fmadd_ps(x, a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kAccumulators; ++i) sum = _mm256_add_ps(sum, acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (const float x : lanes) total += x;
  return total;
}

// FLOP per second of one run of `rounds` at `width`.
double flop_rate(FmaWidth width, long rounds) {
  const auto start = std::chrono::steady_clock::now();
  volatile float sink = fma_rounds(width, rounds);
  (void)sink;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(rounds) * kAccumulators * fma_lanes(width) * 2.0 / std::max(seconds, 1e-9);
}

bool measure_avx512_against_avx2() {
  if (widest_fma() != FmaWidth::kAvx512) return false;
  // 20,000 rounds: 240,000 vector FMAs, 0.1-0.3 ms at either width. In pairs, back to back, so that a change
  // of clock or load meets both. Two judgements must agree: the best of each width (load can only lower a
  // rate) and the median of the pairs' ratios (a pair that load disturbed is an outlier). Either alone can be
  // fooled when another process on the same core's second hardware thread slows every run of one width.
  constexpr long kRounds = 20000;
  constexpr int kPairs = 16;
  constexpr double kOutpaces = 1.4;
  double best_avx2 = 0, best_avx512 = 0;
  std::array<double, kPairs> ratios{};
  for (double& ratio : ratios) {
    const double avx2 = flop_rate(FmaWidth::kAvx2, kRounds);
    const double avx512 = flop_rate(FmaWidth::kAvx512, kRounds);
    best_avx2 = std::max(best_avx2, avx2);
    best_avx512 = std::max(best_avx512, avx512);
    ratio = avx512 / avx2;
  }
  std::sort(ratios.begin(), ratios.end());
  const double median_ratio = (ratios[kPairs / 2 - 1] + ratios[kPairs / 2]) / 2;
  return best_avx512 >= kOutpaces * best_avx2 && median_ratio >= kOutpaces;
}

// -1 until measured or settled, then 0 or 1.
std::atomic<int> avx512_verdict{-1};

}  // namespace

FmaWidth widest_fma() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return FmaWidth::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return FmaWidth::kAvx2;
  return FmaWidth::kScalar;
}

int fma_lanes(FmaWidth width) {
  return width == FmaWidth::kAvx512 ? 16 : width == FmaWidth::kAvx2 ? 8 : 1;
}

float fma_rounds(FmaWidth width, long rounds) {
  switch (width) {
    case FmaWidth::kAvx512:
      return fma_rounds_avx512(rounds);
    case FmaWidth::kAvx2:
      return fma_rounds_avx2(rounds);
    case FmaWidth::kScalar:
      break;
  }
  return detail::fma_rounds_scalar(rounds);
}

bool avx512_fma_outpaces_avx2() {
  if (avx512_verdict.load() < 0) {
    int unknown = -1;
    avx512_verdict.compare_exchange_strong(unknown, measure_avx512_against_avx2() ? 1 : 0);
  }
  return avx512_verdict.load() == 1;
}

std::optional<bool> known_avx512_fma_verdict() {
  const int verdict = avx512_verdict.load();
  if (verdict < 0) return std::nullopt;
  return verdict == 1;
}

void settle_avx512_fma_outpaces_avx2(bool verdict) {
  if (widest_fma() == FmaWidth::kAvx512) avx512_verdict.store(verdict ? 1 : 0);
}

}  // namespace ddp::models

#include "peak_flops.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "models/fma_rate.h"

namespace {

using Clock = std::chrono::steady_clock;
using ddp::models::FmaWidth;

}  // namespace

PeakFlops measure_peak_flops(int threads, double seconds) {
  PeakFlops peak;
  const FmaWidth width = ddp::models::widest_fma();
  const auto kernel = [width](long rounds) { return ddp::models::fma_rounds(width, rounds); };
  const int lanes = ddp::models::fma_lanes(width);
  peak.isa = width == FmaWidth::kAvx512 ? "AVX-512" : width == FmaWidth::kAvx2 ? "AVX2+FMA" : "scalar";
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

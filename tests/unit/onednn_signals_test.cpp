// oneDNN 2.6's JIT GEMM kernels run with the stack pointer in a heap buffer; a signal handled meanwhile
// writes its frame over the heap (models/onednn_lstm.cpp). Preemption signals come mid-step, so the calls
// into oneDNN must survive a stream of them: here a second thread signals the calling thread every few
// microseconds while it runs the weight-gradient product of the imdb_lstm shapes, and every result must be
// the first one's bits, the heap intact, and the signals handled (after each call, not inside it).
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "models/onednn_lstm.h"

namespace ddp::models {
namespace {

std::atomic<int64_t> handled{0};

extern "C" void count_signal(int /*signal_number*/) {
  handled.fetch_add(1, std::memory_order_relaxed);
}

TEST(OnednnSignals, ProductsSurviveSignalsSentWhileTheyRun) {
  if (!onednn_missing().empty()) GTEST_SKIP() << onednn_missing();
  struct sigaction action {};
  action.sa_handler = count_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  struct sigaction previous {};
  ASSERT_EQ(sigaction(SIGUSR2, &action, &previous), 0);

  // d W_hh = d_gates^T h_prev over a batch of 32 and 80 steps: 512 x 128 x 2560.
  constexpr int kM = 512, kN = 128, kK = 2560;
  std::mt19937 random(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(kK) * kM), b(static_cast<std::size_t>(kK) * kN);
  for (float& x : a) x = uniform(random);
  for (float& x : b) x = uniform(random);
  std::vector<float> first(static_cast<std::size_t>(kM) * kN);
  onednn_sgemm(true, false, kM, kN, kK, 1.0f, a.data(), kM, b.data(), kN, 0.0f, first.data(), kN);

  std::atomic<bool> done{false};
  const pthread_t target = pthread_self();
  std::thread signaller([&] {
    while (!done.load()) {
      pthread_kill(target, SIGUSR2);
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  bool same = true;
  int calls = 0;
  std::vector<std::unique_ptr<char[]>> churn;  // heap blocks made and freed between the products
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
  while (std::chrono::steady_clock::now() < until) {
    std::vector<float> c(first.size(), 0.0f);
    onednn_sgemm(true, false, kM, kN, kK, 1.0f, a.data(), kM, b.data(), kN, 0.0f, c.data(), kN);
    same = same && std::memcmp(c.data(), first.data(), c.size() * sizeof(float)) == 0;
    churn.emplace_back(new char[1000 + 100 * (calls % 7)]);
    if (churn.size() > 16) churn.erase(churn.begin());
    ++calls;
  }
  done = true;
  signaller.join();
  churn.clear();
  ASSERT_EQ(sigaction(SIGUSR2, &previous, nullptr), 0);

  EXPECT_TRUE(same) << "a product under signals differs from the first";
  EXPECT_GT(calls, 1);
  EXPECT_GT(handled.load(), 0) << "no signal was handled: the test shows nothing";
}

}  // namespace
}  // namespace ddp::models

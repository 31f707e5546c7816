#include "tests/test_util.h"

#include <unistd.h>

#include <atomic>
#include <chrono>

namespace ddp::testing {

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
  path_ = std::filesystem::temp_directory_path() / ("ddptrain-test-" + std::to_string(getpid()) + "-" +
                                                    std::to_string(counter++) + "-" + std::to_string(stamp));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace ddp::testing

#include "tests/test_util.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <random>

#include "models/initializers.h"

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

std::string write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

std::vector<float> test_params(const models::ParamLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.total_size());
  models::initialize_keras(layout, params, seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> noise(-0.2f, 0.2f);
  for (const auto& tensor : layout.tensors()) {
    if (tensor.name.ends_with(".b_ih") || tensor.name.ends_with(".b_hh") || tensor.name == "dense.b") {
      for (std::size_t i = 0; i < tensor.size(); ++i) params[tensor.offset + i] += noise(rng);
    }
  }
  return params;
}

}  // namespace ddp::testing

#include "models/initializers.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <future>
#include <mutex>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/base/fast_math.h"

namespace ddp::models {
namespace {

// splitmix64's finalizer: turns (seed, tensor index) into well separated generator seeds, so that every
// tensor has its own stream and adding a tensor does not shift the numbers of the others.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Our own draws on top of mt19937_64 (whose output the standard fixes) rather than the <random>
// distributions (whose algorithms it does not), so that every standard library gives the same parameters.
class Draws {
 public:
  Draws(uint64_t seed, uint64_t stream) : engine_(mix64(seed ^ mix64(stream))) {}

  // [0, 1) from the top 53 bits: every value is exact in a double.
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }
  double uniform(double low, double high) { return low + (high - low) * uniform(); }

  // Box-Muller; the second value of each pair is kept for the next call.
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = 1.0 - uniform();  // (0, 1]: log stays finite
    const double u2 = uniform();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double angle = 2.0 * std::numbers::pi * u2;
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

void fill_uniform(Draws& draws, float* out, std::size_t n, double limit) {
  for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(draws.uniform(-limit, limit));
}

// Keras's Orthogonal for the recurrent kernel [H, 4H]: QR of a normal (4H, H) matrix with q's columns
// multiplied by sign(diag(r)), then transposed. Our w_hh [4H, H] is that q itself: orthonormal_columns of
// the draws.
void fill_orthogonal(Draws& draws, float* out, std::size_t rows, std::size_t cols,
                     const std::function<void()>& progress) {
  std::vector<double> q(rows * cols);
  constexpr std::size_t kDrawsPerProgress = std::size_t{1} << 20;
  for (std::size_t i = 0; i < q.size(); ++i) {  // row-major (rows, cols), as Keras draws it
    q[i] = draws.normal();
    if (progress && (i + 1) % kDrawsPerProgress == 0) progress();
  }
  orthonormal_columns(q, rows, cols, progress);
  for (std::size_t i = 0; i < q.size(); ++i) out[i] = static_cast<float>(q[i]);
}

double glorot_limit(int64_t fan_in, int64_t fan_out) {
  return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
}

}  // namespace

namespace {

// Eight doubles that GCC keeps in one AVX-512 register, two AVX2 ones or four SSE2 ones: the same arithmetic
// lane by lane on each.
using Lanes = double __attribute__((vector_size(64)));
constexpr std::size_t kLanes = sizeof(Lanes) / sizeof(double);

// Adds x . y[c] over n doubles to sums[c] for four y at once, each dot product in eight lanes (element i in
// lane i % 8, a tail in lane 0) added up in one fixed order. This file is compiled without contracting a
// multiply and an add into one FMA (CMakeLists.txt), so every clone gives the same bits.
DDP_VECTOR_CLONES void add_dot4(const double* x, const double* const y[4], std::size_t n, double sums[4]) {
  Lanes lanes[4] = {};
  std::size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Lanes xi;
    std::memcpy(&xi, x + i, sizeof(xi));
    for (int c = 0; c < 4; ++c) {
      Lanes yi;
      std::memcpy(&yi, y[c] + i, sizeof(yi));
      lanes[c] += xi * yi;
    }
  }
  for (; i < n; ++i) {
    for (int c = 0; c < 4; ++c) lanes[c][0] += x[i] * y[c][i];
  }
  for (int c = 0; c < 4; ++c) {
    const Lanes& l = lanes[c];
    sums[c] += ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
}

double dot(const double* x, const double* y, std::size_t n) {
  const double* const ys[4] = {y, y, y, y};
  double sums[4] = {};
  add_dot4(x, ys, n, sums);
  return sums[0];
}

// v -= c * u over n doubles.
DDP_VECTOR_CLONES void subtract_scaled(double* v, double c, const double* u, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) v[i] -= c * u[i];
}

// v -= (c[0] u[0] + c[1] u[1]) + (c[2] u[2] + c[3] u[3]) over n doubles: v is read and written once for four
// columns.
DDP_VECTOR_CLONES void subtract_scaled4(double* v, const double c[4], const double* const u[4],
                                        std::size_t n) {
  const double* u0 = u[0];
  const double* u1 = u[1];
  const double* u2 = u[2];
  const double* u3 = u[3];
  for (std::size_t i = 0; i < n; ++i) v[i] -= (c[0] * u0[i] + c[1] * u1[i]) + (c[2] * u2[i] + c[3] * u3[i]);
}

}  // namespace

// Classical Gram-Schmidt run twice (each column's projection on the columns before it taken twice, which
// keeps them orthonormal to double precision) on a column-major copy, a block of columns at a time, over
// slices of rows that stay in the L1 cache: the block's coefficients on every earlier column (each earlier
// column read from memory once a pass), their subtraction, then the block's columns on each other. Column by
// column, with dot products that waited on one add each, hidden 2000 took over a minute. Every sum runs in
// an order fixed by the code, so the result is the same on every x86-64 CPU.
void orthonormal_columns(std::vector<double>& a, std::size_t rows, std::size_t cols,
                         const std::function<void()>& progress) {
  if (a.size() != rows * cols)
    throw std::invalid_argument("orthonormal_columns: the matrix is not rows x cols");
  constexpr std::size_t kBlock = 32;
  constexpr std::size_t kRowSlice = 256;
  std::vector<double> q(rows * cols);  // column-major: column j at q[j * rows]
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; ++j) q[j * rows + r] = a[r * cols + j];
  }
  const auto column = [&](std::size_t j) { return &q[j * rows]; };
  std::vector<double> coefficients;  // [earlier column][block column]
  for (std::size_t first = 0; first < cols; first += kBlock) {
    const std::size_t width = std::min(kBlock, cols - first);
    for (int pass = 0; pass < 2 && first > 0; ++pass) {
      coefficients.assign(first * kBlock, 0.0);
      for (std::size_t begin = 0; begin < rows; begin += kRowSlice) {
        const std::size_t n = std::min(kRowSlice, rows - begin);
        for (std::size_t k = 0; k < first; ++k) {
          for (std::size_t j = 0; j < width; j += 4) {
            // A block narrower than four repeats its last column, whose sum is not kept.
            const double* const block[4] = {column(first + std::min(j, width - 1)) + begin,
                                            column(first + std::min(j + 1, width - 1)) + begin,
                                            column(first + std::min(j + 2, width - 1)) + begin,
                                            column(first + std::min(j + 3, width - 1)) + begin};
            double sums[4] = {};
            add_dot4(column(k) + begin, block, n, sums);
            for (std::size_t c = 0; c < 4 && j + c < width; ++c) coefficients[k * kBlock + j + c] += sums[c];
          }
        }
        if (progress) progress();  // a block's pass takes seconds of a starved core at large hidden sizes
      }
      for (std::size_t begin = 0; begin < rows; begin += kRowSlice) {
        const std::size_t n = std::min(kRowSlice, rows - begin);
        std::size_t k = 0;
        for (; k + 4 <= first; k += 4) {
          const double* const u[4] = {column(k) + begin, column(k + 1) + begin, column(k + 2) + begin,
                                      column(k + 3) + begin};
          for (std::size_t j = 0; j < width; ++j) {
            const double c[4] = {coefficients[k * kBlock + j], coefficients[(k + 1) * kBlock + j],
                                 coefficients[(k + 2) * kBlock + j], coefficients[(k + 3) * kBlock + j]};
            subtract_scaled4(column(first + j) + begin, c, u, n);
          }
        }
        for (; k < first; ++k) {
          for (std::size_t j = 0; j < width; ++j)
            subtract_scaled(column(first + j) + begin, coefficients[k * kBlock + j], column(k) + begin, n);
        }
        if (progress) progress();
      }
    }
    for (std::size_t j = 0; j < width; ++j) {
      double* v = column(first + j);
      for (int pass = 0; pass < 2; ++pass) {
        for (std::size_t k = first; k < first + j; ++k)
          subtract_scaled(v, dot(column(k), v, rows), column(k), rows);
      }
      const double norm = std::sqrt(dot(v, v, rows));
      for (std::size_t r = 0; r < rows; ++r) v[r] /= norm;
    }
    if (progress) progress();
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < cols; ++j) a[r * cols + j] = q[j * rows + r];
  }
}

void initialize_keras(const ParamLayout& layout, std::span<float> params, uint64_t seed,
                      const std::function<void()>& progress, int parallel) {
  if (params.size() != layout.total_size()) {
    throw std::invalid_argument("initialize_keras: the buffer holds " + std::to_string(params.size()) +
                                " floats, the layout " + std::to_string(layout.total_size()));
  }
  const int64_t hidden = layout.shape().hidden;
  const auto& tensors = layout.tensors();
  // The orthogonal matrices (seconds each at large hidden sizes) are drawn up to `parallel` side by side, one
  // thread each, after the other tensors: every tensor has a stream of draws of its own, so the bits do not
  // depend on it. Each holds two double copies of its matrix meanwhile. `progress` is called by one thread at
  // a time.
  std::mutex progress_mutex;
  const std::function<void()> told = [&] {
    if (!progress) return;
    const std::lock_guard<std::mutex> lock(progress_mutex);
    progress();
  };
  std::vector<std::function<void()>> orthogonal;
  for (std::size_t index = 0; index < tensors.size(); ++index) {
    const ParamTensor& tensor = tensors[index];
    float* out = params.data() + tensor.offset;
    const std::size_t n = tensor.size();
    Draws draws(seed, index);
    const std::string& name = tensor.name;
    if (name == "embedding") {
      fill_uniform(draws, out, n, 0.05);
    } else if (name.ends_with(".w_ih")) {
      // Keras's kernel is [in, 4H]: fan_in = in, fan_out = 4H.
      fill_uniform(draws, out, n, glorot_limit(tensor.shape[1], tensor.shape[0]));
    } else if (name.ends_with(".w_hh")) {
      orthogonal.emplace_back([draws, out, &tensor, &told]() mutable {
        fill_orthogonal(draws, out, static_cast<std::size_t>(tensor.shape[0]),
                        static_cast<std::size_t>(tensor.shape[1]), told);
      });
      continue;
    } else if (name.ends_with(".b_ih")) {
      // LSTM's unit_forget_bias: gate block 1 (f) starts at 1 so that early training does not forget. Keras's
      // GRU starts every bias at 0.
      const bool forget_gate_one = layout.shape().cell == Cell::kLstm;
      for (std::size_t i = 0; i < n; ++i) {
        const int64_t gate = static_cast<int64_t>(i) / hidden;
        out[i] = forget_gate_one && gate == 1 ? 1.0f : 0.0f;
      }
    } else if (name.ends_with(".b_hh") || name == "dense.b") {
      for (std::size_t i = 0; i < n; ++i) out[i] = 0.0f;
    } else if (name == "dense.w") {
      // Keras's kernel is [D, outputs].
      const int64_t outputs = tensor.shape.size() == 1 ? 1 : tensor.shape[0];
      fill_uniform(draws, out, n, glorot_limit(tensor.shape.back(), outputs));
    } else {
      throw std::logic_error("initialize_keras: no initializer for tensor '" + name + "'");
    }
    told();
  }
  const auto wave = static_cast<std::size_t>(std::max(parallel, 1));
  for (std::size_t first = 0; first < orthogonal.size(); first += wave) {
    if (wave == 1) {
      orthogonal[first]();
      continue;
    }
    std::vector<std::future<void>> drawing;
    for (std::size_t i = first; i < std::min(first + wave, orthogonal.size()); ++i)
      drawing.push_back(std::async(std::launch::async, orthogonal[i]));
    // Every thread ends before a failure (a progress callback's, ending the draw) is passed on.
    for (std::future<void>& matrix : drawing) matrix.wait();
    for (std::future<void>& matrix : drawing) matrix.get();
  }
}

}  // namespace ddp::models

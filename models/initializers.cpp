#include "models/initializers.h"

#include <cmath>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

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
// multiplied by sign(diag(r)), then transposed. Our w_hh [4H, H] is that q itself. Gram-Schmidt yields the
// QR with a positive diagonal of r, which is exactly the sign-corrected q. Modified Gram-Schmidt run twice
// keeps the columns orthonormal to double precision.
void fill_orthogonal(Draws& draws, float* out, std::size_t rows, std::size_t cols) {
  std::vector<double> drawn(rows * cols);
  for (double& v : drawn) v = draws.normal();  // row-major (rows, cols), as Keras draws it
  // Column-major copy so that every column is contiguous.
  std::vector<double> q(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) q[c * rows + r] = drawn[r * cols + c];
  }
  for (std::size_t c = 0; c < cols; ++c) {
    double* v = &q[c * rows];
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < c; ++k) {
        const double* u = &q[k * rows];
        double dot = 0;
        for (std::size_t r = 0; r < rows; ++r) dot += u[r] * v[r];
        for (std::size_t r = 0; r < rows; ++r) v[r] -= dot * u[r];
      }
    }
    double norm = 0;
    for (std::size_t r = 0; r < rows; ++r) norm += v[r] * v[r];
    norm = std::sqrt(norm);
    for (std::size_t r = 0; r < rows; ++r) v[r] /= norm;
  }
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < cols; ++c) out[r * cols + c] = static_cast<float>(q[c * rows + r]);
  }
}

double glorot_limit(int64_t fan_in, int64_t fan_out) {
  return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
}

}  // namespace

void initialize_keras(const ParamLayout& layout, std::span<float> params, uint64_t seed) {
  if (params.size() != layout.total_size()) {
    throw std::invalid_argument("initialize_keras: the buffer holds " + std::to_string(params.size()) +
                                " floats, the layout " + std::to_string(layout.total_size()));
  }
  const int64_t hidden = layout.shape().hidden;
  const auto& tensors = layout.tensors();
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
      fill_orthogonal(draws, out, static_cast<std::size_t>(tensor.shape[0]),
                      static_cast<std::size_t>(tensor.shape[1]));
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
  }
}

}  // namespace ddp::models

// The element-wise math the CUDA kernels share with the host (DDP_HOST_DEVICE functions), tested here on the
// host: what runs on a GPU is this same source, so these tests and the self-check's bit-for-bit optimizer
// comparison together cover it where no GPU is at hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "comm/wire_cast.h"
#include "engine/optimizer/optimizer.h"
#include "engine/optimizer/optimizer_math.h"
#include "models/output_math.h"

namespace ddp {
namespace {

using comm::bfloat16_to_float;
using comm::bits_of;
using comm::float_of;
using comm::float_to_bfloat16;
using comm::float_to_half;
using comm::half_to_float;

// --- Optimizers -------------------------------------------------------------------------------------------

// The host optimizer's vectorized loop (the AVX2 clone where the CPU has it) gives the bits of the shared
// one-element function, which is what the CUDA kernel runs: no fused multiply-add crept in on either path.
TEST(ElementwiseMath, HostOptimizersEqualTheSharedElementFunctionBitForBit) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t n = 1003;  // a vector tail too
  for (const char* name : {"adam", "sgd"}) {
    optim::OptimizerSettings settings;
    settings.name = name;
    settings.learning_rate = 0.01;
    settings.momentum = 0.9;
    std::vector<float> params(n);
    std::vector<float> grads(n);
    for (auto& p : params) p = normal(rng);
    std::vector<float> expected = params;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), velocity(n, 0.0f);
    auto optimizer = optim::make_optimizer(settings, n);
    for (int64_t step = 1; step <= 3; ++step) {
      for (auto& g : grads) g = normal(rng) * 0.1f;
      optimizer->step(params, grads);
      const optim::AdamCoefficients c = optim::adam_coefficients(settings, step);
      for (std::size_t i = 0; i < n; ++i) {
        if (settings.name == "adam") {
          optim::adam_update_one(expected[i], grads[i], m[i], v[i], c);
        } else {
          optim::sgd_update_one(expected[i], grads[i], velocity[i], optim::sgd_coefficients(settings, step));
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits_of(params[i]), bits_of(expected[i])) << name << " step " << step << " element " << i;
      }
    }
  }
}

// Adam's first step moves every parameter by about lr against its gradient's sign (m / sqrt(v) = g / |g|),
// and SGD by lr g: the shared functions against the formulas in double.
TEST(ElementwiseMath, UpdatesFollowTheirFormulas) {
  optim::OptimizerSettings adam;
  adam.learning_rate = 0.001;
  const optim::AdamCoefficients c = optim::adam_coefficients(adam, 1);
  EXPECT_NEAR(c.lr_t, 0.001 * std::sqrt(1 - 0.999) / (1 - 0.9), 1e-9);
  for (const float g : {0.5f, -2.0f, 1e-3f}) {
    float p = 1.0f, m = 0.0f, v = 0.0f;
    optim::adam_update_one(p, g, m, v, c);
    EXPECT_EQ(m, (1.0f - 0.9f) * g);
    EXPECT_EQ(v, (1.0f - 0.999f) * g * g);
    const double step = c.lr_t * (0.1 * g) / (std::sqrt(0.001 * g * g) + 1e-7);
    EXPECT_NEAR(p, 1.0 - step, 1e-6) << g;
  }
  float p = 1.0f, velocity = 0.5f;
  optim::sgd_update_one(p, 2.0f, velocity, optim::SgdCoefficients{0.1f, 0.9f});
  EXPECT_FLOAT_EQ(velocity, 0.9f * 0.5f - 0.1f * 2.0f);
  EXPECT_FLOAT_EQ(p, 1.0f + velocity);
}

// --- Output layer -----------------------------------------------------------------------------------------

TEST(ElementwiseMath, SigmoidAndLossAreStableAndExact) {
  for (double z = -40; z <= 40; z += 0.37) {
    const long double reference = 1.0L / (1.0L + std::exp(-static_cast<long double>(z)));
    EXPECT_NEAR(models::stable_sigmoid(z), static_cast<double>(reference),
                1e-15 * static_cast<double>(reference))
        << z;
    // -log sigmoid(z) = log(1 + e^-z) and -log(1 - sigmoid(z)) = log(1 + e^z), in long double.
    const long double positive = std::log(1.0L + std::exp(-static_cast<long double>(z)));
    const long double negative = std::log(1.0L + std::exp(static_cast<long double>(z)));
    EXPECT_NEAR(models::logistic_loss(z, 1.0), static_cast<double>(positive),
                1e-13 * std::max(1.0, std::abs(z)))
        << z;
    EXPECT_NEAR(models::logistic_loss(z, 0.0), static_cast<double>(negative),
                1e-13 * std::max(1.0, std::abs(z)))
        << z;
  }
  // Far out, where 1 + e^-z overflows or the naive log underflows, both stay finite and exact.
  EXPECT_EQ(models::stable_sigmoid(-800), 0.0);
  EXPECT_EQ(models::stable_sigmoid(800), 1.0);
  EXPECT_DOUBLE_EQ(models::logistic_loss(-800, 1.0), 800.0);
  EXPECT_DOUBLE_EQ(models::logistic_loss(800, 0.0), 800.0);
  EXPECT_EQ(models::logistic_loss(800, 1.0), 0.0);
  EXPECT_TRUE(models::predicts_label(0.0, 1.0));
  EXPECT_TRUE(models::predicts_label(-0.1, 0.0));
  EXPECT_FALSE(models::predicts_label(0.3, 0.0));
  EXPECT_FLOAT_EQ(models::logit_gradient(0.75f, 1.0f, 0.25f), -0.0625f);
  EXPECT_DOUBLE_EQ(models::logit_gradient(0.75, 0.0, 0.5), 0.375);
}

// --- 16-bit wire types ------------------------------------------------------------------------------------

// The nearest of the finite halves to |x| (ties to the even mantissa), or infinity from 65520 on: found by
// search in a table of every finite half, independent of the bit manipulation under test.
class HalfReference {
 public:
  HalfReference() {
    for (uint32_t h = 0; h < 0x7c00u; ++h) {
      const uint32_t e = h >> 10;
      const double mantissa = static_cast<double>(h & 0x3ffu);
      values_.push_back(e == 0 ? std::ldexp(mantissa, -24)
                               : std::ldexp(1024 + mantissa, static_cast<int>(e) - 25));
    }
  }
  uint16_t operator()(float x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::abs(static_cast<double>(x));
    if (a >= 65520.0) return sign | 0x7c00;
    const auto above = std::lower_bound(values_.begin(), values_.end(), a);
    if (above == values_.begin()) return sign;
    if (above == values_.end()) return sign | 0x7bff;
    const auto hi = static_cast<uint16_t>(above - values_.begin());
    const auto lo = static_cast<uint16_t>(hi - 1);
    const double to_hi = *above - a;
    const double to_lo = a - values_[lo];
    if (to_hi < to_lo || (to_hi == to_lo && (hi & 1) == 0)) return sign | hi;
    return sign | lo;
  }

 private:
  std::vector<double> values_;  // index = the half's bits
};

// bfloat16: the two neighbours in the upper 16 bits, compared in double.
uint16_t bfloat16_reference(float x) {
  const uint32_t bits = bits_of(x);
  const uint32_t lo = bits & 0xffff0000u;
  const uint32_t hi = lo + 0x10000u;  // the next one away from zero (may be infinity)
  const double a = std::abs(static_cast<double>(x));
  const double to_lo = a - std::abs(static_cast<double>(float_of(lo)));
  const double to_hi = (hi & 0x7fffffffu) >= 0x7f800000u ? std::ldexp(1.0, 128) - a
                                                         : std::abs(static_cast<double>(float_of(hi))) - a;
  const bool up = to_hi < to_lo || (to_hi == to_lo && ((lo >> 16) & 1u) != 0);
  return static_cast<uint16_t>((up ? hi : lo) >> 16);
}

// Finite floats across the whole range (every 997th bit pattern, both signs) and the edges.
std::vector<float> sample_floats() {
  std::vector<float> xs;
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 997) {
    xs.push_back(float_of(static_cast<uint32_t>(bits)));
    xs.push_back(-float_of(static_cast<uint32_t>(bits)));
  }
  for (const float edge : {0.0f, 65504.0f, 65519.99f, 65520.0f, 65536.0f, 6.1035156e-5f, 6.0975552e-5f,
                           5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f, 4.4703484e-8f, 1.0f + 1.0f / 2048,
                           1.0f + 3.0f / 2048, std::numeric_limits<float>::max(), 3.3961514e38f}) {
    xs.push_back(edge);
    xs.push_back(-edge);
  }
  return xs;
}

TEST(ElementwiseMath, FloatToHalfRoundsToNearestEven) {
  const HalfReference reference;
  for (const float x : sample_floats()) {
    ASSERT_EQ(float_to_half(x), reference(x)) << x << " (bits " << std::hex << bits_of(x) << ")";
  }
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t nan = float_to_half(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
}

TEST(ElementwiseMath, EveryHalfGoesToFloatAndBackUnchanged) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float x = half_to_float(static_cast<uint16_t>(h));
    if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0) {
      EXPECT_TRUE(std::isnan(x)) << std::hex << h;
      continue;
    }
    ASSERT_EQ(float_to_half(x), h) << std::hex << h << " -> " << x;
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
}

TEST(ElementwiseMath, FloatToBfloat16RoundsToNearestEven) {
  for (const float x : sample_floats()) {
    ASSERT_EQ(float_to_bfloat16(x), bfloat16_reference(x)) << x << " (bits " << std::hex << bits_of(x) << ")";
    // bfloat16 keeps the float's range: back to float is exact and within half a unit of 8 bits.
    const float back = bfloat16_to_float(float_to_bfloat16(x));
    if (std::isfinite(back)) {  // bfloat16's smallest step is 2^-133, among the subnormals
      EXPECT_LE(std::abs(static_cast<double>(back) - x),
                std::max(std::ldexp(std::abs(static_cast<double>(x)), -8), std::ldexp(1.0, -134)))
          << x;
    }
  }
  EXPECT_EQ(float_to_bfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
}

// --- fp16 gradients on the wire, scaled (comm.compression = fp16)
// -------------------------------------------

// The scale is a power of two that puts the sum of `ranks` values of the bucket's largest magnitude in
// [2^13, 2^15): no overflow, and as many of fp16's bits as the largest allows.
TEST(HalfWire, TheScaleIsAPowerOfTwoThatKeepsTheSumBelow2To15) {
  for (const float largest : {1e-12f, 1e-8f, 3e-5f, 1.0f, 56.0f, 1e4f, 65504.0f, 2e5f, 1e30f}) {
    for (const int ranks : {1, 2, 3, 8, 64, 1000}) {
      const float scale = comm::half_wire_scale(largest, ranks);
      int exponent = 0;
      EXPECT_EQ(std::frexp(scale, &exponent), 0.5f) << largest << " " << ranks;
      const double sum = static_cast<double>(largest) * scale * ranks;
      EXPECT_LT(sum, 32768.0) << largest << " " << ranks;
      EXPECT_GE(sum, 8192.0) << largest << " " << ranks;
    }
  }
  EXPECT_EQ(comm::half_wire_scale(0.0f, 4), 1.0f);
  EXPECT_EQ(comm::half_wire_scale(std::numeric_limits<float>::infinity(), 4), 1.0f);
  EXPECT_EQ(comm::half_wire_scale(std::numeric_limits<float>::quiet_NaN(), 4), 1.0f);
}

// A ring's fp16 sum: each hop adds its value to the partial sum and rounds to fp16.
float ring_sum_in_half(const std::vector<uint16_t>& wire) {
  uint16_t partial = wire[0];
  for (std::size_t r = 1; r < wire.size(); ++r)
    partial = float_to_half(half_to_float(partial) + half_to_float(wire[r]));
  return half_to_float(partial);
}

// Gradients of realistic magnitudes, 12 decades below a bucket's largest with mixed signs, averaged over
// `ranks` the way the NCCL backend does, scaled (the kernels' math: half_wire_scale, the cast, a ring's fp16
// sum, the scale and 1/ranks undone in float) and, for comparison, as it did before (each value cast, scaled
// by 1/ranks in fp16, summed): the largest error of the average, in units of the bucket's largest magnitude.
struct WireErrors {
  double scaled = 0;
  double unscaled = 0;
};
WireErrors half_wire_errors(float largest, int ranks) {
  std::mt19937_64 rng(static_cast<uint64_t>(ranks) * 1000 + static_cast<uint64_t>(std::log10(largest) + 20));
  std::uniform_real_distribution<double> decades(-12.0, 0.0);
  constexpr std::size_t kCount = 2048;
  std::vector<std::vector<float>> grads(static_cast<std::size_t>(ranks), std::vector<float>(kCount));
  float found = 0;
  for (auto& rank : grads) {
    for (float& g : rank) {
      g = static_cast<float>(largest * std::pow(10.0, decades(rng)) * ((rng() & 1) ? 1 : -1));
      found = std::max(found, std::abs(g));
    }
  }
  const float scale = comm::half_wire_scale(found, ranks);
  WireErrors errors;
  for (std::size_t i = 0; i < kCount; ++i) {
    double exact = 0;
    std::vector<uint16_t> scaled;
    std::vector<uint16_t> unscaled;
    for (const auto& rank : grads) {
      exact += rank[i];
      scaled.push_back(float_to_half(rank[i] * scale));
      unscaled.push_back(
          float_to_half(half_to_float(float_to_half(rank[i])) * (1.0f / static_cast<float>(ranks))));
    }
    exact /= ranks;
    const float average = (ring_sum_in_half(scaled) * (1.0f / scale)) * (1.0f / static_cast<float>(ranks));
    const auto error = [&](double got) {
      return std::isfinite(got) ? std::abs(got - exact) / found : INFINITY;
    };
    errors.scaled = std::max(errors.scaled, error(average));
    errors.unscaled = std::max(errors.unscaled, error(ring_sum_in_half(unscaled)));
  }
  return errors;
}

// Scaled, the average's error stays within (ranks + 1) units of 2^-11 of the bucket's largest magnitude at
// every scale; unscaled, a bucket of small gradients lost its bits to fp16's subnormals and one of large
// gradients overflowed.
TEST(HalfWire, TheScaledAverageKeepsElevenBitsOfTheLargestGradient) {
  for (const int ranks : {1, 2, 4, 8}) {
    for (const float largest : {1e-5f, 1e-2f, 1.0f, 1e4f, 2e5f}) {
      const WireErrors errors = half_wire_errors(largest, ranks);
      EXPECT_LE(errors.scaled, (ranks + 1) * std::ldexp(1.0, -11))
          << "largest " << largest << ", ranks " << ranks;
    }
  }
  EXPECT_GT(half_wire_errors(1e-5f, 8).unscaled, 9 * std::ldexp(1.0, -11)) << "subnormals";
  EXPECT_TRUE(std::isinf(half_wire_errors(2e5f, 2).unscaled)) << "overflow";
}

}  // namespace
}  // namespace ddp

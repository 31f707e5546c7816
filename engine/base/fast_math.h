// Branch-free float exp, sigmoid and tanh that GCC vectorizes at -O3 without -ffast-math (plain SSE2 is
// enough: no float-to-int conversion, no calls, selects instead of branches), for the LSTM's gate
// nonlinearities. Relative error about 1e-7 (a few ulp) over the whole float range; NaN stays NaN.
// Float only: the double model keeps std::exp and std::tanh as the reference.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

// Put on a function whose loops vectorize: GCC compiles it twice, for x86-64-v3 (AVX2 and FMA: 8 floats a
// vector instead of SSE2's 4) and for the build's own target, and the loader picks the one the CPU runs
// (function multiversioning; no compile flag needed). Empty with other compilers or architectures.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define DDP_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DDP_VECTOR_CLONES
#endif

namespace ddp::models::fast {

// c ? a : b on the bits, so that the vectorizer sees no branch: under the default -ftrapping-math GCC sinks
// the computation of a plain ?:'s arm into a branch (it could raise an FP exception) and then gives up.
inline float select(bool c, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) | (std::bit_cast<uint32_t>(b) & ~mask));
}

namespace detail {

// e^x for x in [-126 ln 2, 127.5 ln 2], Cephes's expf: x = k ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, 2^k built in the exponent bits.
inline float exp_in_range(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;  // few mantissa bits: k * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding 1.5 * 2^23 rounds to an integer (round to nearest) that then sits in the low mantissa bits.
  constexpr float kRound = 12582912.0f;
  const float shifted = x * kLog2e + kRound;
  const float k = shifted - kRound;
  const float r = (x - k * kLn2Hi) - k * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // k (in [-126, 127]) as two's complement in the low bits of `shifted`; unsigned arithmetic, so no
  // float-to-int conversion and no overflow even for NaN.
  const uint32_t k_bits = std::bit_cast<uint32_t>(shifted) - std::bit_cast<uint32_t>(kRound);
  return p * std::bit_cast<float>((k_bits + 127u) << 23);
}

constexpr float kExpMax = 88.3762626647949f;   // 127.5 ln 2
constexpr float kExpMin = -87.3365478515625f;  // -126 ln 2

}  // namespace detail

// e^x. x is clamped to [-87.34, 88.38], where 2^k stays a normal float: below it the result is about
// 1.2e-38 instead of a denormal or 0, above it about 2.4e38 instead of infinity.
inline float exp(float x) {
  x = select(x > detail::kExpMax, detail::kExpMax, x);  // NaN compares false and passes through
  x = select(x < detail::kExpMin, detail::kExpMin, x);
  return detail::exp_in_range(x);
}

// e^x for x <= 0 (or NaN), clamped below only.
inline float exp_nonpositive(float x) {
  return detail::exp_in_range(select(x < detail::kExpMin, detail::kExpMin, x));
}

// 1 / (1 + e^-x) from e = e^-|x| <= 1, so that neither side overflows and the negative side keeps its
// relative accuracy: e / (1 + e) there.
inline float sigmoid(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  const float numerator = x >= 0.0f ? 1.0f : e;  // selects an operand: vectorizes as is
  return numerator / (1.0f + e);
}

// tanh: for |x| < 0.625 Cephes's odd polynomial (1 - e^-2|x| would cancel there), otherwise
// (1 - e) / (1 + e) with e = e^-2|x| <= 0.29, and the sign of x.
inline float tanh(float x) {
  const float a = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float e = exp_nonpositive(-2.0f * a);
  const float large = std::copysign((1.0f - e) / (1.0f + e), x);
  return select(a < 0.625f, small, large);
}

}  // namespace ddp::models::fast

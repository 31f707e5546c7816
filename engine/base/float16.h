// float to IEEE half and to bfloat16 with round to nearest, ties to even, and back, exactly as the GPU's
// conversion instructions do, on the host and in kernels alike: the gradients' 16-bit wire
// (comm/wire_cast.h) and cuDNN's bfloat16 recurrent layers (model.precision = bf16) go through these, and
// the host tests check them against the host compiler's _Float16 and a reference in double.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine/base/host_device.h"

namespace ddp {

DDP_HOST_DEVICE uint32_t bits_of(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  return bits;
}

DDP_HOST_DEVICE float float_of(uint32_t bits) {
  float value;
  memcpy(&value, &bits, sizeof(value));
  return value;
}

// bfloat16 is the upper half of a float: round the lower 16 bits away (to even on a tie). NaN stays NaN
// (quiet); a value that rounds past the largest bfloat16 becomes infinite, as the carry into the exponent
// gives.
DDP_HOST_DEVICE uint16_t float_to_bfloat16(float value) {
  const uint32_t bits = bits_of(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

DDP_HOST_DEVICE float bfloat16_to_float(uint16_t value) {
  return float_of(static_cast<uint32_t>(value) << 16);
}

// IEEE half: 5 exponent bits (bias 15), 10 mantissa bits. Magnitudes from 65520 on round to infinity, those
// below 2^-14 to the subnormals (multiples of 2^-24), those up to 2^-25 to zero.
DDP_HOST_DEVICE uint16_t float_to_half(float value) {
  const uint32_t bits = bits_of(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {  // NaN: quiet, with the top of its payload
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520, or infinite
  if (magnitude >= 0x38800000u) {                                              // >= 2^-14: normal
    // Rebias the exponent (127 -> 15) and keep 10 of the 23 mantissa bits; a carry out of the mantissa
    // moves into the exponent, which is the right result.
    uint32_t half = (magnitude - 0x38000000u) >> 13;
    const uint32_t rest = magnitude & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  const uint32_t exponent = magnitude >> 23;
  if (exponent < 102) return static_cast<uint16_t>(sign);  // below 2^-25: zero
  // Subnormal: the mantissa with its leading 1, in units of 2^-24.
  const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exponent;  // 14 for 2^-15 ... 24 for 2^-25
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1u) != 0)) ++half;  // 0x400 is the smallest normal
  return static_cast<uint16_t>(sign | half);
}

DDP_HOST_DEVICE float half_to_float(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  const uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1fu) return float_of(sign | 0x7f800000u | (mantissa << 13));  // infinity, NaN
  if (exponent != 0) return float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa x 2^-24, exact in float.
  return float_of(sign | bits_of(static_cast<float>(mantissa) * 5.9604644775390625e-8f));
}

}  // namespace ddp

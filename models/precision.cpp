#include "models/precision.h"

#include <array>
#include <cmath>
#include <utility>

#include "engine/base/errors.h"

namespace ddp::models {
namespace {

constexpr std::array<std::pair<Precision, const char*>, 4> kNames{{
    {Precision::kFp32, "fp32"},
    {Precision::kTf32, "tf32"},
    {Precision::kBf16, "bf16"},
    {Precision::kFp16, "fp16"},
}};

}  // namespace

Precision parse_precision(const std::string& text, const std::string& key) {
  for (const auto& [precision, name] : kNames) {
    if (text == name) return precision;
  }
  throw UserError(key + " = " + text + ": expected fp32, tf32, bf16 or fp16");
}

std::string precision_name(Precision precision) {
  for (const auto& [candidate, name] : kNames) {
    if (candidate == precision) return name;
  }
  return "unknown";
}

double unit_roundoff(Precision precision) {
  // Half the spacing of the numbers near 1: 2^-(stored mantissa bits + 1).
  switch (precision) {
    case Precision::kTf32:
    case Precision::kFp16:
      return std::ldexp(1.0, -11);
    case Precision::kBf16:
      return std::ldexp(1.0, -8);
    case Precision::kFp32:
      break;
  }
  return std::ldexp(1.0, -24);
}

bool sixteen_bit_data(Precision precision) {
  return precision == Precision::kBf16 || precision == Precision::kFp16;
}

bool scales_loss(Precision precision) {
  return precision == Precision::kFp16;
}

}  // namespace ddp::models

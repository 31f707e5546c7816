#include "models/precision.h"

#include <array>
#include <cmath>
#include <utility>

#include "engine/base/errors.h"

namespace ddp::models {
namespace {

constexpr std::array<std::pair<Precision, const char*>, 2> kNames{{
    {Precision::kFp32, "fp32"},
    {Precision::kTf32, "tf32"},
}};

}  // namespace

Precision parse_precision(const std::string& text, const std::string& key) {
  for (const auto& [precision, name] : kNames) {
    if (text == name) return precision;
  }
  if (text == "bf16" || text == "fp16") {
    throw UserError(key + " = " + text +
                    ": 16-bit recurrent layers are not built yet; expected fp32 or tf32");
  }
  throw UserError(key + " = " + text + ": expected fp32 or tf32");
}

std::string precision_name(Precision precision) {
  for (const auto& [candidate, name] : kNames) {
    if (candidate == precision) return name;
  }
  return "unknown";
}

double unit_roundoff(Precision precision) {
  // Half the spacing of the numbers near 1: 2^-(stored mantissa bits + 1).
  return precision == Precision::kTf32 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -24);
}

}  // namespace ddp::models

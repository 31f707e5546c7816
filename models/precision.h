// The arithmetic a GPU replica's recurrent layers run in (model.precision). Parameters, gradients and the
// optimizer's state stay float32 whatever it is, and CPU replicas always compute in float32: a precision is
// a speed a GPU may take, never a different model.
#pragma once

#include <string>

namespace ddp::models {

enum class Precision {
  kFp32,  // float32 products on FMA units (cuDNN's CUDNN_FMA_MATH), the CPU replica's arithmetic
  kTf32,  // float32 data, products on tensor cores with inputs rounded to TF32's 10 mantissa bits
          // (CUDNN_DEFAULT_MATH on sm_80 and newer; FMA units before), summed in float32
  kBf16,  // bfloat16 data and weights in cuDNN (8 significant bits, float32's range: no loss scaling),
          // tensor cores, float32 accumulation; float32 master weights and gradients around them
};

// "fp32", "tf32" or "bf16"; anything else, "fp16" included (not built yet: it needs dynamic loss scaling),
// is a UserError naming `key`.
Precision parse_precision(const std::string& text, const std::string& key = "model.precision");
std::string precision_name(Precision precision);

// The unit roundoff of the products' inputs: 2^-24 for fp32, 2^-11 for tf32, 2^-8 for bf16. The start-up
// self-check derives its tolerances from it (engine/self_check.h).
double unit_roundoff(Precision precision);

// True where cuDNN's recurrent layers hold 16-bit data (bf16).
bool sixteen_bit_data(Precision precision);

}  // namespace ddp::models

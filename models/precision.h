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
  kFp16,  // IEEE half data and weights in cuDNN (11 significant bits, largest 65504), tensor cores, float32
          // accumulation, with dynamic loss scaling (loss_scale.h) inside the replica's backward
};

// "fp32", "tf32", "bf16" or "fp16"; anything else is a UserError naming `key`.
Precision parse_precision(const std::string& text, const std::string& key = "model.precision");
std::string precision_name(Precision precision);

// The unit roundoff of the products' inputs: 2^-24 for fp32, 2^-11 for tf32 and fp16, 2^-8 for bf16. The
// start-up self-check derives its tolerances from it (engine/self_check.h).
double unit_roundoff(Precision precision);

// True where cuDNN's recurrent layers hold 16-bit data (bf16, fp16).
bool sixteen_bit_data(Precision precision);
// True where the replica scales the loss in backward (fp16): a step whose averaged gradient is not finite
// must then be skipped on every rank.
bool scales_loss(Precision precision);

}  // namespace ddp::models

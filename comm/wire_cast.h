// Gradients in 16 bits on the wire (comm.compression = fp16 | bf16): the casts of engine/base/float16.h,
// which the NCCL backend's cast kernels (nccl_reducer_cuda.cu) and the MPI wire call, and fp16's scale.
#pragma once

#include <math.h>

#include "engine/base/float16.h"
#include "engine/base/host_device.h"

namespace ddp::comm {

using ::ddp::bfloat16_to_float;
using ::ddp::bits_of;
using ::ddp::float_of;
using ::ddp::float_to_bfloat16;
using ::ddp::float_to_half;
using ::ddp::half_to_float;

// fp16 on the wire is scaled: every rank multiplies its gradients by the power of two this returns for the
// bucket's largest magnitude over every rank (`largest`) and the rank count, the wire type sums them, and the
// receiver undoes the scale and the 1/ranks in float. The scaled sum of `ranks` values stays below 2^15
// (fp16's largest finite is 65504), and the largest gradient lands in [2^14, 2^15) / ranks, so a gradient
// keeps fp16's 11 bits relative to the bucket's largest: the average's error is a few units of 2^-11 x
// largest, where an unscaled cast turned values above 65504 into infinities and values below about ranks x
// 3e-8 into zeros. 1 where `largest` is 0 or not finite (a NaN or an infinity passes as it is).
DDP_HOST_DEVICE float half_wire_scale(float largest, int ranks) {
  if (!(largest > 0.0f) || !(largest <= 3.4028234663852886e38f)) return 1.0f;
  int largest_exponent = 0;  // largest < 2^largest_exponent
  ::frexpf(largest, &largest_exponent);
  int rank_bits = 0;  // ranks <= 2^rank_bits
  while ((1LL << rank_bits) < static_cast<long long>(ranks)) ++rank_bits;
  int exponent = 15 - largest_exponent - rank_bits;
  exponent = exponent < -126 ? -126 : (exponent > 127 ? 127 : exponent);
  return ::ldexpf(1.0f, exponent);
}

}  // namespace ddp::comm

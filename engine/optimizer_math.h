// One element of the optimizers' updates, shared by the host loops (optimizer.cpp) and the CUDA kernels
// (optimizer_cuda.cu). Each operation is rounded on its own, in this order, on both sides: optimizer.cpp is
// compiled with -ffp-contract=off and optimizer_cuda.cu with --fmad=false (CMakeLists.txt), so that neither
// compiler fuses a multiply and an add, and IEEE division and square root (nvcc's defaults) make the GPU's
// parameters equal the host's bit for bit (checked on every GPU by the self-check).
#pragma once

#include <cmath>

#include "engine/base/host_device.h"

namespace ddp::engine {

struct AdamCoefficients {
  float beta1, beta2, epsilon;
  float lr_t;  // the step's learning rate with Keras's bias correction, lr sqrt(1 - b2^t) / (1 - b1^t)
};

// Keras's Adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  p -= lr_t m / (sqrt(v) + eps).
DDP_HOST_DEVICE void adam_update_one(float& p, float g, float& m, float& v, const AdamCoefficients& c) {
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  p -= c.lr_t * m / (::sqrtf(v) + c.epsilon);
}

// Keras's SGD with momentum: velocity = momentum velocity - lr g;  p += velocity.
DDP_HOST_DEVICE void sgd_update_one(float& p, float g, float& velocity, float lr, float momentum) {
  velocity = momentum * velocity - lr * g;
  p += velocity;
}

}  // namespace ddp::engine

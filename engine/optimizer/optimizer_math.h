// One element of the optimizers' updates, shared by the host loops (optimizer.cpp) and the CUDA kernels
// (optimizer_cuda.cu). Each operation is rounded on its own, in this order, on both sides: optimizer.cpp is
// compiled with -ffp-contract=off and optimizer_cuda.cu with --fmad=false (CMakeLists.txt), so that neither
// compiler fuses a multiply and an add, and IEEE division and square root (nvcc's defaults) make the GPU's
// parameters equal the host's bit for bit (checked on every GPU by the self-check).
#pragma once

#include <cmath>

#include "engine/base/host_device.h"

namespace ddp::optim {

struct AdamCoefficients {
  float beta1, beta2, epsilon;
  float lr_t;  // the step's learning rate with Keras's bias correction, lr sqrt(1 - b2^t) / (1 - b1^t)
  float weight_decay = 0;  // decoupled (AdamW): the step's learning rate times train.weight_decay
  float grad_scale = 1;    // gradient clipping: clip_norm / norm where the norm exceeds it, else 1
};

// Decoupled weight decay, before the update (AdamW, as PyTorch and Keras apply it): p -= lr wd p. Skipped at
// 0, so that a run without it keeps its bits even where p is not finite.
DDP_HOST_DEVICE void decay_weight(float& p, float weight_decay) {
  if (weight_decay != 0.0f) p -= weight_decay * p;
}

// Keras's Adam: m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  p -= lr_t m / (sqrt(v) + eps), with g
// scaled by clipping first (times 1 is exact: no clipping, no change).
DDP_HOST_DEVICE void adam_update_one(float& p, float g, float& m, float& v, const AdamCoefficients& c) {
  g = g * c.grad_scale;
  decay_weight(p, c.weight_decay);
  m = c.beta1 * m + (1.0f - c.beta1) * g;
  v = c.beta2 * v + (1.0f - c.beta2) * g * g;
  p -= c.lr_t * m / (::sqrtf(v) + c.epsilon);
}

// adam_update_one with g = 0 (a row the step did not touch), without reading g: the same bits, as
// (1 - b1) 0 and (1 - b2) 0 0 are +0, and m and v are never -0 (they start at +0, and an exact cancellation
// rounds to +0).
DDP_HOST_DEVICE void adam_decay_one(float& p, float& m, float& v, const AdamCoefficients& c) {
  decay_weight(p, c.weight_decay);
  m = c.beta1 * m;
  v = c.beta2 * v;
  p -= c.lr_t * m / (::sqrtf(v) + c.epsilon);
}

struct SgdCoefficients {
  float lr;  // the step's learning rate
  float momentum;
  float weight_decay = 0;  // the step's learning rate times train.weight_decay
  float grad_scale = 1;
};

// Keras's SGD with momentum: velocity = momentum velocity - lr g;  p += velocity.
DDP_HOST_DEVICE void sgd_update_one(float& p, float g, float& velocity, const SgdCoefficients& c) {
  g = g * c.grad_scale;
  decay_weight(p, c.weight_decay);
  velocity = c.momentum * velocity - c.lr * g;
  p += velocity;
}

// sgd_update_one with g = 0, without reading g: the same bits (velocity is never -0, as m and v above).
DDP_HOST_DEVICE void sgd_decay_one(float& p, float& velocity, const SgdCoefficients& c) {
  decay_weight(p, c.weight_decay);
  velocity = c.momentum * velocity;
  p += velocity;
}

}  // namespace ddp::optim

// The output layer's element-wise math, shared by the CPU replica (rnn_classifier_cpu.cpp) and the CUDA
// replica's dense kernel (rnn_classifier_cuda.cu): the probability of a logit, its binary cross-entropy
// loss, whether it predicts the label, and the gradient of the batch's mean loss. The loss and probability
// are computed in double on both sides, so that summing them over batches and ranks loses nothing of the
// float model's small losses. (The LSTM's gate nonlinearities run inside cuDNN on the GPU and in
// fast_math.h on the CPU; the self-check compares the two.)
#pragma once

#include <math.h>

#include "engine/base/host_device.h"

namespace ddp::models {

// sigmoid(z) = 1 / (1 + e^-z) without overflow for either sign of z.
DDP_HOST_DEVICE double stable_sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + ::exp(-z));
  const double e = ::exp(z);
  return e / (1.0 + e);
}

// -[y log sigmoid(z) + (1 - y) log(1 - sigmoid(z))] from the logit, stable for large |z|.
DDP_HOST_DEVICE double logistic_loss(double z, double y) {
  return ::fmax(z, 0.0) - z * y + ::log1p(::exp(-::fabs(z)));
}

// The prediction (z >= 0: class 1) matches the label (y >= 0.5: class 1).
DDP_HOST_DEVICE bool predicts_label(double z, double y) {
  return (z >= 0) == (y >= 0.5);
}

// d(mean loss over the batch)/dz = (p - y) / batch, with inv_batch = 1 / batch.
template <typename Scalar>
DDP_HOST_DEVICE Scalar logit_gradient(Scalar probability, Scalar label, Scalar inv_batch) {
  return (probability - label) * inv_batch;
}

// More than two classes: the softmax of `count` logits into `probabilities`, and the categorical
// cross-entropy -log p[label], from the log-sum-exp (stable for large logits). label < 0: no loss (0).
DDP_HOST_DEVICE double softmax_loss(const double* logits, int count, int label, double* probabilities) {
  double top = logits[0];
  for (int k = 1; k < count; ++k) top = ::fmax(top, logits[k]);
  double sum = 0;
  for (int k = 0; k < count; ++k) sum += ::exp(logits[k] - top);
  const double log_sum = top + ::log(sum);
  for (int k = 0; k < count; ++k) probabilities[k] = ::exp(logits[k] - log_sum);
  return label < 0 ? 0.0 : log_sum - logits[label];
}

// The most probable class (the first of equals).
DDP_HOST_DEVICE int predicted_class(const double* logits, int count) {
  int best = 0;
  for (int k = 1; k < count; ++k) {
    if (logits[k] > logits[best]) best = k;
  }
  return best;
}

}  // namespace ddp::models

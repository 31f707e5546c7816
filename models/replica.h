// One model replica: the classifier Embedding -> LSTM (L layers) -> Dense(1) -> sigmoid, trained with binary
// cross-entropy. Parameters and gradients live in two flat buffers in the canonical layout (param_layout.h).
// A replica owns no threads; the CPU one uses the BLAS's threads for its matrix products.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "models/param_layout.h"

namespace ddp::models {

// A batch in host memory: tokens row-major [batch, seq] (0 is padding, sequences are left-padded as Keras
// pads them), labels [batch] of 0 or 1.
struct BatchView {
  const int32_t* tokens = nullptr;
  const float* labels = nullptr;
  int batch = 0;
  int seq = 0;
};

// Sums over the batch, so that shards and ranks can be added up before dividing.
struct BatchStats {
  double loss_sum = 0;  // sum of per-sample binary cross-entropy
  int64_t correct = 0;  // predictions (p >= 0.5) equal to the label
  int64_t count = 0;

  BatchStats& operator+=(const BatchStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
    return *this;
  }
};

// Called during backward as each ParamSegment's gradient is final (dense first, embedding last), so that its
// reduction can start while the rest of backward runs.
using GradientReadyFn = std::function<void(const ParamSegment&)>;

class Replica {
 public:
  virtual ~Replica() = default;

  virtual const ParamLayout& layout() const = 0;
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;

  // Forward and backward on one batch: grads() becomes d(mean loss over the batch)/d(params).
  virtual BatchStats train_step(const BatchView& batch, const GradientReadyFn& on_ready) = 0;
  // The embedding rows (token ids, sorted, unique) the last train_step touched. Every other row of the
  // embedding gradient is exactly zero, which lets the gradient exchange and the optimizer skip them.
  virtual std::span<const int32_t> touched_embedding_rows() const = 0;
  // Forward only. If probabilities is not empty it receives p(positive) per sample.
  virtual BatchStats evaluate(const BatchView& batch, std::span<float> probabilities = {}) = 0;
};

// The CPU replica (BLAS for every matrix product); parameters are zero until initialized or loaded.
std::unique_ptr<Replica> make_cpu_replica(const ModelShape& shape);

}  // namespace ddp::models

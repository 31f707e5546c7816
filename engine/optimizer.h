// Optimizers over a span of the flat parameter buffer. They know nothing of the model: the data-parallel
// trainer gives them the whole buffer, a parameter server the shard it owns. State is a set of named
// flat buffers so checkpoints can save and restore it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/base/optimizer_state.h"
#include "engine/optimizer_math.h"

namespace ddp::engine {

struct OptimizerSettings {
  std::string name = "adam";  // adam | sgd
  double learning_rate = 0.001;
  double beta1 = 0.9;     // adam
  double beta2 = 0.999;   // adam
  double epsilon = 1e-7;  // adam (Keras's default)
  double momentum = 0.0;  // sgd
  // Lazy row updates (as PyTorch's SparseAdam, TensorFlow's LazyAdam): rows of a sparse matrix (the
  // embedding) that had no gradient this step keep their parameters and moments. Off: Keras's dense update.
  bool lazy_update = false;
};

// A row-major matrix inside the flat buffer of which only some rows had a gradient this step.
struct TouchedRows {
  std::size_t offset = 0;  // of the matrix in the flat buffer
  std::size_t width = 0;
  std::size_t count = 0;          // rows of the matrix
  std::span<const int32_t> rows;  // sorted, unique
};

using ddp::OptimizerState;
using ddp::StateBufferVisitor;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params -= update(grads); both spans have the size given at construction. With settings.lazy_update and
  // `sparse`, the matrix's rows not in sparse->rows are left alone.
  virtual void step(std::span<float> params, std::span<const float> grads,
                    const TouchedRows* sparse = nullptr) = 0;
  virtual OptimizerState state() const = 0;
  // The state's update count, and each of its buffers in turn: in place where the state is in host memory,
  // else copied (a GPU's).
  virtual int64_t iterations() const = 0;
  virtual void visit_state(const StateBufferVisitor& visit) const;
  // Throws UserError if the state's buffers do not match this optimizer (kind or size).
  virtual void load_state(const OptimizerState& state) = 0;
  virtual std::string name() const = 0;
};

// Adam's coefficients for step `iteration` (1 for the first), computed once per step on the host for the
// host loop and the CUDA kernel alike.
AdamCoefficients adam_coefficients(const OptimizerSettings& settings, int64_t iteration);

// The host (CPU) optimizers. Adam as Keras computes it: m, v moments; lr_t = lr * sqrt(1 - beta2^t) / (1 -
// beta1^t); p -= lr_t * m / (sqrt(v) + epsilon). SGD as Keras: v = momentum * v - lr * g; p += v.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerSettings& settings, std::size_t size);

// Throws UserError (naming `source`, e.g. the checkpoint) unless `state` is a state of the optimizer
// `settings` names over `size` parameters: its buffers, by name and size.
void check_optimizer_state(const OptimizerSettings& settings, std::size_t size, const OptimizerState& state,
                           const std::string& source);

// The same updates as one fused CUDA kernel over a flat device buffer on GPU `device`, enqueued on `stream`
// (a cudaStream_t of that device, the replica's); state() and load_state() copy through the host. Lazy rows
// are not supported on the GPU (the embedding's moments decay densely, as Keras does). In a build without
// CUDA it throws a UserError.
std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerSettings& settings, std::size_t size,
                                               int device, void* stream);

}  // namespace ddp::engine

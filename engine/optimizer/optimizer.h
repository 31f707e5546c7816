// Optimizers over a span of the flat parameter buffer. They know nothing of the model: the data-parallel
// trainer gives them the whole buffer, a parameter server the shard it owns. State is a set of named
// flat buffers so checkpoints can save and restore it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/base/gradient_clipping.h"
#include "engine/base/optimizer_state.h"
#include "engine/optimizer/optimizer_math.h"

namespace ddp::optim {

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
  // The learning rate's schedule over the optimizer's updates (learning_rate_at): constant, step (times
  // decay_rate every decay_steps updates) or cosine (from learning_rate to 0 over total_steps), after a
  // linear warm-up over warmup_steps.
  std::string schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // step
  double decay_rate = 0.1;  // step
  int64_t total_steps = 0;  // cosine: the run's updates
  double weight_decay = 0;  // decoupled (AdamW; SGD alike): p -= learning_rate_at(t) * weight_decay * p
  // The averaged gradient's global L2 norm is clipped to this before the update (0: never); the updater
  // that sees the whole averaged gradient computes the norm and hands the optimizer the scale.
  double clip_norm = 0;
};

// The learning rate of update `iteration` (1 for the first): a pure function of the settings and the
// iteration, so a resumed optimizer (whose state holds its iterations) continues the schedule exactly.
double learning_rate_at(const OptimizerSettings& settings, int64_t iteration);

// A row-major matrix inside the flat buffer of which only some rows had a gradient this step.
struct TouchedRows {
  std::size_t offset = 0;  // of the matrix in the flat buffer
  std::size_t width = 0;
  std::size_t count = 0;          // rows of the matrix
  std::span<const int32_t> rows;  // sorted, unique
};

using ddp::GradientPiece;
using ddp::OptimizerState;
using ddp::StateBufferVisitor;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // params -= update(grads); both spans have the size given at construction. With settings.lazy_update and
  // `sparse`, the matrix's rows not in sparse->rows are left alone.
  // `gradient_scale` multiplies every gradient first (clipping by the global norm; 1: none).
  virtual void step(std::span<float> params, std::span<const float> grads,
                    const TouchedRows* sparse = nullptr, float gradient_scale = 1.0f) = 0;
  // step() with the gradients clipped to the global L2 norm `clip_norm` (train.clip_norm): the norm is
  // computed where the gradients are, in gradient_clipping.h's order, so a GPU's step equals a host's.
  // `sparse`: the matrix's untouched rows are zero and skipped.
  virtual void step_clipped(std::span<float> params, std::span<const float> grads, const TouchedRows* sparse,
                            double clip_norm);
  // step() with a gradient that is zero outside `pieces` (sorted, not overlapping, inside params): the same
  // bits as the dense gradient, without one. Every element outside the pieces takes the zero-gradient update
  // (lazy updates do not apply). Host optimizers only: others throw std::logic_error.
  virtual void step_pieces(std::span<float> params, std::span<const GradientPiece> pieces,
                           float gradient_scale = 1.0f);
  // step_clipped() in two parts, for a step replayed from a CUDA graph (engine/step_graph.h): prepare_step()
  // counts the update and puts its coefficients (learning rate, bias correction) where the device reads
  // them; enqueue_step() enqueues the update (after the norm, where clip_norm > 0) reading them there, so
  // that the same enqueued work serves every step. Dense gradients only. Only optimizers whose
  // splits_steps() is true (the GPU's) have them; the others throw std::logic_error.
  virtual bool splits_steps() const { return false; }
  virtual void prepare_step();
  virtual void enqueue_step(std::span<float> params, std::span<const float> grads, double clip_norm);
  virtual OptimizerState state() const = 0;
  // The state's update count, and each of its buffers in turn: in place where the state is in host memory,
  // else copied (a GPU's).
  virtual int64_t iterations() const = 0;
  virtual void visit_state(const StateBufferVisitor& visit) const;
  // Throws UserError if the state's buffers do not match this optimizer (kind or size).
  virtual void load_state(const OptimizerState& state) = 0;
  virtual std::string name() const = 0;
};

// The squared L2 norm of host gradients, in gradient_clipping.h's order; with `sparse`, the matrix's
// untouched rows are zero and skipped.
double squared_norm(std::span<const float> grads, const TouchedRows* sparse);

// The coefficients of update `iteration` (1 for the first), computed once per step on the host for the host
// loop and the CUDA kernel alike.
AdamCoefficients adam_coefficients(const OptimizerSettings& settings, int64_t iteration,
                                   float gradient_scale = 1.0f);
SgdCoefficients sgd_coefficients(const OptimizerSettings& settings, int64_t iteration,
                                 float gradient_scale = 1.0f);

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

}  // namespace ddp::optim

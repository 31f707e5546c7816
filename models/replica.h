// One model replica: the classifier Embedding -> LSTM or GRU (L layers, one or two directions) -> Dense
// -> sigmoid (two classes, binary cross-entropy) or softmax (more, categorical cross-entropy). Parameters and
// gradients live in two flat buffers in the canonical layout (param_layout.h). A replica owns no threads; the
// CPU one uses the BLAS's threads for its matrix products.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/base/batch_view.h"
#include "models/loss_scale.h"
#include "models/param_layout.h"
#include "models/precision.h"

namespace ddp::models {

// A batch in the replica's memory (host for the CPU replica, device for a GPU one): tokens row-major
// [batch, seq] (0 is padding, sequences are left-padded as Keras pads them), labels [batch] of 0 or 1.
// Sums over the batch, so that shards and ranks can be added up before dividing.
struct BatchStats {
  double loss_sum = 0;  // sum of per-sample cross-entropy (binary, or categorical for more classes)
  int64_t correct = 0;  // predictions (p >= 0.5, or the most probable class) equal to the label
  int64_t count = 0;
  // Evaluation only: classes x classes counts, row the true class, column the predicted one; empty where the
  // replica does not count them (a GPU replica).
  std::vector<int64_t> confusion;

  BatchStats& operator+=(const BatchStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
    if (!o.confusion.empty()) {
      if (confusion.empty()) confusion.assign(o.confusion.size(), 0);
      for (std::size_t i = 0; i < o.confusion.size() && i < confusion.size(); ++i)
        confusion[i] += o.confusion[i];
    }
    return *this;
  }
};

// What a model does beside its parameters: masking and dropout. Not part of the layout, so a checkpoint
// loads whatever they are.
struct ModelOptions {
  // Leading padding tokens (0) leave the state unchanged in every direction: a sample's first real token
  // starts the forward direction, and the reverse direction ends on it.
  bool mask_padding = false;
  double dropout = 0;            // on each stacked layer's output but the top one's; training steps only
  double embedding_dropout = 0;  // on the embedding's output; training steps only
  Precision precision = Precision::kFp32;  // a GPU replica's recurrent arithmetic; CPU replicas: float32
};

// Called during backward as each ParamSegment's gradient is final, once per segment, so that its reduction
// can start while the rest of backward runs. The order is the replica's: the GPU's hands over the dense
// layer, the embedding (right after cuDNN's data backward), then every layer at once; the CPU's the dense
// layer and the layers from the top, with the embedding before the first layer's weights. Collectives pair up
// by order, so AllReduceStep starts the reductions in one order on every rank (ParamLayout::reduction_order).
using GradientReadyFn = std::function<void(const ParamSegment&)>;

enum class DeviceKind { kCpu, kCuda };

// A batch held a token id outside the model's vocabulary, or a label outside its classes: bad data, which
// the trainer reports naming the file. A CPU replica throws it from the step; a GPU replica (tokens) at the
// next host synchronisation.
class BatchValueOutOfRange : public std::out_of_range {
 public:
  using std::out_of_range::out_of_range;
};

class Replica {
 public:
  virtual ~Replica() = default;

  virtual const ParamLayout& layout() const = 0;
  // Where params(), grads() and the batches handed to the replica live.
  virtual DeviceKind device() const = 0;
  // The CUDA stream (a cudaStream_t) the replica computes on; nullptr for the CPU replica. Communicators and
  // optimizers of the same device order their work after it.
  virtual void* stream() const { return nullptr; }
  // What runs the recurrent layers where the device leaves a choice (the GPU's cuDNN algorithm), for the
  // start log; "" when there is nothing to say.
  virtual std::string recurrent_kernels() const { return ""; }
  // The flat buffers in the replica's own memory, for a communicator and an optimizer of the same device.
  virtual std::span<float> params() = 0;
  virtual std::span<float> grads() = 0;
  // Host copies of the parameters in the canonical layout: initialization, broadcast, checkpoints.
  virtual void copy_params_to_host(std::span<float> host) = 0;
  virtual void copy_params_from_host(std::span<const float> host) = 0;
  // A host copy of the last train_step's gradients (for a parameter server's worker on a GPU).
  virtual void copy_grads_to_host(std::span<float> host) = 0;

  // The dropout masks of the next train_steps derive from `key` alone (with a counter it resets), so that
  // a resumed run draws the masks of the uninterrupted one. The trainer sets it before each step.
  virtual void set_dropout_key(uint64_t /*key*/) {}
  // Random state that the keys do not determine, for checkpoints: cuDNN's dropout between stacked layers
  // draws from one generator state, seeded once and then running on across steps. Opaque bytes, empty where
  // there is none (the CPU replica's masks are a function of the key). restore_rng_state takes the bytes of
  // a replica of the same kind, device model and library version, after the run's batch shapes are settled
  // (trying one draws from the state) and before the first set_dropout_key, and says whether it did; given
  // any other bytes it returns false and the state stays as seeded from the keys.
  virtual std::string rng_state() { return {}; }
  virtual bool restore_rng_state(const std::string& /*saved*/) { return false; }
  // Forward and backward on one batch: grads() becomes d(mean loss over the batch)/d(params). The batch's
  // loss and accuracy are added to the running stats.
  virtual void train_step(const BatchView& batch, const GradientReadyFn& on_ready) = 0;
  // A training step captured once into a CUDA graph and replayed (engine/step_graph.h). Why this replica's
  // steps cannot be, or "" where they can; then train_step splits in two. begin_step() does what every step
  // needs of the host (its counts, the embedding dropout's stream stored on the device, the batch copied
  // into the replica's own buffers, whose view it returns); enqueue_step() enqueues the step's device work on
  // that view, reading everything that changes between steps from device memory, so that the same enqueued
  // work serves every step of the shape. memory_generation() changes whenever the replica reallocates memory
  // that enqueued work points at (a larger batch shape): graphs captured before are stale. A replica that
  // refuses throws std::logic_error from the two.
  virtual std::string step_graph_refusal() const { return "the replica runs on the CPU"; }
  virtual BatchView begin_step(const BatchView& /*batch*/) {
    throw std::logic_error("Replica::begin_step: " + step_graph_refusal());
  }
  virtual void enqueue_step(const BatchView& /*staged*/, const GradientReadyFn& /*on_ready*/) {
    throw std::logic_error("Replica::enqueue_step: " + step_graph_refusal());
  }
  virtual uint64_t memory_generation() const { return 0; }
  // Forward only; adds to the running stats.
  virtual void evaluate(const BatchView& batch) = 0;
  // Forward only, no dropout: into `probabilities` (host memory, batch x layout().shape().outputs()
  // entries) p(positive) of each sample for two classes, else each class's probability, sample by sample.
  // A batch with labels also adds to the running stats, as evaluate does.
  virtual void predict(const BatchView& batch, std::span<float> probabilities) = 0;
  // The stats added since the last call, which resets them. On a GPU this is the only host synchronisation:
  // call it per epoch or per logging interval, not per step.
  virtual BatchStats take_stats() = 0;

  // model.precision = fp16 (scales_loss): the replica multiplies the loss gradient by a power of two in its
  // half-precision backward and divides it out of grads() (models/loss_scale.h). After each exchange the
  // trainer asks whether grads() (then the average) is finite on every rank alike, skips the update where it
  // is not, and tells the replica, whose scale backs off or grows. gradients_finite() reads grads(): on a
  // GPU it waits for the stream, a host synchronisation per step, as PyTorch's GradScaler makes.
  virtual bool gradients_finite();
  virtual void after_update(bool /*applied*/) {}
  // The scale now, its clean steps and the steps skipped so far; none where the replica does not scale. A
  // checkpoint keeps it, and restore_loss_scale gives a resumed replica back what it held (ignored where the
  // replica does not scale).
  virtual std::optional<LossScale::State> loss_scaling() const { return std::nullopt; }
  virtual void restore_loss_scale(const LossScale::State& /*state*/) {}

  // Batch shapes before the first batch, so that the kernels a device turns down show at start-up and every
  // rank runs the same ones. try_shape prepares (batch, seq) and says whether the replica's preferred kernels
  // take it (a GPU replica tries its persistent cuDNN algorithm on scratch data; false: it would fall back);
  // it throws UserError where there is no fallback (an algorithm asked for by name). settle_shape then fixes
  // the shape's kernels: the preferred ones only if `preferred` (every rank's try_shape said yes). A shape
  // met without these calls is tried on its first batch, on this rank alone. The CPU replica has one kind.
  virtual bool try_shape(int /*batch*/, int /*seq*/) { return true; }
  virtual void settle_shape(int /*batch*/, int /*seq*/, bool /*preferred*/) {}

  // The parameters must reach the device's kernels exactly as the canonical layout holds them: copies them
  // into every layout the device uses (cuDNN's weight spaces) and back, and returns "" if every float came
  // back bit for bit and nothing else was written, else where the first one differs. Leaves the parameters
  // as they were. Nothing to check where the kernels read the canonical buffer itself (the CPU replica).
  virtual std::string check_parameter_mapping() { return ""; }

  // Sparse embedding gradients (CPU replica): the embedding rows (token ids, sorted, unique) the last
  // train_step touched; every other row of the embedding gradient is exactly zero, so the exchange and the
  // optimizer can skip them. A replica that does not track rows returns an empty span.
  virtual std::span<const int32_t> touched_embedding_rows() const = 0;
  // The gradient exchange wrote other ranks' values into these rows (or into every row) of the embedding
  // gradient; the replica clears them so its next step starts from zero there.
  virtual void clear_embedding_gradient_rows(std::span<const int32_t> rows) = 0;
  virtual void clear_embedding_gradient() = 0;
};

// The CPU replica's recurrent kernels (model.cpu_kernels): its own cells over the BLAS, oneDNN's RNN
// primitives (onednn_lstm.h), its own cells over oneDNN's sgemm (the weight gradients over the BLAS), or its
// own cells with each time step's recurrent product on packed register tiles (packed_gemm.h) and the
// products over the whole sequence on oneDNN's sgemm (the BLAS in a build without oneDNN).
enum class CpuKernels { kBuiltin, kOnednn, kOnednnGemm, kPacked };
// builtin, onednn, onednn_gemm, packed, or auto (fastest_cpu_kernels for this build, this CPU and the rank's
// `threads` compute threads; each kind runs every variant). Throws UserError naming the key for another
// name, for a oneDNN kind in a build without it, or for packed on a CPU without AVX2 and FMA. The shape and
// options are for variants a kind may one day not run.
CpuKernels parse_cpu_kernels(const std::string& name, const ModelShape& shape = {},
                             const ModelOptions& options = {}, int threads = 1);

// What auto's rule looks at.
struct KernelFacts {
  bool have_onednn = false;  // the build has oneDNN
  bool avx512 = false;       // oneDNN runs its AVX-512 kernels (in a build without it: the CPU has AVX-512)
  bool have_packed = false;  // the packed tiles run here (x86-64, AVX2 and FMA)
  // The core's 512-bit FMAs outpace its 256-bit ones (two 512-bit units; avx512_fma_outpaces_avx2).
  bool wide_fma_units = false;
  int threads = 1;  // compute threads per rank
};
// auto's rule, measured (benchmarks/RESULTS.md, "Our own tiles" and "AVX-512 tiles"): our cells with the
// packed tiles for each time step's products and oneDNN's sgemm for the rest wherever both run, except on
// cores with two 512-bit FMA units when a rank has one thread, where oneDNN's LSTM primitive is ahead (the
// tiles gain most when each thread has fewer rows of the batch). Without the tiles: oneDNN's primitives on
// AVX-512, our cells over its sgemm on AVX2. Without oneDNN: the tiles over the BLAS on AVX2, and on
// AVX-512 the builtin cells over the BLAS's own AVX-512 kernels.
CpuKernels fastest_cpu_kernels(const KernelFacts& facts);

// The CPU replica (BLAS for every matrix product, or oneDNN for the recurrent layers'); parameters are zero
// until initialized or loaded.
std::unique_ptr<Replica> make_cpu_replica(const ModelShape& shape, CpuKernels kernels = CpuKernels::kBuiltin,
                                          const ModelOptions& options = {});

}  // namespace ddp::models

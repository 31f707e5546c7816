// The cuDNN replica of cuda_replica.h, shared by the files that implement it: rnn_classifier_cuda.cu (its
// construction, the step, host copies, the dropout state), cudnn_rnn_plan.cu (an algorithm's descriptor,
// weight spaces and the weight map to and from the canonical layout) and cudnn_batch_shapes.cu (the
// descriptors of each batch shape, and the probe that tries a shape before the run uses it). Not an
// interface: the rest of ddptrain sees the replica through cuda_replica.h alone.
//
// The replica: CUDA kernels for the embedding, the dense layer and sigmoid + BCE (or softmax) around cuDNN's
// LSTM or GRU (cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8).
//
// Weights. cuDNN keeps the LSTM weights in a weight space whose layout it owns (only cudnnGetRNNWeightParams
// says where each gate's block is; it may put all matrices before all biases, pad or align), while the
// canonical layout (param_layout.h) has per layer w_ih, w_hh, b_ih, b_hh between the embedding and the dense
// layer. So the replica does not point cuDNN at the canonical buffer: it keeps a cuDNN weight space and a
// weight-gradient space of its own, and a table, built once from cudnnGetRNNWeightParams, of (canonical
// offset, cuDNN offset, count) for every gate matrix and bias, checked for shape and row-major order. Each
// forward gathers the parameters into the weight space with one kernel; each backward scatters the weight
// gradients into the canonical gradients with the same kernel. The copies cost two passes over the LSTM
// weights per step, small next to the recurrence, and keep the flat buffers exactly canonical whatever
// cuDNN's layout, alignment or padding.
//
// Determinism. The embedding gradient adds the rows of repeated tokens with float atomicAdd, so its last
// bits depend on the order the GPU happens to run them; everything else the replica computes itself is in a
// fixed order. cuDNN's own kernels may not be bitwise reproducible either.
//
// Algorithm. cuDNN runs the LSTM with its standard algorithm (kernels per time step) or a persistent one
// (the recurrent weights stay on chip across steps; PyTorch picks PERSIST_STATIC_SMALL_H for hidden <= 128).
// Each algorithm gets a plan of its own (descriptor, weight spaces, weight map: the layouts may differ), and
// each batch shape runs on one plan. Which shapes a persistent algorithm takes is cuDNN's to say, so a new
// shape is tried once on scratch buffers (forward in both modes, both backwards) before it is used: under
// model.cudnn_rnn_algo = auto a refusal puts that shape alone on the standard plan, and a named algorithm
// that is refused is a UserError. The trainer tries every shape of the run at start-up on every rank
// (try_shape) and settles each on the same plan everywhere (settle_shape).
//
// Directions and masking. A bidirectional or masked model feeds the dense layer from cuDNN's final states hy
// (gather_final_states: the top layer's directions side by side) and takes its gradient back through dhy,
// with dy zero. Masked, each sequence starts at time 0 in x (the embedding kernel shifts it by its padding)
// and cuDNN gets its real length, in the data descriptors (from the batch's host tokens) and on the device
// (computed there by the same rule, sequence_mask.h): the forward direction ends at the last real token and
// the reverse one starts there, as the CPU replica's masking does. Per-sample lengths run on the standard
// algorithm only.
//
// Dropout, in training only. On the embedding's output: the CPU replica's masks (dropout.h), so the two
// replicas drop the same elements under the same key. Between stacked layers: cuDNN's, from its dropout
// descriptor, whose RNG state is seeded from the first step's key (the run's start) and runs on across
// steps; its masks are not the CPU's. Checkpoints keep that state (rng_state: the raw bytes, tagged with the
// cuDNN version, the GPU model and the state's size, which is all its layout depends on), so a run resumed on
// the same kind of GPU draws the masks the uninterrupted one would have; elsewhere it seeds afresh from the
// resume step's key.
//
// Synchronisation. A train_step only enqueues work on the replica's stream; the host waits in take_stats(),
// predict(), the host copies of the parameters, and the first time a batch shape is seen (descriptors and
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/cuda_check.h"
#include "engine/base/cuda_handles.h"
#include "engine/base/errors.h"
#include "engine/base/gpu_spans.h"
#include "engine/base/timeline.h"
#include "models/classifier_kernels.cuh"
#include "models/cuda_replica.h"
#include "models/cudnn_status.h"
#include "models/dropout.h"
#include "models/loss_scale.h"
#include "models/sequence_mask.h"
#include "models/weight_map.h"

#define DDP_CUDNN_CHECK(call)                                                               \
  do {                                                                                      \
    const cudnnStatus_t ddp_cudnn_status_ = (call);                                         \
    if (ddp_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                        \
      DDP_FATAL(std::string(#call) + " failed: " + cudnnGetErrorString(ddp_cudnn_status_)); \
    }                                                                                       \
  } while (0)

namespace ddp::models::cudnn_replica {

using kernels::copy_weight_runs;
using kernels::dense_backward;
using kernels::dense_forward;
using kernels::dense_softmax_backward;
using kernels::dense_softmax_forward;
using kernels::DeviceStats;
using kernels::embedding_backward;
using kernels::embedding_dropout;
using kernels::embedding_forward;
using kernels::fill_int32;
using kernels::flag_nonfinite;
using kernels::from_sixteen;
using kernels::gather_final_states;
using kernels::gather_weight_runs_16;
using kernels::kDenseThreads;
using kernels::kThreads;
using kernels::scatter_final_states;
using kernels::scatter_weight_runs_16;
using kernels::sequence_starts;
using kernels::SixteenBits;
using kernels::store_uint64;
using kernels::to_sixteen;

// A persistent algorithm that cuDNN refused (a bad-parameter or not-supported status) for a call whose
// support depends on the algorithm; the replica catches it and falls back or reports.
struct AlgorithmRefused {
  std::string what;
};

// In descriptor setup and the shape probe: what classify_cudnn_failure (cudnn_status.h) calls a refusal
// throws AlgorithmRefused, a launch or execution failure too provided the device is healthy afterwards (no
// sticky error); everything else is fatal as in DDP_CUDNN_CHECK.
void check_algorithm_status(cudnnStatus_t status, cudnnRNNAlgo_t algorithm, const char* call,
                            const char* file, int line);

#define DDP_CUDNN_CHECK_ALGORITHM(call, algorithm) \
  check_algorithm_status((call), (algorithm), #call, __FILE__, __LINE__)

cudnnRNNAlgo_t to_cudnn(RnnAlgorithm algorithm);
// "standard (CUDNN_RNN_ALGO_STANDARD)", ...: for the start log and messages.
const char* cudnn_algorithm_name(cudnnRNNAlgo_t algorithm);

using StreamHandle = cuda::Stream;
using CudnnHandle = cuda::Owned<cudnnHandle_t, cudnnDestroy, cudnnGetErrorString>;
using DropoutDescriptor =
    cuda::Owned<cudnnDropoutDescriptor_t, cudnnDestroyDropoutDescriptor, cudnnGetErrorString>;
using RnnDescriptor = cuda::Owned<cudnnRNNDescriptor_t, cudnnDestroyRNNDescriptor, cudnnGetErrorString>;
using RnnDataDescriptor =
    cuda::Owned<cudnnRNNDataDescriptor_t, cudnnDestroyRNNDataDescriptor, cudnnGetErrorString>;
using TensorDescriptor =
    cuda::Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor, cudnnGetErrorString>;
using cuda::DeviceArray;
using cuda::PinnedValue;

inline std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

// One cuDNN algorithm's view of the LSTM: its RNN descriptor, a weight space and a weight-gradient space laid
// out as it wants them, and the table mapping them to and from the canonical layout. The replica keeps one
// plan for the standard algorithm and, where it prefers a persistent one, one for that; each batch shape runs
// on one of them.
struct RnnPlan {
  cudnnRNNAlgo_t algorithm = CUDNN_RNN_ALGO_STANDARD;
  DropoutDescriptor dropout;
  RnnDescriptor rnn;
  std::size_t weight_space_bytes = 0;
  DeviceArray<std::byte> weight_space;  // of the replica's data type (float, or 16-bit)
  DeviceArray<std::byte> weight_grads;
  DeviceArray<WeightRun> weight_runs;
  unsigned int weight_run_count = 0;
  std::size_t longest_weight_run = 0;
};

// cuDNN's descriptors and sequence lengths for one (batch, seq), built the first time the shape is seen, and
// the plan that runs it.
struct BatchShape {
  RnnPlan* plan = nullptr;
  RnnDataDescriptor x;               // [T, B, E] time-major; masked, each batch's lengths are set before use
  RnnDataDescriptor y;               // [T, B, D*H]
  TensorDescriptor state;            // h and c: [L*D, B, H]; h0 = c0 = 0 (null pointers)
  DeviceArray<int32_t> seq_lengths;  // [B], on the device: cuDNN reads it asynchronously
  std::size_t train_workspace = 0;
  std::size_t reserve = 0;
  std::size_t inference_workspace = 0;
};

class CudaReplica final : public Replica {
 public:
  CudaReplica(const ModelShape& shape, int device, RnnAlgorithm algorithm, const ModelOptions& options);
  ~CudaReplica() override;
  CudaReplica(const CudaReplica&) = delete;
  CudaReplica& operator=(const CudaReplica&) = delete;

  const ParamLayout& layout() const override { return layout_; }
  DeviceKind device() const override { return DeviceKind::kCuda; }
  void* stream() const override { return stream_.get(); }
  std::string recurrent_kernels() const override;
  std::span<float> params() override { return {params_.get(), layout_.total_size()}; }
  std::span<float> grads() override { return {grads_.get(), layout_.total_size()}; }
  void copy_params_to_host(std::span<float> host) override;
  void copy_params_from_host(std::span<const float> host) override;
  void copy_grads_to_host(std::span<float> host) override;

  void train_step(const BatchView& batch, const GradientReadyFn& on_ready) override;
  std::string step_graph_refusal() const override;
  BatchView begin_step(const BatchView& batch) override;
  void enqueue_step(const BatchView& staged, const GradientReadyFn& on_ready) override;
  uint64_t memory_generation() const override { return memory_generation_; }
  void evaluate(const BatchView& batch) override;
  void predict(const BatchView& batch, std::span<float> probabilities) override;
  BatchStats take_stats() override;
  bool gradients_finite() override;
  void after_update(bool applied) override;
  std::optional<LossScale::State> loss_scaling() const override {
    if (!half_) return std::nullopt;
    return loss_scale_.state();
  }
  void restore_loss_scale(const LossScale::State& state) override {
    if (half_) loss_scale_.restore(state);
  }

  bool try_shape(int batch, int seq) override;
  void settle_shape(int batch, int seq, bool preferred) override;
  std::string check_parameter_mapping() override;

  // The GPU exchanges the embedding gradient densely: no rows are tracked.
  std::span<const int32_t> touched_embedding_rows() const override { return {}; }
  // No-ops: every train_step zeroes the whole embedding gradient before it adds this batch's rows, so rows
  // that the exchange wrote never leak into the next step.
  void clear_embedding_gradient_rows(std::span<const int32_t>) override {}
  void clear_embedding_gradient() override {}

  // The embedding dropout's masks follow the CPU replica's under the same key; cuDNN's inter-layer dropout
  // state is seeded from the first key this replica gets (the run's start, or a resume whose checkpoint's
  // state it could not restore) and then runs on.
  void set_dropout_key(uint64_t key) override;
  std::string rng_state() override;
  bool restore_rng_state(const std::string& saved) override;

 private:
  void select_device() const { DDP_CUDA_CHECK(cudaSetDevice(device_)); }
  // What a saved dropout state must have been made under to be restored here; it heads rng_state's bytes.
  std::string dropout_state_tag(std::size_t state_bytes) const;
  // Points every plan's dropout descriptor at dropout_states_: the first initialises the state from `seed`
  // (a kernel on the handle's stream), unless `initialise` is false; the others restore it as it is.
  void attach_dropout_state(bool initialise, uint64_t seed);
  // The RNN descriptor, weight spaces and weight map for `algorithm`; AlgorithmRefused if cuDNN turns a
  // persistent one down.
  std::unique_ptr<RnnPlan> make_plan(cudnnRNNAlgo_t algorithm);
  void build_rnn(RnnPlan& plan);
  void build_weight_map(RnnPlan& plan);
  // A weight space the map cannot take: AlgorithmRefused under a persistent algorithm, else fatal.
  [[noreturn]] static void weight_map_failed(const RnnPlan& plan, const std::string& what);
  // After cuDNN refused the preferred algorithm (for the model, or for the batches `where`): a UserError if
  // it was asked for by name; under auto a note, and the standard algorithm runs instead.
  void refuse_preferred(const AlgorithmRefused& refused, const std::string& where);
  // Runs every cuDNN call a step makes once on this shape's scratch buffers, so that a refusal shows here.
  void probe(const BatchShape& shape);
  std::unique_ptr<BatchShape> build_shape(int batch, int seq, RnnPlan& plan);
  // A shape seen for the first time: on the preferred plan if cuDNN takes it, else on the standard one.
  const BatchShape& add_shape(int batch, int seq);
  // The descriptors for this batch shape, with every scratch buffer large enough for it.
  const BatchShape& shape_for(int batch, int seq);
  // Masked: this batch's sequence lengths into the shape's descriptors (host) and seq_lengths and starts_
  // (device, on the stream), and scratch space for them. Unmasked, every length is T, as the shape was built.
  void set_sequence_lengths(const BatchView& batch, const BatchShape& shape);
  void check_batch(const BatchView& batch, bool need_labels, const char* what) const;
  // A training step's host part (its count, dy's zeros for the shape, the embedding dropout's draw stored
  // on the device), and its device work, which reads nothing of the host that changes between steps.
  void begin_training(const BatchView& batch);
  void enqueue_training(const BatchView& batch, const GradientReadyFn& on_ready);
  // Parameters into cuDNN's weight space, the embedding lookup and cuDNN's forward.
  void forward(const BatchView& batch, const BatchShape& shape, bool training);
  // The dense layer's input, [B, D*H]: the top layer's output at the last step, or its final states.
  const float* dense_input(const BatchView& batch) const;
  // The dense layer, sigmoid and loss on the forward's last hidden states.
  void dense_and_loss(const BatchView& batch, const float* labels, float* probabilities, float* d_logits,
                      bool add_stats);
  // The LSTM's parameters from the canonical buffer into a weight space of the plan's (of the data type),
  // and weight gradients from such a space into the canonical gradients, on the stream.
  void gather_weights(const RnnPlan& plan, const float* canonical, void* space, const char* what);
  // `scale` multiplies the gradients on the way (fp16: 1 / loss scale).
  void scatter_weights(const RnnPlan& plan, const void* space, float* canonical, float scale,
                       const char* what);
  // What cuDNN reads and writes, of the data type: the float buffers below, or their 16-bit twins
  // (model.precision = bf16), which the replica converts to and from around cuDNN's calls.
  struct CudnnIo {
    void* x;
    void* dx;
    void* y;
    void* dy;
    void* hy;
    void* dhy;
  };
  CudnnIo cudnn_io();
  // n floats times `scale` into 16-bit `to`, or back, on the stream (bf16 and fp16 only).
  void to_sixteen_bit(const float* from, SixteenBits* to, std::size_t n, float scale, const char* what);
  void from_sixteen_bit(const SixteenBits* from, float* to, std::size_t n, float scale, const char* what);
  unsigned int blocks_for(std::size_t n) const;
  std::size_t h_size() const { return to_size(layout_.shape().hidden); }
  // Elements of h or c (and hy, dhy) for a batch: [L*D, B, H].
  std::size_t states_count(int batch) const {
    const ModelShape& shape = layout_.shape();
    return to_size(shape.layers) * to_size(shape.directions()) * to_size(batch) * h_size();
  }
  // Throws TokenOutsideVocabulary if a batch since the last check held a token outside the vocabulary (the
  // flag was copied to the host by the caller, which synchronised the stream); clears the flag.
  void report_bad_token();

  ParamLayout layout_;
  int device_ = 0;
  RnnAlgorithm requested_ = RnnAlgorithm::kAuto;
  bool masked_ = false;
  Precision precision_ = Precision::kFp32;  // model.precision: the math type of every plan's descriptor
  bool sixteen_bit_ = false;                // bf16, fp16: cuDNN's data and weights are 16-bit
  bool half_ = false;                       // fp16: IEEE half (else bfloat16), with loss scaling
  cudnnDataType_t data_type_ = CUDNN_DATA_FLOAT;
  std::size_t element_bytes_ = sizeof(float);
  double dropout_ = 0;            // between stacked layers, by cuDNN (training only)
  double embedding_dropout_ = 0;  // on the embedding's output, by embedding_dropout (training only)
  uint64_t dropout_key_ = 0;
  uint64_t dropout_draws_ = 0;
  // [1]: the step's embedding dropout draw (begin_training's), read by the forward's and backward's
  // kernels on the device.
  DeviceArray<uint64_t> embedding_dropout_stream_;
  bool dropout_seeded_ = false;
  // The dense layer reads hy (bidirectional or masked) instead of the last step of y.
  bool from_final_states_ = false;
  // What model.cudnn_rnn_algo (or auto, for this model and GPU) asks for.
  cudnnRNNAlgo_t preferred_algorithm_ = CUDNN_RNN_ALGO_STANDARD;
  int max_blocks_ = 0;
  std::size_t embedding_offset_ = 0;
  std::size_t dense_w_offset_ = 0;
  std::size_t dense_b_offset_ = 0;

  // Declared first, destroyed last: the descriptors and buffers below go before the handle and stream.
  StreamHandle stream_;
  std::optional<timeline::GpuSpans> gpu_spans_;  // made with the stream
  CudnnHandle cudnn_;
  std::unique_ptr<RnnPlan> standard_;
  // Null when the preferred algorithm is the standard one, or when cuDNN turned it down for the model under
  // auto (preferred_refused_ then says so).
  std::unique_ptr<RnnPlan> preferred_;
  bool preferred_refused_ = false;

  DeviceArray<float> params_;
  DeviceArray<float> grads_;
  // cuDNN's dropout RNG state, one for every plan's descriptor (the first initialises it, the others
  // restore it).
  DeviceArray<std::byte> dropout_states_;
  bool dropout_states_initialized_ = false;

  // By (batch, seq).
  std::map<std::pair<int, int>, std::unique_ptr<BatchShape>> shapes_;
  DeviceArray<float> x_;               // [T, B, E]
  DeviceArray<float> dx_;              // [T, B, E]
  DeviceArray<float> y_;               // [T, B, D*H]
  DeviceArray<float> dy_;              // [T, B, D*H]: zero but (reading y's last step) its block
  DeviceArray<float> hy_;              // [L*D, B, H]: final states, when the dense layer reads them
  DeviceArray<float> dhy_;             // [L*D, B, H]: zero but the top layer's
  DeviceArray<float> final_states_;    // [B, D*H]: the dense layer's input gathered from hy_
  DeviceArray<float> d_final_states_;  // [B, D*H]
  DeviceArray<int32_t> starts_;        // [B]: masked, each row's first real step
  // bf16, fp16: what cuDNN reads and writes in place of x_, dx_, y_, dy_, hy_ and dhy_. The dense layer then
  // reads final_states_ (the last step of y, or the final states, converted) and writes d_final_states_.
  DeviceArray<SixteenBits> x16_;
  DeviceArray<SixteenBits> dx16_;
  DeviceArray<SixteenBits> y16_;
  DeviceArray<SixteenBits> dy16_;
  DeviceArray<SixteenBits> hy16_;
  DeviceArray<SixteenBits> dhy16_;
  std::vector<int> host_lengths_;  // [B]: masked, this batch's lengths for the descriptors
  // begin_step's copies of the batch, at addresses that stay while the shapes do, for a captured step.
  DeviceArray<int32_t> staged_tokens_;  // [B, T]
  DeviceArray<float> staged_labels_;    // [B]
  // Counts the reallocations of buffers that a step's enqueued work points at (memory_generation()).
  uint64_t memory_generation_ = 0;
  // What cuDNN writes into y past a masked sequence's end (CUDNN_RNN_PADDED_IO_ENABLED); its API takes a
  // non-const pointer.
  float padding_fill_ = 0.0f;
  std::pair<int, int> dy_shape_{0, 0};  // the (batch, seq) whose zeros dy_ holds
  DeviceArray<std::byte> workspace_;
  DeviceArray<std::byte> reserve_;
  DeviceArray<float> probabilities_;  // [B x outputs]
  DeviceArray<float> d_logits_;       // [B x outputs]

  DeviceArray<DeviceStats> stats_;
  DeviceArray<unsigned int> bad_token_;
  PinnedValue<DeviceStats> host_stats_;
  PinnedValue<unsigned int> host_bad_token_;
  // fp16: the loss scale (host: the trainer's verdict on each step comes before the next step's kernels),
  // and the flag of a gradient that is not finite.
  LossScale loss_scale_;
  DeviceArray<unsigned int> nonfinite_;
  PinnedValue<unsigned int> host_nonfinite_;
  int64_t count_ = 0;  // samples since the last take_stats(): known on the host
};

}  // namespace ddp::models::cudnn_replica

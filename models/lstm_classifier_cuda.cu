// The classifier on a GPU (cuda_replica.h): CUDA kernels for the embedding, the dense layer and sigmoid +
// BCE around cuDNN's LSTM (cudnnRNNForward, cudnnRNNBackwardData_v8, cudnnRNNBackwardWeights_v8).
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
// scratch buffers are then built and grown, and the stream is drained before an old buffer is freed).
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
#include "models/cuda_replica.h"
#include "models/cudnn_status.h"
#include "models/dropout.h"
#include "models/lstm_kernels.cuh"
#include "models/sequence_mask.h"
#include "models/weight_map.h"

#define DDP_CUDNN_CHECK(call)                                                               \
  do {                                                                                      \
    const cudnnStatus_t ddp_cudnn_status_ = (call);                                         \
    if (ddp_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                        \
      DDP_FATAL(std::string(#call) + " failed: " + cudnnGetErrorString(ddp_cudnn_status_)); \
    }                                                                                       \
  } while (0)

namespace ddp::models {
namespace {

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
using kernels::gather_final_states;
using kernels::kDenseThreads;
using kernels::kThreads;
using kernels::scatter_final_states;
using kernels::sequence_starts;

// A persistent algorithm that cuDNN refused (a bad-parameter or not-supported status) for a call whose
// support depends on the algorithm; the replica catches it and falls back or reports.
struct AlgorithmRefused {
  std::string what;
};

// In descriptor setup and the shape probe: what classify_cudnn_failure (cudnn_status.h) calls a refusal
// throws AlgorithmRefused, a launch or execution failure too provided the device is healthy afterwards (no
// sticky error); everything else is fatal as in DDP_CUDNN_CHECK.
void check_algorithm_status(cudnnStatus_t status, cudnnRNNAlgo_t algorithm, const char* call,
                            const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const std::string what = std::string(call) + " failed: " + cudnnGetErrorString(status);
  switch (classify_cudnn_failure(status, algorithm != CUDNN_RNN_ALGO_STANDARD)) {
    case CudnnFailure::kRefused:
      throw AlgorithmRefused{what};
    case CudnnFailure::kRefusedIfDeviceHealthy:
      cudaGetLastError();  // clears a launch failure, which is not sticky; a sticky fault survives the sync
      if (cudaDeviceSynchronize() == cudaSuccess) throw AlgorithmRefused{what};
      break;
    case CudnnFailure::kFatal:
      break;
  }
  ::ddp::fatal(what, file, line);
}

#define DDP_CUDNN_CHECK_ALGORITHM(call, algorithm) \
  check_algorithm_status((call), (algorithm), #call, __FILE__, __LINE__)

cudnnRNNAlgo_t to_cudnn(RnnAlgorithm algorithm) {
  switch (algorithm) {
    case RnnAlgorithm::kPersistStaticSmallH:
      return CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H;
    case RnnAlgorithm::kPersistStatic:
      return CUDNN_RNN_ALGO_PERSIST_STATIC;
    case RnnAlgorithm::kAuto:
    case RnnAlgorithm::kStandard:
      break;
  }
  return CUDNN_RNN_ALGO_STANDARD;
}

const char* cudnn_algorithm_name(cudnnRNNAlgo_t algorithm) {
  switch (algorithm) {
    case CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H:
      return "persistent small-hidden (CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H)";
    case CUDNN_RNN_ALGO_PERSIST_STATIC:
      return "persistent static (CUDNN_RNN_ALGO_PERSIST_STATIC)";
    default:
      return "standard (CUDNN_RNN_ALGO_STANDARD)";
  }
}

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

// --- The replica -------------------------------------------------------------------------------------------

std::size_t to_size(int v) {
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
  DeviceArray<float> weight_space;
  DeviceArray<float> weight_grads;
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
  std::string lstm_kernels() const override;
  std::span<float> params() override { return {params_.get(), layout_.total_size()}; }
  std::span<float> grads() override { return {grads_.get(), layout_.total_size()}; }
  void copy_params_to_host(std::span<float> host) override;
  void copy_params_from_host(std::span<const float> host) override;
  void copy_grads_to_host(std::span<float> host) override;

  void train_step(const BatchView& batch, const GradientReadyFn& on_ready) override;
  void evaluate(const BatchView& batch) override;
  void predict(const BatchView& batch, std::span<float> probabilities) override;
  BatchStats take_stats() override;

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
  // Parameters into cuDNN's weight space, the embedding lookup and cuDNN's forward.
  void forward(const BatchView& batch, const BatchShape& shape, bool training);
  // The dense layer's input, [B, D*H]: the top layer's output at the last step, or its final states.
  const float* dense_input(const BatchView& batch) const;
  // The dense layer, sigmoid and loss on the forward's last hidden states.
  void dense_and_loss(const BatchView& batch, const float* labels, float* probabilities, float* d_logits,
                      bool add_stats);
  // Copies the LSTM's parameters (to_cudnn) or weight gradients (!to_cudnn) between the canonical buffer
  // and the plan's space, on the stream.
  void copy_weights(const RnnPlan& plan, const float* source, float* target, bool to_cudnn, const char* what);
  unsigned int blocks_for(std::size_t n) const;
  std::size_t h_size() const { return to_size(layout_.shape().hidden); }
  // Throws TokenOutsideVocabulary if a batch since the last check held a token outside the vocabulary (the
  // flag was copied to the host by the caller, which synchronised the stream); clears the flag.
  void report_bad_token();

  ParamLayout layout_;
  int device_ = 0;
  RnnAlgorithm requested_ = RnnAlgorithm::kAuto;
  bool masked_ = false;
  double dropout_ = 0;            // between stacked layers, by cuDNN (training only)
  double embedding_dropout_ = 0;  // on the embedding's output, by embedding_dropout (training only)
  uint64_t dropout_key_ = 0;
  uint64_t dropout_draws_ = 0;
  uint64_t embedding_dropout_stream_ = 0;  // the last training forward's draw, for its backward
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
  std::vector<int> host_lengths_;      // [B]: masked, this batch's lengths for the descriptors
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
  int64_t count_ = 0;  // samples since the last take_stats(): known on the host
};

CudaReplica::CudaReplica(const ModelShape& shape, int device, RnnAlgorithm algorithm,
                         const ModelOptions& options)
    : layout_(shape),
      device_(device),
      requested_(algorithm),
      masked_(options.mask_padding),
      from_final_states_(options.mask_padding || shape.bidirectional),
      dropout_(shape.layers > 1 ? options.dropout : 0),
      embedding_dropout_(options.embedding_dropout) {
  select_device();
  embedding_offset_ = layout_.tensor("embedding").offset;
  dense_w_offset_ = layout_.tensor("dense.w").offset;
  dense_b_offset_ = layout_.tensor("dense.b").offset;
  int sm_count = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device_));
  max_blocks_ = std::max(1, sm_count) * 8;

  DDP_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
  gpu_spans_.emplace(stream_.get(), device_);
  DDP_CUDNN_CHECK(cudnnCreate(cudnn_.out()));
  DDP_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream_.get()));

  // Zero parameters until initialized or loaded, as the CPU replica; zero gradients until the first step.
  const std::size_t total = layout_.total_size();
  params_.ensure(total);
  grads_.ensure(total);
  DDP_CUDA_CHECK(cudaMemsetAsync(params_.get(), 0, params_.bytes(), stream_.get()));
  DDP_CUDA_CHECK(cudaMemsetAsync(grads_.get(), 0, grads_.bytes(), stream_.get()));
  stats_.ensure(1);
  bad_token_.ensure(1);
  DDP_CUDA_CHECK(cudaMemsetAsync(stats_.get(), 0, sizeof(DeviceStats), stream_.get()));
  DDP_CUDA_CHECK(cudaMemsetAsync(bad_token_.get(), 0, sizeof(unsigned int), stream_.get()));
  host_stats_.allocate();
  host_bad_token_.allocate();

  preferred_algorithm_ = to_cudnn(requested_);
  int major = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  // Where PyTorch also takes it: LSTMs of hidden size <= 128 on sm_60 and newer; never with per-sample
  // lengths, which this replica runs on the standard algorithm only (make_cuda_replica refuses a named one).
  if (requested_ == RnnAlgorithm::kAuto && shape.hidden <= 128 && major >= 6 && !masked_) {
    preferred_algorithm_ = CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H;
  }
  // The standard plan always: shapes the preferred algorithm does not take run on it.
  standard_ = make_plan(CUDNN_RNN_ALGO_STANDARD);
  if (preferred_algorithm_ != CUDNN_RNN_ALGO_STANDARD) {
    try {
      preferred_ = make_plan(preferred_algorithm_);
    } catch (const AlgorithmRefused& refused) {
      refuse_preferred(refused, "for this model");
      preferred_refused_ = true;
    }
  }
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

CudaReplica::~CudaReplica() {
  // Let queued work finish before the members free what it uses; a failure here is only reported. Where a
  // collective failed, the trainer has aborted the communicator before this (comm::AbortOnUnwind), so the
  // stream does not wait on a reduction forever.
  warn_cuda(cudaSetDevice(device_), "cudaSetDevice");
  warn_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize");
}

std::string CudaReplica::lstm_kernels() const {
  const cudnnRNNAlgo_t runs = preferred_ ? preferred_algorithm_ : CUDNN_RNN_ALGO_STANDARD;
  std::string text = std::string(layout_.shape().cell == Cell::kGru ? "cuDNN GRU " : "cuDNN LSTM ") +
                     cudnn_algorithm_name(runs);
  std::string fallback;
  for (const auto& [key, shape] : shapes_) {
    if (preferred_ && shape->plan == standard_.get()) {
      fallback +=
          (fallback.empty() ? "" : ", ") + std::to_string(key.first) + " x " + std::to_string(key.second);
    }
  }
  if (!fallback.empty()) text += ", the standard one for batches " + fallback;
  return text + " (model.cudnn_rnn_algo = " + rnn_algorithm_name(requested_) + ")";
}

void CudaReplica::refuse_preferred(const AlgorithmRefused& refused, const std::string& where) {
  if (requested_ != RnnAlgorithm::kAuto) {
    throw UserError("model.cudnn_rnn_algo = " + rnn_algorithm_name(requested_) + ": cuDNN " +
                    std::to_string(cudnnGetVersion()) + " turned it down " + where + " on this GPU (" +
                    refused.what + "): use auto or standard");
  }
  std::fprintf(stderr,
               "ddptrain: note: cuDNN turned down its %s LSTM algorithm %s (%s); the standard one runs\n",
               cudnn_algorithm_name(preferred_algorithm_), where.c_str(), refused.what.c_str());
}

std::unique_ptr<RnnPlan> CudaReplica::make_plan(cudnnRNNAlgo_t algorithm) {
  auto plan = std::make_unique<RnnPlan>();
  plan->algorithm = algorithm;
  build_rnn(*plan);
  build_weight_map(*plan);
  return plan;
}

void CudaReplica::build_rnn(RnnPlan& plan) {
  const ModelShape& shape = layout_.shape();
  // Between stacked layers, model.dropout: every plan's descriptor on one RNG state (seeded again from the
  // first dropout key, set_dropout_key). Without it cuDNN still wants a descriptor, with no state.
  DDP_CUDNN_CHECK(cudnnCreateDropoutDescriptor(plan.dropout.out()));
  if (dropout_ > 0) {
    std::size_t state_bytes = 0;
    DDP_CUDNN_CHECK(cudnnDropoutGetStatesSize(cudnn_.get(), &state_bytes));
    if (!dropout_states_initialized_) {
      dropout_states_.ensure(std::max<std::size_t>(state_bytes, 1));
      DDP_CUDNN_CHECK(cudnnSetDropoutDescriptor(plan.dropout.get(), cudnn_.get(),
                                                static_cast<float>(dropout_), dropout_states_.get(),
                                                state_bytes, 0));
      dropout_states_initialized_ = true;
    } else {
      DDP_CUDNN_CHECK(cudnnRestoreDropoutDescriptor(plan.dropout.get(), cudnn_.get(),
                                                    static_cast<float>(dropout_), dropout_states_.get(),
                                                    state_bytes, 0));
    }
  } else {
    DDP_CUDNN_CHECK(cudnnSetDropoutDescriptor(plan.dropout.get(), cudnn_.get(), 0.0f, nullptr, 0, 0));
  }
  DDP_CUDNN_CHECK(cudnnCreateRNNDescriptor(plan.rnn.out()));
  // A descriptor that cuDNN turns down for this algorithm throws AlgorithmRefused.
  // CUDNN_FMA_MATH: plain fp32 FMA kernels. CUDNN_DEFAULT_MATH would allow TF32 tensor cores on sm_80+, whose
  // 10-bit mantissa breaks parity with the CPU replica. Unpacked (padded) data needs PADDED_IO_ENABLED:
  // masked sequences are shorter than T.
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnSetRNNDescriptor_v8(
          plan.rnn.get(), plan.algorithm, shape.cell == Cell::kGru ? CUDNN_GRU : CUDNN_LSTM,
          CUDNN_RNN_DOUBLE_BIAS, shape.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
          CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH, shape.embedding_dim,
          shape.hidden, shape.hidden, shape.layers, plan.dropout.get(), CUDNN_RNN_PADDED_IO_ENABLED),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnGetRNNWeightSpaceSize(cudnn_.get(), plan.rnn.get(), &plan.weight_space_bytes), plan.algorithm);
  if (plan.weight_space_bytes == 0 || plan.weight_space_bytes % sizeof(float) != 0) {
    DDP_FATAL("cudnnGetRNNWeightSpaceSize: " + std::to_string(plan.weight_space_bytes) +
              " bytes is not a whole number of floats");
  }
  const std::size_t floats = plan.weight_space_bytes / sizeof(float);
  plan.weight_space.ensure(floats);
  plan.weight_grads.ensure(floats);
  // Any padding cuDNN keeps in its space stays zero.
  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_space.get(), 0, plan.weight_space_bytes, stream_.get()));
  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_grads.get(), 0, plan.weight_space_bytes, stream_.get()));
}

// Reads a descriptor cudnnGetRNNWeightParams filled in: "" if it is a row-major [rows, cols] float matrix
// ({1, rows, cols} with unit column stride and row stride cols), as the canonical layout stores it, else
// what it is instead.
// weight_map.h's check of a block cuDNN described.
std::string row_major_problem(cudnnTensorDescriptor_t desc, int rows, int cols, const std::string& what) {
  BlockDescription block;
  cudnnDataType_t type{};
  DDP_CUDNN_CHECK(cudnnGetTensorNdDescriptor(desc, 3, &type, &block.dims_count, block.dims, block.strides));
  block.is_float = type == CUDNN_DATA_FLOAT;
  return models::row_major_problem(block, rows, cols, what);
}

void CudaReplica::weight_map_failed(const RnnPlan& plan, const std::string& what) {
  // A persistent algorithm may lay its weights out in a way the map does not take: auto then falls back.
  if (plan.algorithm != CUDNN_RNN_ALGO_STANDARD) throw AlgorithmRefused{what};
  DDP_FATAL(what);
}

void CudaReplica::build_weight_map(RnnPlan& plan) {
  const ModelShape& shape = layout_.shape();
  const int hidden = shape.hidden;
  const std::size_t h = to_size(hidden);
  const std::size_t space_floats = plan.weight_space_bytes / sizeof(float);
  const auto* base = reinterpret_cast<const char*>(plan.weight_space.get());
  auto offset_in_space = [&](const void* address, std::size_t count, const std::string& what) {
    const auto* p = static_cast<const char*>(address);
    if (p == nullptr || p < base || (p - base) % static_cast<std::ptrdiff_t>(sizeof(float)) != 0) {
      weight_map_failed(plan, "cudnnGetRNNWeightParams: " + what + " is not a float inside the weight space");
    }
    const auto offset = static_cast<std::size_t>(p - base) / sizeof(float);
    if (offset + count > space_floats) {
      weight_map_failed(plan, "cudnnGetRNNWeightParams: " + what + " ends past the weight space");
    }
    return offset;
  };

  TensorDescriptor matrix_desc;
  TensorDescriptor bias_desc;
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(matrix_desc.out()));
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(bias_desc.out()));
  std::vector<WeightRun> runs;
  std::size_t lstm_floats = 0;  // the recurrent layers' floats, LSTM or GRU
  const int gates = shape.gates();
  // cuDNN's pseudo-layers: layer l's direction d is l * D + d, in the canonical layout's order.
  for (int pseudo = 0; pseudo < shape.layers * shape.directions(); ++pseudo) {
    const int l = pseudo / shape.directions();
    const std::string prefix = shape.tensor_prefix(l, pseudo % shape.directions()) + ".";
    const ParamTensor& w_ih = layout_.tensor(prefix + "w_ih");
    const ParamTensor& w_hh = layout_.tensor(prefix + "w_hh");
    const ParamTensor& b_ih = layout_.tensor(prefix + "b_ih");
    const ParamTensor& b_hh = layout_.tensor(prefix + "b_hh");
    lstm_floats += w_ih.size() + w_hh.size() + b_ih.size() + b_hh.size();
    const int in = l == 0 ? shape.embedding_dim : shape.output_width();
    // Linear layer ids 0..G-1 are the input matrices of the gates (LSTM i, f, g, o; GRU r, z, n, cuDNN's
    // reset, update and new-memory gates), G..2G-1 the recurrent ones. With CUDNN_RNN_DOUBLE_BIAS each has
    // its own bias: b_ih for the first G, b_hh for the others.
    for (int id = 0; id < 2 * gates; ++id) {
      const bool recurrent = id >= gates;
      const std::size_t gate = to_size(id % gates);
      const int cols = recurrent ? hidden : in;
      const std::string what = prefix + (recurrent ? "w_hh" : "w_ih") + " gate " + std::to_string(gate);
      void* matrix = nullptr;
      void* bias = nullptr;
      DDP_CUDNN_CHECK_ALGORITHM(cudnnGetRNNWeightParams(cudnn_.get(), plan.rnn.get(), pseudo,
                                                        plan.weight_space_bytes, plan.weight_space.get(), id,
                                                        matrix_desc.get(), &matrix, bias_desc.get(), &bias),
                                plan.algorithm);
      for (const std::string& problem : {row_major_problem(matrix_desc.get(), hidden, cols, what),
                                         row_major_problem(bias_desc.get(), hidden, 1, what + " bias")}) {
        if (!problem.empty()) weight_map_failed(plan, problem);
      }
      const std::size_t matrix_count = h * to_size(cols);
      runs.push_back({(recurrent ? w_hh : w_ih).offset + gate * matrix_count,
                      offset_in_space(matrix, matrix_count, what), matrix_count});
      runs.push_back(
          {(recurrent ? b_hh : b_ih).offset + gate * h, offset_in_space(bias, h, what + " bias"), h});
    }
  }

  std::string problem;
  const WeightMap map = merge_weight_runs(
      std::move(runs), layout_.tensor(shape.tensor_prefix(0, 0) + ".w_ih").offset, lstm_floats, problem);
  if (!problem.empty()) weight_map_failed(plan, problem);
  const std::vector<WeightRun>& merged = map.runs;
  if (merged.size() > 65535) DDP_FATAL("weight map: more runs than a grid's y dimension holds");
  plan.weight_run_count = static_cast<unsigned int>(merged.size());
  plan.longest_weight_run = map.longest;
  plan.weight_runs.ensure(merged.size());
  DDP_CUDA_CHECK(cudaMemcpyAsync(plan.weight_runs.get(), merged.data(), merged.size() * sizeof(WeightRun),
                                 cudaMemcpyHostToDevice, stream_.get()));
  // `merged` is pageable and dies here: wait for the copy.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaReplica::copy_weights(const RnnPlan& plan, const float* source, float* target, bool to_cudnn,
                               const char* what) {
  const dim3 grid(blocks_for(plan.longest_weight_run), plan.weight_run_count);
  copy_weight_runs<<<grid, kThreads, 0, stream_.get()>>>(plan.weight_runs.get(), source, target, to_cudnn);
  DDP_CUDA_CHECK_LAUNCH(what);
}

unsigned int CudaReplica::blocks_for(std::size_t n) const {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::clamp<std::size_t>(blocks, 1, to_size(max_blocks_)));
}

const BatchShape& CudaReplica::shape_for(int batch, int seq) {
  if (auto it = shapes_.find({batch, seq}); it != shapes_.end()) return *it->second;
  return add_shape(batch, seq);
}

const BatchShape& CudaReplica::add_shape(int batch, int seq) {
  const auto key = std::make_pair(batch, seq);
  // A new shape: buffers may be replaced, so nothing queued may still use them.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  if (preferred_) {
    try {
      return *shapes_.emplace(key, build_shape(batch, seq, *preferred_)).first->second;
    } catch (const AlgorithmRefused& refused) {
      refuse_preferred(refused, "for batches of " + std::to_string(batch) + " x " + std::to_string(seq));
    }
  }
  return *shapes_.emplace(key, build_shape(batch, seq, *standard_)).first->second;
}

bool CudaReplica::try_shape(int batch, int seq) {
  if (batch <= 0 || seq <= 0) {
    throw std::invalid_argument("CudaReplica::try_shape: batch " + std::to_string(batch) + ", seq " +
                                std::to_string(seq));
  }
  select_device();
  if (!preferred_) return !preferred_refused_;
  return shape_for(batch, seq).plan == preferred_.get();
}

void CudaReplica::settle_shape(int batch, int seq, bool preferred) {
  select_device();
  const BatchShape& shape = shape_for(batch, seq);
  if (preferred || shape.plan == standard_.get()) return;
  // Another rank's GPU turned the preferred algorithm down for this shape's role: the standard one here
  // too, so that every rank runs the same kernels.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  shapes_[{batch, seq}] = build_shape(batch, seq, *standard_);
}

std::unique_ptr<BatchShape> CudaReplica::build_shape(int batch, int seq, RnnPlan& plan) {
  const ModelShape& model = layout_.shape();
  auto shape = std::make_unique<BatchShape>();
  shape->plan = &plan;
  const std::vector<int> lengths(to_size(batch), seq);
  DDP_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(shape->x.out()));
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape->x.get(), CUDNN_DATA_FLOAT,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, seq, batch,
                                            model.embedding_dim, lengths.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(shape->y.out()));
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape->y.get(), CUDNN_DATA_FLOAT,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, seq, batch,
                                            model.output_width(), lengths.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(shape->state.out()));
  const int state_dims[3] = {model.layers * model.directions(), batch, model.hidden};
  const int state_strides[3] = {batch * model.hidden, model.hidden, 1};
  DDP_CUDNN_CHECK(
      cudnnSetTensorNdDescriptor(shape->state.get(), CUDNN_DATA_FLOAT, 3, state_dims, state_strides));
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnGetRNNTempSpaceSizes(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_TRAINING, shape->x.get(),
                                &shape->train_workspace, &shape->reserve),
      plan.algorithm);
  std::size_t inference_reserve = 0;
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnGetRNNTempSpaceSizes(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_INFERENCE, shape->x.get(),
                                &shape->inference_workspace, &inference_reserve),
      plan.algorithm);
  shape->seq_lengths.ensure(to_size(batch));
  fill_int32<<<blocks_for(to_size(batch)), kThreads, 0, stream_.get()>>>(shape->seq_lengths.get(), batch,
                                                                         seq);
  DDP_CUDA_CHECK_LAUNCH("fill_int32");

  const std::size_t rows = to_size(batch) * to_size(seq);
  const std::size_t width = to_size(model.output_width());
  x_.ensure(rows * to_size(model.embedding_dim));
  dx_.ensure(rows * to_size(model.embedding_dim));
  y_.ensure(rows * width);
  if (dy_.size() < rows * width) {
    dy_.ensure(rows * width);
    dy_shape_ = {0, 0};
  }
  if (from_final_states_) {
    const std::size_t states =
        to_size(model.layers) * to_size(model.directions()) * to_size(batch) * h_size();
    hy_.ensure(states);
    dhy_.ensure(states);
    final_states_.ensure(to_size(batch) * width);
    d_final_states_.ensure(to_size(batch) * width);
  }
  if (masked_) {
    starts_.ensure(to_size(batch));
    host_lengths_.resize(std::max(host_lengths_.size(), to_size(batch)));
  }
  // At least one byte each, so that cuDNN always gets a real pointer.
  workspace_.ensure(std::max<std::size_t>({shape->train_workspace, shape->inference_workspace, 1}));
  reserve_.ensure(std::max<std::size_t>(shape->reserve, 1));
  probabilities_.ensure(to_size(batch) * to_size(model.outputs()));
  d_logits_.ensure(to_size(batch) * to_size(model.outputs()));
  if (plan.algorithm != CUDNN_RNN_ALGO_STANDARD) {
    try {
      probe(*shape);
    } catch (const AlgorithmRefused&) {
      // Work the probe queued may still use this shape's buffers, which the unwinding frees.
      DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
      throw;
    }
  }
  return shape;
}

void CudaReplica::probe(const BatchShape& shape) {
  // Scratch only: x and dy are zeros (dy_ is re-zeroed before the next backward), and the real forward,
  // backward and weight-gradient zeroing of a step overwrite everything the probe writes. The gathered
  // weights are the canonical parameters, as in a forward.
  cudaStream_t stream = stream_.get();
  const RnnPlan& plan = *shape.plan;
  DDP_CUDA_CHECK(cudaMemsetAsync(x_.get(), 0, x_.bytes(), stream));
  DDP_CUDA_CHECK(cudaMemsetAsync(dy_.get(), 0, dy_.bytes(), stream));
  dy_shape_ = {0, 0};
  copy_weights(plan, params_.get(), plan.weight_space.get(), true, "copy_weight_runs (probe)");
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNForward(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_INFERENCE, shape.seq_lengths.get(),
                      shape.x.get(), x_.get(), shape.y.get(), y_.get(), shape.state.get(), nullptr, nullptr,
                      shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
                      workspace_.bytes(), workspace_.get(), 0, nullptr),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNForward(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_TRAINING, shape.seq_lengths.get(),
                      shape.x.get(), x_.get(), shape.y.get(), y_.get(), shape.state.get(), nullptr, nullptr,
                      shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
                      workspace_.bytes(), workspace_.get(), reserve_.bytes(), reserve_.get()),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNBackwardData_v8(cudnn_.get(), plan.rnn.get(), shape.seq_lengths.get(), shape.y.get(), y_.get(),
                              dy_.get(), shape.x.get(), dx_.get(), shape.state.get(), nullptr, nullptr,
                              nullptr, shape.state.get(), nullptr, nullptr, nullptr, plan.weight_space_bytes,
                              plan.weight_space.get(), workspace_.bytes(), workspace_.get(), reserve_.bytes(),
                              reserve_.get()),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNBackwardWeights_v8(cudnn_.get(), plan.rnn.get(), CUDNN_WGRAD_MODE_ADD, shape.seq_lengths.get(),
                                 shape.x.get(), x_.get(), shape.state.get(), nullptr, shape.y.get(), y_.get(),
                                 plan.weight_space_bytes, plan.weight_grads.get(), workspace_.bytes(),
                                 workspace_.get(), reserve_.bytes(), reserve_.get()),
      plan.algorithm);
  // A kernel fault of the persistent algorithm shows here, on the shape that caused it.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::string CudaReplica::check_parameter_mapping() {
  select_device();
  const std::size_t total = layout_.total_size();
  std::vector<float> sent(total);
  copy_params_to_host(sent);
  DeviceArray<float> back;
  back.ensure(total);
  std::vector<float> received(total);
  const std::size_t lstm_begin = layout_.tensor(layout_.shape().tensor_prefix(0, 0) + ".w_ih").offset;
  const std::size_t lstm_end = layout_.tensor("dense.w").offset;
  for (const RnnPlan* plan : {standard_.get(), preferred_.get()}) {
    if (plan == nullptr) continue;
    // All bits set is a NaN no parameter holds: a float the map never writes back keeps it.
    DDP_CUDA_CHECK(cudaMemsetAsync(back.get(), 0xFF, back.bytes(), stream_.get()));
    copy_weights(*plan, params_.get(), plan->weight_space.get(), true, "copy_weight_runs (mapping check)");
    copy_weights(*plan, plan->weight_space.get(), back.get(), false, "copy_weight_runs (mapping check)");
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(received.data(), back.get(), back.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    for (std::size_t i = 0; i < total; ++i) {
      const bool lstm = i >= lstm_begin && i < lstm_end;
      const bool untouched = std::isnan(received[i]);
      if (lstm ? std::memcmp(&received[i], &sent[i], sizeof(float)) == 0 : untouched) continue;
      const ParamTensor* tensor = nullptr;
      for (const ParamTensor& t : layout_.tensors()) {
        if (i >= t.offset && i < t.offset + t.size()) tensor = &t;
      }
      const std::string where = (tensor != nullptr ? tensor->name : std::string("?")) + "[" +
                                std::to_string(tensor != nullptr ? i - tensor->offset : i) + "]";
      return std::string("canonical -> cuDNN ") + cudnn_algorithm_name(plan->algorithm) +
             " weight space -> canonical: " + where +
             (lstm ? " came back as " + std::to_string(received[i]) + " instead of " + std::to_string(sent[i])
                   : " was written, but it is not a recurrent layer's weight");
    }
  }
  return "";
}

void CudaReplica::check_batch(const BatchView& batch, bool need_labels, const char* what) const {
  if (batch.tokens == nullptr || batch.batch <= 0 || batch.seq <= 0 ||
      (need_labels && batch.labels == nullptr)) {
    throw std::invalid_argument(std::string("CudaReplica::") + what +
                                ": a batch needs device tokens, labels, batch >= 1 and seq >= 1 (got batch " +
                                std::to_string(batch.batch) + ", seq " + std::to_string(batch.seq) + ")");
  }
  if (masked_ && batch.host_tokens == nullptr) {
    throw std::invalid_argument(std::string("CudaReplica::") + what +
                                ": a masked model needs the batch's host tokens (the sequence lengths)");
  }
}

void CudaReplica::set_sequence_lengths(const BatchView& batch, const BatchShape& shape) {
  if (!masked_) return;
  const ModelShape& model = layout_.shape();
  const std::size_t b_count = to_size(batch.batch);
  for (std::size_t b = 0; b < b_count; ++b) {
    host_lengths_[b] = batch.seq - masked_start(batch.host_tokens + b * to_size(batch.seq), batch.seq);
  }
  // The descriptors copy the lengths when set; the device's are computed on the stream from the same tokens
  // by the same rule, ahead of the cuDNN calls that read them.
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape.x.get(), CUDNN_DATA_FLOAT,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, batch.seq, batch.batch,
                                            model.embedding_dim, host_lengths_.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape.y.get(), CUDNN_DATA_FLOAT,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, batch.seq, batch.batch,
                                            model.output_width(), host_lengths_.data(), &padding_fill_));
  sequence_starts<<<blocks_for(b_count), kThreads, 0, stream_.get()>>>(
      batch.tokens, batch.batch, batch.seq, starts_.get(), shape.seq_lengths.get());
  DDP_CUDA_CHECK_LAUNCH("sequence_starts");
  // The shape's sizes were taken with every sequence T long; shorter ones should need no more, but the sizes
  // are cuDNN's to say.
  std::size_t workspace = 0;
  std::size_t reserve = 0;
  std::size_t inference_workspace = 0;
  std::size_t inference_reserve = 0;
  const RnnPlan& plan = *shape.plan;
  DDP_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_TRAINING,
                                            shape.x.get(), &workspace, &reserve));
  DDP_CUDNN_CHECK(cudnnGetRNNTempSpaceSizes(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_INFERENCE,
                                            shape.x.get(), &inference_workspace, &inference_reserve));
  workspace = std::max(workspace, inference_workspace);
  if (workspace > workspace_.bytes() || reserve > reserve_.bytes()) {
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // the old buffers may be in use
    workspace_.ensure(workspace);
    reserve_.ensure(reserve);
  }
}

void CudaReplica::forward(const BatchView& batch, const BatchShape& shape, bool training) {
  const ModelShape& model = layout_.shape();
  cudaStream_t stream = stream_.get();
  // The optimizer updated the canonical parameters in place since the last forward.
  const RnnPlan& plan = *shape.plan;
  copy_weights(plan, params_.get(), plan.weight_space.get(), true, "copy_weight_runs (gather)");

  set_sequence_lengths(batch, shape);
  const std::size_t x_count = to_size(batch.batch) * to_size(batch.seq) * to_size(model.embedding_dim);
  embedding_forward<<<blocks_for(x_count), kThreads, 0, stream>>>(
      batch.tokens, masked_ ? starts_.get() : nullptr, params_.get() + embedding_offset_, x_.get(),
      batch.batch, batch.seq, model.embedding_dim, model.vocab_size, bad_token_.get());
  DDP_CUDA_CHECK_LAUNCH("embedding_forward");
  if (training && embedding_dropout_ > 0) {
    embedding_dropout_stream_ = dropout_stream(dropout_key_, ++dropout_draws_);
    embedding_dropout<<<blocks_for(x_count), kThreads, 0, stream>>>(
        x_.get(), masked_ ? starts_.get() : nullptr, batch.batch, batch.seq, model.embedding_dim,
        embedding_dropout_stream_, embedding_dropout_);
    DDP_CUDA_CHECK_LAUNCH("embedding_dropout");
  }

  // h0 = c0 = 0 (null pointers); hy when the dense layer reads it, cy never.
  float* hy = from_final_states_ ? hy_.get() : nullptr;
  DDP_CUDNN_CHECK(cudnnRNNForward(
      cudnn_.get(), plan.rnn.get(), training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
      shape.seq_lengths.get(), shape.x.get(), x_.get(), shape.y.get(), y_.get(), shape.state.get(), nullptr,
      hy, shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
      workspace_.bytes(), workspace_.get(), training ? reserve_.bytes() : 0,
      training ? reserve_.get() : nullptr));
  if (from_final_states_) {
    const std::size_t count = to_size(batch.batch) * to_size(model.output_width());
    gather_final_states<<<blocks_for(count), kThreads, 0, stream>>>(
        hy_.get(), final_states_.get(), model.layers, model.directions(), batch.batch, model.hidden);
    DDP_CUDA_CHECK_LAUNCH("gather_final_states");
  }
}

const float* CudaReplica::dense_input(const BatchView& batch) const {
  if (from_final_states_) return final_states_.get();
  return y_.get() + to_size(batch.seq - 1) * to_size(batch.batch) * h_size();
}

void CudaReplica::dense_and_loss(const BatchView& batch, const float* labels, float* probabilities,
                                 float* d_logits, bool add_stats) {
  const int hidden = layout_.shape().output_width();  // the dense layer's input width
  const float* h_last = dense_input(batch);
  if (layout_.shape().classes != 2) {
    dense_softmax_forward<<<1, kDenseThreads, 0, stream_.get()>>>(
        h_last, params_.get() + dense_w_offset_, params_.get() + dense_b_offset_, labels, batch.batch, hidden,
        layout_.shape().classes, probabilities, d_logits, add_stats ? stats_.get() : nullptr);
    DDP_CUDA_CHECK_LAUNCH("dense_softmax_forward");
    return;
  }
  dense_forward<<<1, kDenseThreads, 0, stream_.get()>>>(
      h_last, params_.get() + dense_w_offset_, params_.get() + dense_b_offset_, labels, batch.batch, hidden,
      probabilities, d_logits, add_stats ? stats_.get() : nullptr);
  DDP_CUDA_CHECK_LAUNCH("dense_forward");
}

void CudaReplica::train_step(const BatchView& batch, const GradientReadyFn& on_ready) {
  check_batch(batch, true, "train_step");
  select_device();
  const BatchShape& shape = shape_for(batch.batch, batch.seq);
  const RnnPlan& plan = *shape.plan;
  const ModelShape& model = layout_.shape();
  const auto& segments = layout_.segments();
  cudaStream_t stream = stream_.get();
  auto ready = [&](std::size_t segment) {
    if (on_ready) on_ready(segments[segment]);
  };

  // Two kinds of span: the host's enqueue time on the calling thread, the GPU's own time on its stream.
  void* gpu_forward = gpu_spans_->begin();
  {
    timeline::Span span("enqueue forward");
    forward(batch, shape, /*training=*/true);
    dense_and_loss(batch, batch.labels, nullptr, d_logits_.get(), /*add_stats=*/true);
    count_ += batch.batch;
  }
  gpu_spans_->end(gpu_forward, "forward");
  void* gpu_backward = gpu_spans_->begin();
  timeline::Span backward_span("enqueue backward");

  // dy is zero but, when the dense layer reads y's last step, that step's block, which dense_backward
  // writes; re-zero only when the shape moved the block. Reading final states, the gradient goes to dhy.
  const int width = model.output_width();
  const std::size_t step_floats = to_size(batch.batch) * to_size(width);
  const std::size_t y_floats = to_size(batch.seq) * step_floats;
  if (dy_shape_ != std::make_pair(batch.batch, batch.seq)) {
    DDP_CUDA_CHECK(cudaMemsetAsync(dy_.get(), 0, y_floats * sizeof(float), stream));
    dy_shape_ = {batch.batch, batch.seq};
  }
  const float* h_last = dense_input(batch);
  float* d_h_last = from_final_states_ ? d_final_states_.get() : dy_.get() + y_floats - step_floats;
  if (model.classes != 2) {
    const std::size_t classes = to_size(model.classes);
    dense_softmax_backward<<<blocks_for(step_floats + classes * (to_size(width) + 1)), kThreads, 0, stream>>>(
        h_last, d_logits_.get(), params_.get() + dense_w_offset_, grads_.get() + dense_w_offset_,
        grads_.get() + dense_b_offset_, d_h_last, batch.batch, width, model.classes);
    DDP_CUDA_CHECK_LAUNCH("dense_softmax_backward");
  } else {
    dense_backward<<<blocks_for(step_floats + to_size(width) + 1), kThreads, 0, stream>>>(
        h_last, d_logits_.get(), params_.get() + dense_w_offset_, grads_.get() + dense_w_offset_,
        grads_.get() + dense_b_offset_, d_h_last, batch.batch, width);
    DDP_CUDA_CHECK_LAUNCH("dense_backward");
  }
  ready(segments.size() - 1);
  float* dhy = nullptr;
  if (from_final_states_) {
    dhy = dhy_.get();
    DDP_CUDA_CHECK(cudaMemsetAsync(dhy, 0, dhy_.bytes(), stream));
    scatter_final_states<<<blocks_for(step_floats), kThreads, 0, stream>>>(
        d_final_states_.get(), dhy, model.layers, model.directions(), batch.batch, model.hidden);
    DDP_CUDA_CHECK_LAUNCH("scatter_final_states");
  }

  // cuDNN: dx (for the embedding) first, then the weight gradients of every layer at once, added into a
  // zeroed space.
  DDP_CUDNN_CHECK(cudnnRNNBackwardData_v8(
      cudnn_.get(), plan.rnn.get(), shape.seq_lengths.get(), shape.y.get(), y_.get(), dy_.get(),
      shape.x.get(), dx_.get(), shape.state.get(), nullptr, dhy, nullptr, shape.state.get(), nullptr, nullptr,
      nullptr, plan.weight_space_bytes, plan.weight_space.get(), workspace_.bytes(), workspace_.get(),
      reserve_.bytes(), reserve_.get()));
  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_grads.get(), 0, plan.weight_space_bytes, stream));
  DDP_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(
      cudnn_.get(), plan.rnn.get(), CUDNN_WGRAD_MODE_ADD, shape.seq_lengths.get(), shape.x.get(), x_.get(),
      shape.state.get(), nullptr, shape.y.get(), y_.get(), plan.weight_space_bytes, plan.weight_grads.get(),
      workspace_.bytes(), workspace_.get(), reserve_.bytes(), reserve_.get()));
  copy_weights(plan, plan.weight_grads.get(), grads_.get(), false, "copy_weight_runs (scatter)");
  for (int l = model.layers - 1; l >= 0; --l) ready(to_size(l) + 1);

  const ParamSegment& embedding = segments.front();
  DDP_CUDA_CHECK(cudaMemsetAsync(grads_.get() + embedding.offset, 0, embedding.size * sizeof(float), stream));
  const std::size_t x_count = to_size(batch.batch) * to_size(batch.seq) * to_size(model.embedding_dim);
  if (embedding_dropout_ > 0) {
    // The forward's mask on the input gradient: dropped elements pass no gradient to their rows.
    embedding_dropout<<<blocks_for(x_count), kThreads, 0, stream>>>(
        dx_.get(), masked_ ? starts_.get() : nullptr, batch.batch, batch.seq, model.embedding_dim,
        embedding_dropout_stream_, embedding_dropout_);
    DDP_CUDA_CHECK_LAUNCH("embedding_dropout (backward)");
  }
  embedding_backward<<<blocks_for(x_count), kThreads, 0, stream>>>(
      batch.tokens, masked_ ? starts_.get() : nullptr, dx_.get(), grads_.get() + embedding_offset_,
      batch.batch, batch.seq, model.embedding_dim, model.vocab_size);
  DDP_CUDA_CHECK_LAUNCH("embedding_backward");
  gpu_spans_->end(gpu_backward, "backward");
  ready(0);
}

void CudaReplica::evaluate(const BatchView& batch) {
  check_batch(batch, true, "evaluate");
  select_device();
  const BatchShape& shape = shape_for(batch.batch, batch.seq);
  forward(batch, shape, /*training=*/false);
  dense_and_loss(batch, batch.labels, nullptr, nullptr, /*add_stats=*/true);
  count_ += batch.batch;
}

void CudaReplica::predict(const BatchView& batch, std::span<float> probabilities) {
  check_batch(batch, false, "predict");
  const bool with_labels = batch.labels != nullptr;
  if (probabilities.size() != to_size(batch.batch) * to_size(layout_.shape().outputs())) {
    throw std::invalid_argument("CudaReplica::predict: probabilities holds " +
                                std::to_string(probabilities.size()) + " entries for a batch of " +
                                std::to_string(batch.batch));
  }
  select_device();
  const BatchShape& shape = shape_for(batch.batch, batch.seq);
  forward(batch, shape, /*training=*/false);
  dense_and_loss(batch, batch.labels, probabilities_.get(), nullptr, /*add_stats=*/with_labels);
  if (with_labels) count_ += batch.batch;
  cudaStream_t stream = stream_.get();
  DDP_CUDA_CHECK(cudaMemcpyAsync(probabilities.data(), probabilities_.get(), probabilities.size_bytes(),
                                 cudaMemcpyDeviceToHost, stream));
  DDP_CUDA_CHECK(cudaMemcpyAsync(host_bad_token_.get(), bad_token_.get(), sizeof(unsigned int),
                                 cudaMemcpyDeviceToHost, stream));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  report_bad_token();
}

BatchStats CudaReplica::take_stats() {
  select_device();
  cudaStream_t stream = stream_.get();
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host_stats_.get(), stats_.get(), sizeof(DeviceStats), cudaMemcpyDeviceToHost, stream));
  DDP_CUDA_CHECK(cudaMemcpyAsync(host_bad_token_.get(), bad_token_.get(), sizeof(unsigned int),
                                 cudaMemcpyDeviceToHost, stream));
  DDP_CUDA_CHECK(cudaMemsetAsync(stats_.get(), 0, sizeof(DeviceStats), stream));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  BatchStats stats;
  stats.loss_sum = host_stats_.get()->loss_sum;
  stats.correct = static_cast<int64_t>(host_stats_.get()->correct);
  stats.count = std::exchange(count_, 0);
  report_bad_token();
  return stats;
}

void CudaReplica::set_dropout_key(uint64_t key) {
  dropout_key_ = key;
  dropout_draws_ = 0;
  if (dropout_ <= 0 || dropout_seeded_) return;
  // Seeding runs a kernel on the handle's stream, after any work that still draws from the old state; the
  // other plans' descriptors share the state and take the new seed without another initialisation.
  select_device();
  attach_dropout_state(/*initialise=*/true, key);
  dropout_seeded_ = true;
}

void CudaReplica::attach_dropout_state(bool initialise, uint64_t seed) {
  std::size_t state_bytes = 0;
  DDP_CUDNN_CHECK(cudnnDropoutGetStatesSize(cudnn_.get(), &state_bytes));
  bool first = initialise;
  for (RnnPlan* plan : {standard_.get(), preferred_.get()}) {
    if (plan == nullptr) continue;
    DDP_CUDNN_CHECK((first ? cudnnSetDropoutDescriptor : cudnnRestoreDropoutDescriptor)(
        plan->dropout.get(), cudnn_.get(), static_cast<float>(dropout_), dropout_states_.get(), state_bytes,
        static_cast<unsigned long long>(seed)));
    first = false;
  }
}

std::string CudaReplica::dropout_state_tag(std::size_t state_bytes) const {
  cudaDeviceProp properties{};
  DDP_CUDA_CHECK(cudaGetDeviceProperties(&properties, device_));
  return "cudnn " + std::to_string(cudnnGetVersion()) + ", " + properties.name + " (sm " +
         std::to_string(properties.major) + std::to_string(properties.minor) + ", " +
         std::to_string(properties.multiProcessorCount) + " SMs), " + std::to_string(state_bytes) +
         " bytes of dropout state\n";
}

std::string CudaReplica::rng_state() {
  if (dropout_ <= 0) return {};
  select_device();
  std::size_t state_bytes = 0;
  DDP_CUDNN_CHECK(cudnnDropoutGetStatesSize(cudnn_.get(), &state_bytes));
  std::string saved = dropout_state_tag(state_bytes);
  const std::size_t header = saved.size();
  saved.resize(header + state_bytes);
  // After every step enqueued so far, whose masks advanced the state.
  DDP_CUDA_CHECK(cudaMemcpyAsync(saved.data() + header, dropout_states_.get(), state_bytes,
                                 cudaMemcpyDeviceToHost, stream_.get()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return saved;
}

bool CudaReplica::restore_rng_state(const std::string& saved) {
  if (dropout_ <= 0 || saved.empty()) return false;
  select_device();
  std::size_t state_bytes = 0;
  DDP_CUDNN_CHECK(cudnnDropoutGetStatesSize(cudnn_.get(), &state_bytes));
  const std::string tag = dropout_state_tag(state_bytes);
  if (saved.size() != tag.size() + state_bytes || saved.compare(0, tag.size(), tag) != 0) return false;
  DDP_CUDA_CHECK(cudaMemcpyAsync(dropout_states_.get(), saved.data() + tag.size(), state_bytes,
                                 cudaMemcpyHostToDevice, stream_.get()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));  // `saved` may go when this returns
  attach_dropout_state(/*initialise=*/false, 0);
  dropout_seeded_ = true;  // the state goes on from where it was saved, not from the next key
  return true;
}

void CudaReplica::report_bad_token() {
  if (*host_bad_token_.get() == 0) return;
  *host_bad_token_.get() = 0;
  DDP_CUDA_CHECK(cudaMemsetAsync(bad_token_.get(), 0, sizeof(unsigned int), stream_.get()));
  throw TokenOutsideVocabulary("a batch held a token outside the vocabulary [0, " +
                               std::to_string(layout_.shape().vocab_size) + ")");
}

void CudaReplica::copy_params_to_host(std::span<float> host) {
  if (host.size() != layout_.total_size()) {
    throw std::invalid_argument("CudaReplica: host buffer of the wrong size");
  }
  select_device();
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), params_.get(), host.size_bytes(), cudaMemcpyDeviceToHost, stream_.get()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaReplica::copy_params_from_host(std::span<const float> host) {
  if (host.size() != layout_.total_size()) {
    throw std::invalid_argument("CudaReplica: host buffer of the wrong size");
  }
  select_device();
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(params_.get(), host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_.get()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

void CudaReplica::copy_grads_to_host(std::span<float> host) {
  if (host.size() != layout_.total_size()) {
    throw std::invalid_argument("CudaReplica: host buffer of the wrong size");
  }
  select_device();
  // On the compute stream, so the copy follows the backward that wrote the gradients.
  DDP_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), grads_.get(), host.size_bytes(), cudaMemcpyDeviceToHost, stream_.get()));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
}

}  // namespace

std::unique_ptr<Replica> make_cuda_replica(const ModelShape& shape, int device, RnnAlgorithm algorithm,
                                           const ModelOptions& options) {
  if (options.mask_padding && algorithm != RnnAlgorithm::kAuto && algorithm != RnnAlgorithm::kStandard) {
    throw UserError(
        "model.cudnn_rnn_algo = " + rnn_algorithm_name(algorithm) +
        ": masked sequences (model.mask_padding) run on cuDNN's standard algorithm here; use auto "
        "or standard");
  }
  if (shape.classes > kernels::kMaxClasses) {
    throw UserError("device = cuda: " + std::to_string(shape.classes) + " classes, the GPU's softmax takes " +
                    std::to_string(kernels::kMaxClasses));
  }
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    // The failed query leaves its error as the last error; clear it so later launch checks do not see it.
    static_cast<void>(cudaGetLastError());
    const std::string why = status != cudaSuccess ? cudaGetErrorString(status) : "no CUDA device";
    throw UserError("device = cuda: no GPU visible (" + why +
                    "): check the driver, CUDA_VISIBLE_DEVICES or the job's --gres/--gpus");
  }
  if (device < 0 || device >= count) {
    throw UserError("device = cuda: GPU " + std::to_string(device) + " requested, but " +
                    std::to_string(count) + " visible");
  }
  return std::make_unique<CudaReplica>(shape, device, algorithm, options);
}

}  // namespace ddp::models

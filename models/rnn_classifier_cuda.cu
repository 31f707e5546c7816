// The classifier on a GPU (cuda_replica.h): how it works is told in cudnn_replica.cuh. Here: its
// construction, the training step, evaluation and prediction, host copies and the dropout state.
#include "models/cudnn_replica.cuh"

namespace ddp::models::cudnn_replica {

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

CudaReplica::CudaReplica(const ModelShape& shape, int device, RnnAlgorithm algorithm,
                         const ModelOptions& options)
    : layout_(shape),
      device_(device),
      requested_(algorithm),
      masked_(options.mask_padding),
      precision_(options.precision),
      sixteen_bit_(sixteen_bit_data(options.precision)),
      half_(options.precision == Precision::kFp16),
      data_type_(half_          ? CUDNN_DATA_HALF
                 : sixteen_bit_ ? CUDNN_DATA_BFLOAT16
                                : CUDNN_DATA_FLOAT),
      element_bytes_(sixteen_bit_ ? sizeof(SixteenBits) : sizeof(float)),
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
  nonfinite_.ensure(1);
  host_nonfinite_.allocate();
  embedding_dropout_stream_.ensure(1);
  DDP_CUDA_CHECK(cudaMemsetAsync(embedding_dropout_stream_.get(), 0, sizeof(uint64_t), stream_.get()));

  preferred_algorithm_ = to_cudnn(requested_);
  int major = 0;
  int minor = 0;
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_));
  DDP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_));
  // Half recurrent layers on tensor cores: sm_70 on. bfloat16 ones: cuDNN has them from 9.13 on, for GPUs
  // with bfloat16 tensor cores (sm_80 on).
  if (half_ && major < 7) {
    throw UserError("model.precision = fp16: this GPU (sm_" + std::to_string(major) + std::to_string(minor) +
                    ") has no half-precision tensor cores (sm_70 and newer do); use fp32");
  }
  if (sixteen_bit_ && !half_ && major < 8) {
    throw UserError("model.precision = bf16: this GPU (sm_" + std::to_string(major) + std::to_string(minor) +
                    ") has no bfloat16 tensor cores (sm_80 and newer do); use fp32");
  }
  if (sixteen_bit_ && !half_ && cudnnGetVersion() < 91300) {
    throw UserError("model.precision = bf16: cuDNN " + std::to_string(cudnnGetVersion()) +
                    " has no bfloat16 recurrent layers (9.13 and newer have); use fp32 or tf32");
  }
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

std::string CudaReplica::recurrent_kernels() const {
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
  text += " (model.cudnn_rnn_algo = " + rnn_algorithm_name(requested_) + ")";
  if (precision_ == Precision::kTf32) text += ", TF32 tensor-core math (model.precision = tf32)";
  if (sixteen_bit_ && !half_) text += ", bfloat16 data and weights, float32 math (model.precision = bf16)";
  if (half_) text += ", half data and weights, float32 math, dynamic loss scaling (model.precision = fp16)";
  return text;
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

unsigned int CudaReplica::blocks_for(std::size_t n) const {
  const std::size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::clamp<std::size_t>(blocks, 1, to_size(max_blocks_)));
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
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape.x.get(), data_type_,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, batch.seq, batch.batch,
                                            model.embedding_dim, host_lengths_.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape.y.get(), data_type_,
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
    ++memory_generation_;
  }
}

void CudaReplica::forward(const BatchView& batch, const BatchShape& shape, bool training) {
  const ModelShape& model = layout_.shape();
  cudaStream_t stream = stream_.get();
  // The optimizer updated the canonical parameters in place since the last forward.
  const RnnPlan& plan = *shape.plan;
  gather_weights(plan, params_.get(), plan.weight_space.get(), "copy_weight_runs (gather)");

  set_sequence_lengths(batch, shape);
  const std::size_t x_count = to_size(batch.batch) * to_size(batch.seq) * to_size(model.embedding_dim);
  embedding_forward<<<blocks_for(x_count), kThreads, 0, stream>>>(
      batch.tokens, masked_ ? starts_.get() : nullptr, params_.get() + embedding_offset_, x_.get(),
      batch.batch, batch.seq, model.embedding_dim, model.vocab_size, bad_token_.get());
  DDP_CUDA_CHECK_LAUNCH("embedding_forward");
  if (training && embedding_dropout_ > 0) {
    embedding_dropout<<<blocks_for(x_count), kThreads, 0, stream>>>(
        x_.get(), masked_ ? starts_.get() : nullptr, batch.batch, batch.seq, model.embedding_dim,
        embedding_dropout_stream_.get(), embedding_dropout_);
    DDP_CUDA_CHECK_LAUNCH("embedding_dropout");
  }

  const CudnnIo io = cudnn_io();
  if (sixteen_bit_) to_sixteen_bit(x_.get(), x16_.get(), x_count, 1.0f, "to_sixteen (x)");
  // h0 = c0 = 0 (null pointers); hy when the dense layer reads it, cy never.
  void* hy = from_final_states_ ? io.hy : nullptr;
  DDP_CUDNN_CHECK(cudnnRNNForward(
      cudnn_.get(), plan.rnn.get(), training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
      shape.seq_lengths.get(), shape.x.get(), io.x, shape.y.get(), io.y, shape.state.get(), nullptr, hy,
      shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
      workspace_.bytes(), workspace_.get(), training ? reserve_.bytes() : 0,
      training ? reserve_.get() : nullptr));
  const std::size_t step_count = to_size(batch.batch) * to_size(model.output_width());
  if (from_final_states_) {
    if (sixteen_bit_)
      from_sixteen_bit(hy16_.get(), hy_.get(), states_count(batch.batch), 1.0f, "from_sixteen (hy)");
    gather_final_states<<<blocks_for(step_count), kThreads, 0, stream>>>(
        hy_.get(), final_states_.get(), model.layers, model.directions(), batch.batch, model.hidden);
    DDP_CUDA_CHECK_LAUNCH("gather_final_states");
  } else if (sixteen_bit_) {
    // The dense layer's input, y's last step, in float.
    from_sixteen_bit(y16_.get() + to_size(batch.seq - 1) * step_count, final_states_.get(), step_count, 1.0f,
                     "from_sixteen (y's last step)");
  }
}

CudaReplica::CudnnIo CudaReplica::cudnn_io() {
  if (sixteen_bit_) return {x16_.get(), dx16_.get(), y16_.get(), dy16_.get(), hy16_.get(), dhy16_.get()};
  return {x_.get(), dx_.get(), y_.get(), dy_.get(), hy_.get(), dhy_.get()};
}

void CudaReplica::to_sixteen_bit(const float* from, SixteenBits* to, std::size_t n, float scale,
                                 const char* what) {
  to_sixteen<<<blocks_for(n), kThreads, 0, stream_.get()>>>(from, to, n, half_, scale);
  DDP_CUDA_CHECK_LAUNCH(what);
}

void CudaReplica::from_sixteen_bit(const SixteenBits* from, float* to, std::size_t n, float scale,
                                   const char* what) {
  from_sixteen<<<blocks_for(n), kThreads, 0, stream_.get()>>>(from, to, n, half_, scale);
  DDP_CUDA_CHECK_LAUNCH(what);
}

bool CudaReplica::gradients_finite() {
  select_device();
  cudaStream_t stream = stream_.get();
  DDP_CUDA_CHECK(cudaMemsetAsync(nonfinite_.get(), 0, sizeof(unsigned int), stream));
  flag_nonfinite<<<blocks_for(layout_.total_size()), kThreads, 0, stream>>>(
      grads_.get(), layout_.total_size(), nonfinite_.get());
  DDP_CUDA_CHECK_LAUNCH("flag_nonfinite");
  DDP_CUDA_CHECK(cudaMemcpyAsync(host_nonfinite_.get(), nonfinite_.get(), sizeof(unsigned int),
                                 cudaMemcpyDeviceToHost, stream));
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *host_nonfinite_.get() == 0;
}

void CudaReplica::after_update(bool applied) {
  if (half_) loss_scale_.update(applied);
}

const float* CudaReplica::dense_input(const BatchView& batch) const {
  if (from_final_states_ || sixteen_bit_) return final_states_.get();
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
  begin_training(batch);
  enqueue_training(batch, on_ready);
}

std::string CudaReplica::step_graph_refusal() const {
  // The host sets what these change per batch or per step, so a replayed step would repeat the first's.
  if (masked_) return "model.mask_padding: each batch's sequence lengths go into cuDNN's descriptors";
  if (half_)
    return "model.precision = fp16: the loss scale and the skip of an overflowed step are the host's";
  // Whether cuDNN's dropout between layers draws new masks on a replay is not established: its state is
  // cuDNN's own.
  if (dropout_ > 0) return "model.dropout: cuDNN's dropout between layers runs eagerly";
  return "";
}

BatchView CudaReplica::begin_step(const BatchView& batch) {
  check_batch(batch, true, "begin_step");
  if (const std::string refusal = step_graph_refusal(); !refusal.empty())
    throw std::logic_error("CudaReplica::begin_step: " + refusal);
  select_device();
  begin_training(batch);  // the shape, with the staging buffers, exists from here on
  cudaStream_t stream = stream_.get();
  const std::size_t tokens = to_size(batch.batch) * to_size(batch.seq);
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_tokens_.get(), batch.tokens, tokens * sizeof(int32_t),
                                 cudaMemcpyDeviceToDevice, stream));
  DDP_CUDA_CHECK(cudaMemcpyAsync(staged_labels_.get(), batch.labels, to_size(batch.batch) * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream));
  BatchView staged = batch;
  staged.tokens = staged_tokens_.get();
  staged.labels = staged_labels_.get();
  return staged;
}

void CudaReplica::enqueue_step(const BatchView& staged, const GradientReadyFn& on_ready) {
  if (staged.tokens != staged_tokens_.get() || staged.labels != staged_labels_.get()) {
    throw std::logic_error("CudaReplica::enqueue_step: the batch is not begin_step's");
  }
  select_device();
  enqueue_training(staged, on_ready);
}

void CudaReplica::begin_training(const BatchView& batch) {
  shape_for(batch.batch, batch.seq);
  count_ += batch.batch;
  cudaStream_t stream = stream_.get();
  // dy is zero but, when the dense layer reads y's last step, that step's block, which dense_backward
  // writes; re-zero only when the shape moved the block. Reading final states, the gradient goes to dhy.
  if (dy_shape_ != std::make_pair(batch.batch, batch.seq)) {
    const std::size_t y_count =
        to_size(batch.batch) * to_size(batch.seq) * to_size(layout_.shape().output_width());
    DDP_CUDA_CHECK(cudaMemsetAsync(cudnn_io().dy, 0, y_count * element_bytes_, stream));
    dy_shape_ = {batch.batch, batch.seq};
  }
  if (embedding_dropout_ > 0) {
    store_uint64<<<1, 1, 0, stream>>>(dropout_stream(dropout_key_, ++dropout_draws_),
                                      embedding_dropout_stream_.get());
    DDP_CUDA_CHECK_LAUNCH("store_uint64 (embedding dropout stream)");
  }
}

void CudaReplica::enqueue_training(const BatchView& batch, const GradientReadyFn& on_ready) {
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
  }
  gpu_spans_->end(gpu_forward, "forward");
  void* gpu_backward = gpu_spans_->begin();
  timeline::Span backward_span("enqueue backward");

  const int width = model.output_width();
  const std::size_t step_floats = to_size(batch.batch) * to_size(width);
  const std::size_t y_floats = to_size(batch.seq) * step_floats;
  const CudnnIo io = cudnn_io();
  // fp16: the loss gradient enters cuDNN's half backward times the loss scale, which dx and the weight
  // gradients leave divided out again (powers of two: exact in float).
  const float scale = half_ ? loss_scale_.scale() : 1.0f;
  const float* h_last = dense_input(batch);
  float* d_h_last =
      from_final_states_ || sixteen_bit_ ? d_final_states_.get() : dy_.get() + y_floats - step_floats;
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
  void* dhy = nullptr;
  if (from_final_states_) {
    DDP_CUDA_CHECK(cudaMemsetAsync(dhy_.get(), 0, dhy_.bytes(), stream));
    scatter_final_states<<<blocks_for(step_floats), kThreads, 0, stream>>>(
        d_final_states_.get(), dhy_.get(), model.layers, model.directions(), batch.batch, model.hidden);
    DDP_CUDA_CHECK_LAUNCH("scatter_final_states");
    if (sixteen_bit_)
      to_sixteen_bit(dhy_.get(), dhy16_.get(), states_count(batch.batch), scale, "to_sixteen (dhy)");
    dhy = io.dhy;
  } else if (sixteen_bit_) {
    // The dense layer's gradient into dy's last step; the other steps stay zero.
    to_sixteen_bit(d_final_states_.get(), dy16_.get() + y_floats - step_floats, step_floats, scale,
                   "to_sixteen (dy's last step)");
  }

  // cuDNN's dx first; from it the embedding's gradient, whose reduction (as a rule the largest) then
  // travels while cuDNN computes the weight gradients of every layer at once, added into a zeroed space
  // (ParamLayout::reduction_order). The embedding's kernels touch neither the workspace nor the reserve
  // space, which the weight backward reads as the data backward left them.
  DDP_CUDNN_CHECK(cudnnRNNBackwardData_v8(
      cudnn_.get(), plan.rnn.get(), shape.seq_lengths.get(), shape.y.get(), io.y, io.dy, shape.x.get(), io.dx,
      shape.state.get(), nullptr, dhy, nullptr, shape.state.get(), nullptr, nullptr, nullptr,
      plan.weight_space_bytes, plan.weight_space.get(), workspace_.bytes(), workspace_.get(),
      reserve_.bytes(), reserve_.get()));

  const ParamSegment& embedding = segments.front();
  DDP_CUDA_CHECK(cudaMemsetAsync(grads_.get() + embedding.offset, 0, embedding.size * sizeof(float), stream));
  const std::size_t x_count = to_size(batch.batch) * to_size(batch.seq) * to_size(model.embedding_dim);
  if (sixteen_bit_) from_sixteen_bit(dx16_.get(), dx_.get(), x_count, 1.0f / scale, "from_sixteen (dx)");
  if (embedding_dropout_ > 0) {
    // The forward's mask on the input gradient: dropped elements pass no gradient to their rows.
    embedding_dropout<<<blocks_for(x_count), kThreads, 0, stream>>>(
        dx_.get(), masked_ ? starts_.get() : nullptr, batch.batch, batch.seq, model.embedding_dim,
        embedding_dropout_stream_.get(), embedding_dropout_);
    DDP_CUDA_CHECK_LAUNCH("embedding_dropout (backward)");
  }
  embedding_backward<<<blocks_for(x_count), kThreads, 0, stream>>>(
      batch.tokens, masked_ ? starts_.get() : nullptr, dx_.get(), grads_.get() + embedding_offset_,
      batch.batch, batch.seq, model.embedding_dim, model.vocab_size);
  DDP_CUDA_CHECK_LAUNCH("embedding_backward");
  ready(0);

  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_grads.get(), 0, plan.weight_space_bytes, stream));
  DDP_CUDNN_CHECK(cudnnRNNBackwardWeights_v8(
      cudnn_.get(), plan.rnn.get(), CUDNN_WGRAD_MODE_ADD, shape.seq_lengths.get(), shape.x.get(), io.x,
      shape.state.get(), nullptr, shape.y.get(), io.y, plan.weight_space_bytes, plan.weight_grads.get(),
      workspace_.bytes(), workspace_.get(), reserve_.bytes(), reserve_.get()));
  scatter_weights(plan, plan.weight_grads.get(), grads_.get(), 1.0f / scale, "copy_weight_runs (scatter)");
  gpu_spans_->end(gpu_backward, "backward");
  for (int l = model.layers - 1; l >= 0; --l) ready(to_size(l) + 1);
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
  throw BatchValueOutOfRange("a batch held a token outside the vocabulary [0, " +
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

}  // namespace ddp::models::cudnn_replica

namespace ddp::models {

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
  return std::make_unique<cudnn_replica::CudaReplica>(shape, device, algorithm, options);
}

}  // namespace ddp::models

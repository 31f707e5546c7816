// The cuDNN replica's batch shapes (cudnn_replica.cuh): the data descriptors and scratch sizes of each
// (batch, seq), built the first time it is met, and the probe that runs every cuDNN call of a step once on
// scratch buffers, so that an algorithm cuDNN turns down for a shape shows before the shape is trained on.
#include "models/cudnn_replica.cuh"

namespace ddp::models::cudnn_replica {

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
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape->x.get(), data_type_,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, seq, batch,
                                            model.embedding_dim, lengths.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnCreateRNNDataDescriptor(shape->y.out()));
  DDP_CUDNN_CHECK(cudnnSetRNNDataDescriptor(shape->y.get(), data_type_,
                                            CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED, seq, batch,
                                            model.output_width(), lengths.data(), &padding_fill_));
  DDP_CUDNN_CHECK(cudnnCreateTensorDescriptor(shape->state.out()));
  const int state_dims[3] = {model.layers * model.directions(), batch, model.hidden};
  const int state_strides[3] = {batch * model.hidden, model.hidden, 1};
  DDP_CUDNN_CHECK(cudnnSetTensorNdDescriptor(shape->state.get(), data_type_, 3, state_dims, state_strides));
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
  const std::size_t states = to_size(model.layers) * to_size(model.directions()) * to_size(batch) * h_size();
  // The embedding writes and reads float x and dx; bf16 converts them for cuDNN, whose y and dy it holds
  // in 16 bits alone (dy's zeros are kept per shape: dy_shape_).
  x_.ensure(rows * to_size(model.embedding_dim));
  dx_.ensure(rows * to_size(model.embedding_dim));
  if (sixteen_bit_) {
    x16_.ensure(rows * to_size(model.embedding_dim));
    dx16_.ensure(rows * to_size(model.embedding_dim));
    y16_.ensure(rows * width);
    if (dy16_.size() < rows * width) {
      dy16_.ensure(rows * width);
      dy_shape_ = {0, 0};
    }
  } else {
    y_.ensure(rows * width);
    if (dy_.size() < rows * width) {
      dy_.ensure(rows * width);
      dy_shape_ = {0, 0};
    }
  }
  if (from_final_states_) {
    hy_.ensure(states);
    dhy_.ensure(states);
    if (sixteen_bit_) {
      hy16_.ensure(states);
      dhy16_.ensure(states);
    }
  }
  if (from_final_states_ || sixteen_bit_) {
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
  staged_tokens_.ensure(rows);
  staged_labels_.ensure(to_size(batch));
  ++memory_generation_;  // any of the above may have moved
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
  const CudnnIo io = cudnn_io();
  const std::size_t x_bytes = sixteen_bit_ ? x16_.bytes() : x_.bytes();
  const std::size_t dy_bytes = sixteen_bit_ ? dy16_.bytes() : dy_.bytes();
  DDP_CUDA_CHECK(cudaMemsetAsync(io.x, 0, x_bytes, stream));
  DDP_CUDA_CHECK(cudaMemsetAsync(io.dy, 0, dy_bytes, stream));
  dy_shape_ = {0, 0};
  gather_weights(plan, params_.get(), plan.weight_space.get(), "copy_weight_runs (probe)");
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNForward(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_INFERENCE, shape.seq_lengths.get(),
                      shape.x.get(), io.x, shape.y.get(), io.y, shape.state.get(), nullptr, nullptr,
                      shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
                      workspace_.bytes(), workspace_.get(), 0, nullptr),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNForward(cudnn_.get(), plan.rnn.get(), CUDNN_FWD_MODE_TRAINING, shape.seq_lengths.get(),
                      shape.x.get(), io.x, shape.y.get(), io.y, shape.state.get(), nullptr, nullptr,
                      shape.state.get(), nullptr, nullptr, plan.weight_space_bytes, plan.weight_space.get(),
                      workspace_.bytes(), workspace_.get(), reserve_.bytes(), reserve_.get()),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNBackwardData_v8(cudnn_.get(), plan.rnn.get(), shape.seq_lengths.get(), shape.y.get(), io.y,
                              io.dy, shape.x.get(), io.dx, shape.state.get(), nullptr, nullptr, nullptr,
                              shape.state.get(), nullptr, nullptr, nullptr, plan.weight_space_bytes,
                              plan.weight_space.get(), workspace_.bytes(), workspace_.get(), reserve_.bytes(),
                              reserve_.get()),
      plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnRNNBackwardWeights_v8(cudnn_.get(), plan.rnn.get(), CUDNN_WGRAD_MODE_ADD, shape.seq_lengths.get(),
                                 shape.x.get(), io.x, shape.state.get(), nullptr, shape.y.get(), io.y,
                                 plan.weight_space_bytes, plan.weight_grads.get(), workspace_.bytes(),
                                 workspace_.get(), reserve_.bytes(), reserve_.get()),
      plan.algorithm);
  // A kernel fault of the persistent algorithm shows here, on the shape that caused it.
  DDP_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace ddp::models::cudnn_replica

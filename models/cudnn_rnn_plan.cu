// The cuDNN replica's plans (cudnn_replica.cuh): for one algorithm, the RNN descriptor, cuDNN's weight
// space and weight-gradient space, and the weight map between them and the canonical layout, with the
// check that the map round-trips every parameter.
#include "models/cudnn_replica.cuh"

#include "engine/base/float16.h"

namespace ddp::models::cudnn_replica {

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
  // model.precision: fp32 takes CUDNN_FMA_MATH, plain float32 FMA kernels, the CPU replica's arithmetic;
  // tf32 takes CUDNN_DEFAULT_MATH, which on sm_80 and newer lets cuDNN run the products on tensor cores with
  // their inputs rounded to TF32 (10 mantissa bits) and summed in float32 (cudnn_graph.h: cudnnMathType_t),
  // as PyTorch does under allow_tf32; bf16 and fp16 give cuDNN bfloat16 or half data and weights (dataType)
  // with float32 math (mathPrec) on the tensor cores. Unpacked (padded) data needs PADDED_IO_ENABLED: masked
  // sequences are shorter than T.
  const cudnnMathType_t math = sixteen_bit_                     ? CUDNN_TENSOR_OP_MATH
                               : precision_ == Precision::kTf32 ? CUDNN_DEFAULT_MATH
                                                                : CUDNN_FMA_MATH;
  const cudnnStatus_t set = cudnnSetRNNDescriptor_v8(
      plan.rnn.get(), plan.algorithm, shape.cell == Cell::kGru ? CUDNN_GRU : CUDNN_LSTM,
      CUDNN_RNN_DOUBLE_BIAS, shape.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
      CUDNN_LINEAR_INPUT, data_type_, CUDNN_DATA_FLOAT, math, shape.embedding_dim, shape.hidden, shape.hidden,
      shape.layers, plan.dropout.get(), CUDNN_RNN_PADDED_IO_ENABLED);
  // 16-bit data that this cuDNN turns down for the model even on the standard algorithm is a setting to
  // change.
  if (set != CUDNN_STATUS_SUCCESS && sixteen_bit_ && plan.algorithm == CUDNN_RNN_ALGO_STANDARD &&
      classify_cudnn_failure(set, /*persistent_algorithm=*/true) == CudnnFailure::kRefused) {
    throw UserError("model.precision = " + precision_name(precision_) + ": cuDNN " +
                    std::to_string(cudnnGetVersion()) + " turned down " + (half_ ? "half" : "bfloat16") +
                    " recurrent layers for this model (" + cudnnGetErrorString(set) + "); use fp32 or tf32");
  }
  // A descriptor that cuDNN turns down for a persistent algorithm throws AlgorithmRefused.
  DDP_CUDNN_CHECK_ALGORITHM(set, plan.algorithm);
  DDP_CUDNN_CHECK_ALGORITHM(
      cudnnGetRNNWeightSpaceSize(cudnn_.get(), plan.rnn.get(), &plan.weight_space_bytes), plan.algorithm);
  if (plan.weight_space_bytes == 0 || plan.weight_space_bytes % element_bytes_ != 0) {
    DDP_FATAL("cudnnGetRNNWeightSpaceSize: " + std::to_string(plan.weight_space_bytes) +
              " bytes is not a whole number of elements of " + std::to_string(element_bytes_) + " bytes");
  }
  plan.weight_space.ensure(plan.weight_space_bytes);
  plan.weight_grads.ensure(plan.weight_space_bytes);
  // Any padding cuDNN keeps in its space stays zero.
  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_space.get(), 0, plan.weight_space_bytes, stream_.get()));
  DDP_CUDA_CHECK(cudaMemsetAsync(plan.weight_grads.get(), 0, plan.weight_space_bytes, stream_.get()));
}

// Reads a descriptor cudnnGetRNNWeightParams filled in: "" if it is a row-major [rows, cols] matrix of
// `data_type` ({1, rows, cols} with unit column stride and row stride cols), as the canonical layout stores
// it, else what it is instead: weight_map.h's check of a block cuDNN described.
std::string row_major_problem(cudnnTensorDescriptor_t desc, cudnnDataType_t data_type, int rows, int cols,
                              const std::string& what) {
  BlockDescription block;
  cudnnDataType_t type{};
  DDP_CUDNN_CHECK(cudnnGetTensorNdDescriptor(desc, 3, &type, &block.dims_count, block.dims, block.strides));
  block.of_data_type = type == data_type;
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
  // Offsets and counts in elements of the data type.
  const std::size_t space_elements = plan.weight_space_bytes / element_bytes_;
  const auto* base = reinterpret_cast<const char*>(plan.weight_space.get());
  auto offset_in_space = [&](const void* address, std::size_t count, const std::string& what) {
    const auto* p = static_cast<const char*>(address);
    if (p == nullptr || p < base || (p - base) % static_cast<std::ptrdiff_t>(element_bytes_) != 0) {
      weight_map_failed(plan,
                        "cudnnGetRNNWeightParams: " + what + " is not an element inside the weight space");
    }
    const auto offset = static_cast<std::size_t>(p - base) / element_bytes_;
    if (offset + count > space_elements) {
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
      for (const std::string& problem :
           {row_major_problem(matrix_desc.get(), data_type_, hidden, cols, what),
            row_major_problem(bias_desc.get(), data_type_, hidden, 1, what + " bias")}) {
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

void CudaReplica::gather_weights(const RnnPlan& plan, const float* canonical, void* space, const char* what) {
  const dim3 grid(blocks_for(plan.longest_weight_run), plan.weight_run_count);
  if (sixteen_bit_) {
    gather_weight_runs_16<<<grid, kThreads, 0, stream_.get()>>>(plan.weight_runs.get(), canonical,
                                                                static_cast<SixteenBits*>(space), half_);
  } else {
    copy_weight_runs<<<grid, kThreads, 0, stream_.get()>>>(plan.weight_runs.get(), canonical,
                                                           static_cast<float*>(space), true);
  }
  DDP_CUDA_CHECK_LAUNCH(what);
}

void CudaReplica::scatter_weights(const RnnPlan& plan, const void* space, float* canonical, float scale,
                                  const char* what) {
  const dim3 grid(blocks_for(plan.longest_weight_run), plan.weight_run_count);
  if (sixteen_bit_) {
    scatter_weight_runs_16<<<grid, kThreads, 0, stream_.get()>>>(
        plan.weight_runs.get(), static_cast<const SixteenBits*>(space), canonical, half_, scale);
  } else {
    copy_weight_runs<<<grid, kThreads, 0, stream_.get()>>>(
        plan.weight_runs.get(), static_cast<const float*>(space), canonical, false);
  }
  DDP_CUDA_CHECK_LAUNCH(what);
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
    gather_weights(*plan, params_.get(), plan->weight_space.get(), "copy_weight_runs (mapping check)");
    scatter_weights(*plan, plan->weight_space.get(), back.get(), 1.0f, "copy_weight_runs (mapping check)");
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(received.data(), back.get(), back.bytes(), cudaMemcpyDeviceToHost, stream_.get()));
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    for (std::size_t i = 0; i < total; ++i) {
      const bool lstm = i >= lstm_begin && i < lstm_end;
      const bool untouched = std::isnan(received[i]);
      // A 16-bit space keeps each parameter rounded to nearest even, as the host rounds it.
      const float expected = half_          ? half_to_float(float_to_half(sent[i]))
                             : sixteen_bit_ ? bfloat16_to_float(float_to_bfloat16(sent[i]))
                                            : sent[i];
      if (lstm ? std::memcmp(&received[i], &expected, sizeof(float)) == 0 : untouched) continue;
      const ParamTensor* tensor = nullptr;
      for (const ParamTensor& t : layout_.tensors()) {
        if (i >= t.offset && i < t.offset + t.size()) tensor = &t;
      }
      const std::string where = (tensor != nullptr ? tensor->name : std::string("?")) + "[" +
                                std::to_string(tensor != nullptr ? i - tensor->offset : i) + "]";
      return std::string("canonical -> cuDNN ") + cudnn_algorithm_name(plan->algorithm) +
             " weight space -> canonical: " + where +
             (lstm
                  ? " came back as " + std::to_string(received[i]) + " instead of " + std::to_string(expected)
                  : " was written, but it is not a recurrent layer's weight");
    }
  }
  return "";
}

}  // namespace ddp::models::cudnn_replica

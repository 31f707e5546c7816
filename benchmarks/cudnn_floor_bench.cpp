// The floor of a GPU training step: cuDNN's LSTM (or GRU, either direction) alone (cudnnRNNForward in
// training mode, cudnnRNNBackwardData_v8, zeroing the weight gradients, cudnnRNNBackwardWeights_v8) on one
// batch, set up as the cuDNN replica sets it up, timed with CUDA events over many iterations. Everything else
// a step does (embedding, dense layer, loss, weight gather/scatter, gradient exchange, optimizer) comes on
// top.
//
// Prints "floor_ms <mean ms per step>" (read by gpu_epoch_compare.py) and, with --replica, "replica_ms <mean
// ms per train_step>" of the cuDNN replica on the same shapes and algorithm for comparison. --algo picks
// cuDNN's RNN algorithm (as model.cudnn_rnn_algo; auto is not taken: name one); one that cuDNN turns down
// exits 3 with "unsupported" and cuDNN's status.
//
//   build/benchmarks/cudnn_floor_bench --batch 32 [--seq 80 --embed 128 --hidden 128 --layers 1]
//   build/benchmarks/cudnn_floor_bench --batch 256 --math default --algo persist_small_h --replica
//   build/benchmarks/cudnn_floor_bench --batch 32 --io packed     # the layout PyTorch uses
//   build/benchmarks/cudnn_floor_bench --batch 128 --seq 200 --cell gru --bidirectional
//   build/benchmarks/cudnn_floor_bench --batch 128 --data bf16 --replica   # model.precision = bf16 (or fp16)
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/float16.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/replica.h"

namespace po = boost::program_options;

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    std::fprintf(stderr, "cudnn_floor_bench: %s: %s\n", what, cudaGetErrorString(status));
    std::exit(1);
  }
}

void check(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    std::fprintf(stderr, "cudnn_floor_bench: %s: %s\n", what, cudnnGetErrorString(status));
    std::exit(1);
  }
}

#define CHECK(call) check((call), #call)

// For the calls whose support depends on the algorithm: a refusal is no failure of the benchmark.
void check_supported(cudnnStatus_t status, const char* what) {
  const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(status));
  // As the replica: a persistent kernel that cannot launch here, on a healthy device, is a refusal too.
  bool could_not_run = false;
  if (category == CUDNN_STATUS_EXECUTION_FAILED) {
    cudaGetLastError();  // a launch failure is not sticky
    could_not_run = cudaDeviceSynchronize() == cudaSuccess;
  }
  if (category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM || could_not_run) {
    std::printf("unsupported: %s: %s\n", what, cudnnGetErrorString(status));
    std::exit(3);
  }
  check(status, what);
}

#define CHECK_SUPPORTED(call) check_supported((call), #call)

struct Options {
  int batch = 32, seq = 80, embed = 128, hidden = 128, layers = 1, vocab = 20000;
  int warmup = 10, iters = 50;
  std::string math = "fma";
  std::string data = "float";  // float, bf16 or fp16 (16-bit data and weights, tensor-op math)
  std::string algo = "standard";
  std::string io = "padded";
  std::string cell = "lstm";
  bool bidirectional = false;
  bool replica = false;

  int directions() const { return bidirectional ? 2 : 1; }
  bool sixteen() const { return data == "bf16" || data == "fp16"; }
  std::size_t element_bytes() const { return sixteen() ? sizeof(uint16_t) : sizeof(float); }
};

std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
  return p;
}

// Uniform(-0.1, 0.1) floats, or their bfloat16 or half bits (`data`), into device memory.
void fill_random(void* device, std::size_t count, uint64_t seed, const std::string& data) {
  const bool bf16 = data == "bf16";
  const bool sixteen = bf16 || data == "fp16";
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-0.1f, 0.1f);
  std::vector<float> host(count);
  for (auto& x : host) x = dist(rng);
  std::vector<uint16_t> bits;
  if (sixteen) {
    for (const float x : host) bits.push_back(bf16 ? ddp::float_to_bfloat16(x) : ddp::float_to_half(x));
  }
  CHECK(cudaMemcpy(device, sixteen ? static_cast<const void*>(bits.data()) : host.data(),
                   count * (sixteen ? sizeof(uint16_t) : sizeof(float)), cudaMemcpyHostToDevice));
  // From pageable memory the copy may return before its DMA lands; the stream below is non-blocking.
  CHECK(cudaDeviceSynchronize());
}

double floor_ms(const Options& o) {
  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudnnHandle_t handle = nullptr;
  CHECK(cudnnCreate(&handle));
  CHECK(cudnnSetStream(handle, stream));
  cudnnDropoutDescriptor_t dropout = nullptr;
  CHECK(cudnnCreateDropoutDescriptor(&dropout));
  CHECK(cudnnSetDropoutDescriptor(dropout, handle, 0.0f, nullptr, 0,
                                  0));  // 16 bits as the replica sets them up (model.precision = bf16, fp16):
                                        // tensor-op math, float32 mathPrec.
  const cudnnMathType_t math = o.sixteen()           ? CUDNN_TENSOR_OP_MATH
                               : o.math == "default" ? CUDNN_DEFAULT_MATH
                               : o.math == "tensor"  ? CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
                                                     : CUDNN_FMA_MATH;
  const cudnnDataType_t data = o.data == "bf16"   ? CUDNN_DATA_BFLOAT16
                               : o.data == "fp16" ? CUDNN_DATA_HALF
                                                  : CUDNN_DATA_FLOAT;
  const ddp::models::RnnAlgorithm requested = ddp::models::parse_rnn_algorithm(o.algo, "--algo");
  const cudnnRNNAlgo_t algo =
      requested == ddp::models::RnnAlgorithm::kPersistStaticSmallH ? CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H
      : requested == ddp::models::RnnAlgorithm::kPersistStatic     ? CUDNN_RNN_ALGO_PERSIST_STATIC
                                                                   : CUDNN_RNN_ALGO_STANDARD;
  // The replica runs padded I/O (masked sequences are shorter than T); packed, with every length T, is the
  // same bytes with padded I/O off, as PyTorch runs it: measured equal (benchmarks/RESULTS.md).
  const bool padded = o.io == "padded";
  const cudnnRNNDataLayout_t layout =
      padded ? CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED : CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_PACKED;
  cudnnRNNDescriptor_t rnn = nullptr;
  CHECK(cudnnCreateRNNDescriptor(&rnn));
  CHECK_SUPPORTED(cudnnSetRNNDescriptor_v8(
      rnn, algo, o.cell == "gru" ? CUDNN_GRU : CUDNN_LSTM, CUDNN_RNN_DOUBLE_BIAS,
      o.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL, CUDNN_LINEAR_INPUT, data,
      CUDNN_DATA_FLOAT, math, o.embed, o.hidden, o.hidden, o.layers, dropout,
      padded ? CUDNN_RNN_PADDED_IO_ENABLED : CUDNN_RNN_PADDED_IO_DISABLED));

  const std::vector<int> lengths(to_size(o.batch), o.seq);
  cudnnRNNDataDescriptor_t x_desc = nullptr;
  cudnnRNNDataDescriptor_t y_desc = nullptr;
  CHECK(cudnnCreateRNNDataDescriptor(&x_desc));
  CHECK(cudnnCreateRNNDataDescriptor(&y_desc));
  CHECK(cudnnSetRNNDataDescriptor(x_desc, data, layout, o.seq, o.batch, o.embed, lengths.data(), nullptr));
  // y holds both directions' outputs side by side.
  const int y_width = o.directions() * o.hidden;
  CHECK(cudnnSetRNNDataDescriptor(y_desc, data, layout, o.seq, o.batch, y_width, lengths.data(), nullptr));
  cudnnTensorDescriptor_t state = nullptr;
  CHECK(cudnnCreateTensorDescriptor(&state));
  const int dims[3] = {o.layers * o.directions(), o.batch, o.hidden};
  const int strides[3] = {o.batch * o.hidden, o.hidden, 1};
  CHECK(cudnnSetTensorNdDescriptor(state, data, 3, dims, strides));

  std::size_t weight_bytes = 0, work_bytes = 0, reserve_bytes = 0;
  CHECK_SUPPORTED(cudnnGetRNNWeightSpaceSize(handle, rnn, &weight_bytes));
  CHECK_SUPPORTED(
      cudnnGetRNNTempSpaceSizes(handle, rnn, CUDNN_FWD_MODE_TRAINING, x_desc, &work_bytes, &reserve_bytes));
  const std::size_t rows = to_size(o.seq) * to_size(o.batch);
  void* weights = device_alloc(weight_bytes);
  void* d_weights = device_alloc(weight_bytes);
  void* work = device_alloc(work_bytes);
  void* reserve = device_alloc(reserve_bytes);
  void* x = device_alloc(rows * to_size(o.embed) * o.element_bytes());
  void* dx = device_alloc(rows * to_size(o.embed) * o.element_bytes());
  void* y = device_alloc(rows * to_size(y_width) * o.element_bytes());
  void* dy = device_alloc(rows * to_size(y_width) * o.element_bytes());
  auto* seq_lengths = static_cast<int32_t*>(device_alloc(lengths.size() * sizeof(int32_t)));
  CHECK(cudaMemcpy(seq_lengths, lengths.data(), lengths.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());  // as in fill_random
  fill_random(weights, weight_bytes / o.element_bytes(), 1, o.data);
  fill_random(x, rows * to_size(o.embed), 2, o.data);
  fill_random(dy, rows * to_size(y_width), 3, o.data);

  auto step = [&] {
    CHECK_SUPPORTED(cudnnRNNForward(handle, rnn, CUDNN_FWD_MODE_TRAINING, seq_lengths, x_desc, x, y_desc, y,
                                    state, nullptr, nullptr, state, nullptr, nullptr, weight_bytes, weights,
                                    work_bytes, work, reserve_bytes, reserve));
    CHECK_SUPPORTED(cudnnRNNBackwardData_v8(handle, rnn, seq_lengths, y_desc, y, dy, x_desc, dx, state,
                                            nullptr, nullptr, nullptr, state, nullptr, nullptr, nullptr,
                                            weight_bytes, weights, work_bytes, work, reserve_bytes, reserve));
    CHECK(cudaMemsetAsync(d_weights, 0, weight_bytes, stream));
    CHECK_SUPPORTED(cudnnRNNBackwardWeights_v8(handle, rnn, CUDNN_WGRAD_MODE_ADD, seq_lengths, x_desc, x,
                                               state, nullptr, y_desc, y, weight_bytes, d_weights, work_bytes,
                                               work, reserve_bytes, reserve));
  };
  for (int i = 0; i < o.warmup; ++i) step();
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < o.iters; ++i) step();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  std::printf("cuDNN %s%s: weight space %zu B, workspace %zu B, reserve %zu B\n",
              o.bidirectional ? "bidirectional " : "", o.cell == "gru" ? "GRU" : "LSTM", weight_bytes,
              work_bytes, reserve_bytes);

  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  for (void* p : {weights, d_weights, work, reserve, x, dx, y, dy, static_cast<void*>(seq_lengths)}) {
    CHECK(cudaFree(p));
  }
  CHECK(cudnnDestroyTensorDescriptor(state));
  CHECK(cudnnDestroyRNNDataDescriptor(x_desc));
  CHECK(cudnnDestroyRNNDataDescriptor(y_desc));
  CHECK(cudnnDestroyRNNDescriptor(rnn));
  CHECK(cudnnDestroyDropoutDescriptor(dropout));
  CHECK(cudnnDestroy(handle));
  CHECK(cudaStreamDestroy(stream));
  return static_cast<double>(ms) / o.iters;
}

// The cuDNN replica's train_step on the same shapes (random tokens and labels, Keras initialization).
double replica_ms(const Options& o) {
  ddp::models::ModelShape shape{o.vocab, o.embed, o.hidden, o.layers};
  shape.cell = o.cell == "gru" ? ddp::models::Cell::kGru : ddp::models::Cell::kLstm;
  shape.bidirectional = o.bidirectional;
  ddp::models::ModelOptions options;
  options.precision = o.data == "fp16"      ? ddp::models::Precision::kFp16
                      : o.data == "bf16"    ? ddp::models::Precision::kBf16
                      : o.math == "default" ? ddp::models::Precision::kTf32
                                            : ddp::models::Precision::kFp32;
  auto replica =
      ddp::models::make_cuda_replica(shape, 0, ddp::models::parse_rnn_algorithm(o.algo, "--algo"), options);
  std::vector<float> params(replica->layout().total_size());
  ddp::models::initialize_keras(replica->layout(), params, 1);
  replica->copy_params_from_host(params);
  std::mt19937_64 rng(4);
  std::vector<int32_t> tokens(to_size(o.batch) * to_size(o.seq));
  std::vector<float> labels(to_size(o.batch));
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(o.vocab));
  for (auto& y : labels) y = static_cast<float>(rng() % 2);
  auto* device_tokens = static_cast<int32_t*>(device_alloc(tokens.size() * sizeof(int32_t)));
  auto* device_labels = static_cast<float*>(device_alloc(labels.size() * sizeof(float)));
  CHECK(cudaMemcpy(device_tokens, tokens.data(), tokens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(device_labels, labels.data(), labels.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());  // as in fill_random
  const ddp::BatchView batch{device_tokens, device_labels, o.batch, o.seq};

  auto stream = static_cast<cudaStream_t>(replica->stream());
  for (int i = 0; i < o.warmup; ++i) replica->train_step(batch, {});
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < o.iters; ++i) replica->train_step(batch, {});
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  replica->take_stats();
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaFree(device_tokens));
  CHECK(cudaFree(device_labels));
  return static_cast<double>(ms) / o.iters;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  po::options_description desc("cudnn_floor_bench");
  desc.add_options()("help", "this text")("batch", po::value(&o.batch)->default_value(o.batch))(
      "seq", po::value(&o.seq)->default_value(o.seq))("embed", po::value(&o.embed)->default_value(o.embed))(
      "hidden", po::value(&o.hidden)->default_value(o.hidden))("layers",
                                                               po::value(&o.layers)->default_value(o.layers))(
      "vocab", po::value(&o.vocab)->default_value(o.vocab), "for --replica")(
      "warmup", po::value(&o.warmup)->default_value(o.warmup))("iters",
                                                               po::value(&o.iters)->default_value(o.iters))(
      "math", po::value(&o.math)->default_value(o.math),
      "the floor's cuDNN math: fma (fp32, as the replica), default (TF32 allowed on sm_80+) or tensor "
      "(tensor cores, fp32 data converted down)")(
      "data", po::value(&o.data)->default_value(o.data),
      "the data and weights' type: float, bf16 or fp16 (16 bits with tensor-op math, as model.precision)")(
      "algo", po::value(&o.algo)->default_value(o.algo),
      "cuDNN's RNN algorithm: standard, persist_small_h or persist_static (the replica's too)")(
      "io", po::value(&o.io)->default_value(o.io),
      "the floor's data layout: padded (padded I/O on, as the replica runs) or packed (every length "
      "T, padded I/O off, as PyTorch runs)")("cell", po::value(&o.cell)->default_value(o.cell),
                                             "lstm or gru")(
      "bidirectional", po::bool_switch(&o.bidirectional), "both directions")(
      "replica", po::bool_switch(&o.replica), "also time the cuDNN replica's train_step");
  po::variables_map vm;
  try {
    // No guessing of abbreviated option names: a typo must not set another option.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::parse_command_line(argc, argv, desc, style), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "cudnn_floor_bench: " << e.what() << "\n" << desc;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc;
    return 0;
  }
  if (o.batch <= 0 || o.seq <= 0 || o.embed <= 0 || o.hidden <= 0 || o.layers <= 0 || o.iters <= 0 ||
      o.warmup < 0 || (o.math != "fma" && o.math != "default" && o.math != "tensor") ||
      (o.data != "float" && o.data != "bf16" && o.data != "fp16") || o.algo == "auto" ||
      (o.io != "packed" && o.io != "padded") || (o.cell != "lstm" && o.cell != "gru")) {
    std::cerr << "cudnn_floor_bench: every size must be positive, --math one of fma, default, tensor, --data "
                 "float, "
                 "bf16 or fp16, --io packed or padded, --cell lstm or gru and --algo a named algorithm\n";
    return 2;
  }
  try {
    ddp::models::parse_rnn_algorithm(o.algo, "--algo");
  } catch (const ddp::UserError& e) {
    std::cerr << "cudnn_floor_bench: " << e.what() << "\n";
    return 2;
  }
  int devices = 0;
  CHECK(cudaGetDeviceCount(&devices));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "GPU %s, cuDNN %zu, %s%s, batch %d, seq %d, embed %d, hidden %d, layers %d, math %s, algo %s, io %s, "
      "%d iterations\n",
      prop.name, cudnnGetVersion(), o.bidirectional ? "bidirectional " : "", o.cell.c_str(), o.batch, o.seq,
      o.embed, o.hidden, o.layers, o.math.c_str(), o.algo.c_str(), o.io.c_str(), o.iters);
  CHECK(cudaSetDevice(0));
  std::printf("floor_ms %.4f\n", floor_ms(o));
  if (o.replica) {
    try {
      std::printf("replica_ms %.4f\n", replica_ms(o));
    } catch (const ddp::UserError& e) {
      std::printf("unsupported: replica: %s\n", e.what());
      return 3;
    }
  }
  return 0;
}

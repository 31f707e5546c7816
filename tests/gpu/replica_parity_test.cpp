// The cuDNN replica and the CUDA optimizers against their CPU references: loss, accuracy, every gradient
// tensor and the probabilities against the CPU replica on the same parameters and batch; Adam and SGD
// against the host optimizers. (What every replica keeps, host copies and learning a toy task among it, is
// tests/replica_contract.h.) The first tests check the errors a user can meet and run anywhere; the rest
// skip where no GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "engine/device.h"
#include "engine/optimizer/optimizer.h"
#include "engine/self_check.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/param_layout.h"
#include "models/replica.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/replica_contract.h"
#include "tests/test_util.h"

namespace ddp::models {
namespace {

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// A host-to-device copy that has landed when it returns: from pageable memory cudaMemcpy may return before
// the DMA completes, and the replicas' non-blocking streams are not ordered after the default stream.
void upload(void* device, const void* host, std::size_t bytes) {
  cuda_ok(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

using testing::HostBatch;

HostBatch random_batch(int vocab, int batch, int seq, uint64_t seed) {
  return testing::contract_random_batch(vocab, batch, seq, seed);
}

// A host batch copied to the device, freed with the object.
class DeviceBatch {
 public:
  explicit DeviceBatch(const HostBatch& host)
      : host_tokens_(host.tokens), batch_(host.batch), seq_(host.seq) {
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&tokens_), host.tokens.size() * sizeof(int32_t)),
            "cudaMalloc");
    cuda_ok(cudaMalloc(reinterpret_cast<void**>(&labels_), host.labels.size() * sizeof(float)), "cudaMalloc");
    upload(tokens_, host.tokens.data(), host.tokens.size() * sizeof(int32_t));
    upload(labels_, host.labels.data(), host.labels.size() * sizeof(float));
  }
  ~DeviceBatch() {
    cudaFree(tokens_);
    cudaFree(labels_);
  }
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  BatchView view() const { return {tokens_, labels_, batch_, seq_, host_tokens_.data()}; }

 private:
  std::vector<int32_t> host_tokens_;
  int32_t* tokens_ = nullptr;
  float* labels_ = nullptr;
  int batch_ = 0;
  int seq_ = 0;
};

// The replica's gradients on the host, once its queued work is done.
std::vector<float> gradients_to_host(Replica& replica) {
  cuda_ok(cudaStreamSynchronize(static_cast<cudaStream_t>(replica.stream())), "cudaStreamSynchronize");
  std::vector<float> host(replica.grads().size());
  cuda_ok(
      cudaMemcpy(host.data(), replica.grads().data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost),
      "cudaMemcpy");
  return host;
}

// Per tensor, |gpu - cpu| <= tolerance |cpu| in the 2-norm; a tensor whose gradient is below 1e-3 (dense.b
// can nearly cancel) is held to tolerance * 1e-3 instead, float rounding being absolute there.
void expect_gradients_close(const ParamLayout& layout, const std::vector<float>& cpu,
                            const std::vector<float>& gpu, double tolerance, const std::string& context) {
  ASSERT_EQ(cpu.size(), gpu.size());
  for (const auto& tensor : layout.tensors()) {
    double diff = 0;
    double norm = 0;
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) {
      const double d = static_cast<double>(gpu[i]) - static_cast<double>(cpu[i]);
      diff += d * d;
      norm += static_cast<double>(cpu[i]) * static_cast<double>(cpu[i]);
    }
    EXPECT_GT(norm, 0.0) << context << ": " << tensor.name << " has no gradient on the CPU";
    EXPECT_LE(std::sqrt(diff), tolerance * std::max(std::sqrt(norm), 1e-3))
        << context << ": " << tensor.name << " |cpu| " << std::sqrt(norm) << " |gpu - cpu| "
        << std::sqrt(diff);
  }
}

void expect_stats_close(const BatchStats& cpu, const BatchStats& gpu, const std::string& context) {
  EXPECT_NEAR(gpu.loss_sum, cpu.loss_sum, 1e-5 * std::abs(cpu.loss_sum)) << context;
  EXPECT_EQ(gpu.correct, cpu.correct) << context;
  EXPECT_EQ(gpu.count, cpu.count) << context;
}

// --- Without a GPU
// -------------------------------------------------------------------------------------------

TEST(CudaReplica, NoGpuOrBadOrdinalIsAUserError) {
  const ModelShape shape{100, 32, 32, 1};
  if (engine::probe_gpus().gpus.empty()) {
    try {
      make_cuda_replica(shape, 0);
      FAIL() << "make_cuda_replica succeeded without a GPU";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("no GPU visible"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_THROW(make_cuda_replica(shape, 1000), UserError);
    EXPECT_THROW(make_cuda_replica(shape, -1), UserError);
  }
}

TEST(CudaOptimizer, RefusesLazyRowsAndUnknownNames) {
  optim::OptimizerSettings lazy;
  lazy.lazy_update = true;
  try {
    optim::make_cuda_optimizer(lazy, 16, 0, nullptr);
    FAIL() << "lazy rows accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("lazy is not supported on the GPU"), std::string::npos) << e.what();
  }
  optim::OptimizerSettings unknown;
  unknown.name = "adagrad";
  EXPECT_THROW(optim::make_cuda_optimizer(unknown, 16, 0, nullptr), UserError);
}

// --- With a GPU
// ----------------------------------------------------------------------------------------------

// Three train steps on different batches: a small one, then two full ones (the larger shape moves the last
// step's block of dy, so the small step's block must have been cleared; no step may keep embedding rows of
// the one before). Then evaluate and predict, on a smaller batch too (a second set of cuDNN descriptors).
// Masked and bidirectional models also get a row of padding only (one real step: sequence_mask.h) besides
// the rows with some padding every batch has. Embedding dropout draws the CPU's masks under the same key,
// which both replicas get before each step, as the trainer gives them.
struct Variant {
  Cell cell = Cell::kLstm;
  int classes = 2;
  bool bidirectional = false;
  bool masked = false;
  double embedding_dropout = 0;
};

void check_parity(int layers, RnnAlgorithm algorithm, Variant variant = {}) {
  ModelShape shape{100, 32, 32, layers};
  shape.cell = variant.cell;
  shape.classes = variant.classes;
  shape.bidirectional = variant.bidirectional;
  ModelOptions options;
  options.mask_padding = variant.masked;
  options.embedding_dropout = variant.embedding_dropout;
  // Labels of every class.
  auto batch_of = [&](int vocab, int batch, int seq, uint64_t seed) {
    HostBatch host = testing::contract_random_batch(vocab, batch, seq, seed);
    for (std::size_t b = 0; b < host.labels.size(); ++b)
      host.labels[b] = static_cast<float>((b * 7 + seed) % to_size(variant.classes));
    if (variant.masked && batch > 1) std::fill_n(host.tokens.begin() + seq, seq, 0);
    return host;
  };
  auto cpu = make_cpu_replica(shape, CpuKernels::kBuiltin, options);
  auto gpu = make_cuda_replica(shape, 0, algorithm, options);
  const ParamLayout& layout = cpu->layout();
  const std::vector<float> params = ddp::testing::test_params(layout, 11 + static_cast<uint64_t>(layers));
  cpu->copy_params_from_host(params);
  gpu->copy_params_from_host(params);
  const std::string context =
      rnn_algorithm_name(algorithm) + ", " + describe(shape) + (variant.masked ? ", masked" : "");

  const int step_batches[] = {7, 16, 16};
  for (int step = 0; step < 3; ++step) {
    const HostBatch host =
        batch_of(shape.vocab_size, step_batches[step], 20, 100 + static_cast<uint64_t>(step));
    const DeviceBatch device(host);
    std::vector<std::string> cpu_order;
    std::vector<std::string> gpu_order;
    cpu->set_dropout_key(1000 + static_cast<uint64_t>(step));
    gpu->set_dropout_key(1000 + static_cast<uint64_t>(step));
    cpu->train_step(host.view(), [&](const ParamSegment& s) { cpu_order.push_back(s.name); });
    gpu->train_step(device.view(), [&](const ParamSegment& s) { gpu_order.push_back(s.name); });
    // Both report every segment once; the GPU back to front (cuDNN's weight gradients of every layer come
    // from one call), the CPU its embedding before its first layer's weights. AllReduceStep starts the
    // reductions in one order whatever the replica's.
    std::vector<std::string> back_to_front;
    for (const ParamSegment& segment : layout.segments())
      back_to_front.insert(back_to_front.begin(), segment.name);
    EXPECT_EQ(gpu_order, back_to_front) << context;
    std::sort(cpu_order.begin(), cpu_order.end());
    std::sort(back_to_front.begin(), back_to_front.end());
    EXPECT_EQ(cpu_order, back_to_front) << context;
    const std::string at = context + ", step " + std::to_string(step);
    expect_stats_close(cpu->take_stats(), gpu->take_stats(), at);
    expect_gradients_close(layout, std::vector<float>(cpu->grads().begin(), cpu->grads().end()),
                           gradients_to_host(*gpu), 1e-4, at);
  }

  for (const int batch : {16, 5}) {
    const HostBatch host = batch_of(shape.vocab_size, batch, 20, 200 + static_cast<uint64_t>(batch));
    const DeviceBatch device(host);
    const std::string at = context + ", evaluate batch " + std::to_string(batch);
    cpu->evaluate(host.view());
    gpu->evaluate(device.view());
    expect_stats_close(cpu->take_stats(), gpu->take_stats(), at);

    std::vector<float> cpu_p(to_size(batch) * to_size(shape.outputs()));
    std::vector<float> gpu_p(cpu_p.size());
    cpu->predict(host.view(), cpu_p);
    gpu->predict(device.view(), gpu_p);
    for (std::size_t b = 0; b < cpu_p.size(); ++b) {
      EXPECT_NEAR(gpu_p[b], cpu_p[b], 1e-5f) << at << ", sample " << b;
    }
  }
}

TEST(CudaReplica, MatchesTheCpuReplicaOneLayer) {
  DDP_REQUIRE_GPU();
  check_parity(1, RnnAlgorithm::kStandard);
}

TEST(CudaReplica, MatchesTheCpuReplicaTwoLayers) {
  DDP_REQUIRE_GPU();
  check_parity(2, RnnAlgorithm::kStandard);
}

// A GRU (cuDNN's reset gate on the recurrent product, gates r, z, n as the canonical layout) and a softmax
// over three classes, one and two layers.
TEST(CudaReplica, MatchesTheCpuReplicaGruAndThreeClasses) {
  DDP_REQUIRE_GPU();
  check_parity(1, RnnAlgorithm::kStandard, {Cell::kGru});
  check_parity(2, RnnAlgorithm::kStandard, {Cell::kGru, 3});
  check_parity(2, RnnAlgorithm::kStandard, {Cell::kLstm, 3});
}

// Per-sample lengths (the embedding shifted, cuDNN's data descriptors and device lengths) and both
// directions' final states into the dense layer, against the CPU replica's masking; auto must pick the
// standard algorithm for a masked model.
TEST(CudaReplica, MatchesTheCpuReplicaMaskedAndBidirectional) {
  DDP_REQUIRE_GPU();
  check_parity(1, RnnAlgorithm::kAuto, {Cell::kLstm, 2, false, true});
  check_parity(1, RnnAlgorithm::kStandard, {Cell::kLstm, 2, true, true});
  check_parity(2, RnnAlgorithm::kStandard, {Cell::kGru, 3, true, true});
  check_parity(2, RnnAlgorithm::kStandard, {Cell::kLstm, 2, true, false});
}

// The whole family, one shape each: cell x direction x masking x depth (the tests above pick combinations;
// this one leaves none out), two classes on one layer and four on two.
TEST(CudaReplica, MatchesTheCpuReplicaInEveryVariant) {
  DDP_REQUIRE_GPU();
  for (const Cell cell : {Cell::kLstm, Cell::kGru})
    for (const bool bidirectional : {false, true})
      for (const bool masked : {false, true})
        for (const int layers : {1, 2})
          check_parity(layers, RnnAlgorithm::kStandard, {cell, layers == 1 ? 2 : 4, bidirectional, masked});
}

TEST(CudaReplica, APersistentAlgorithmForAMaskedModelIsAUserError) {
  DDP_REQUIRE_GPU();
  const ModelShape shape{100, 32, 32, 1};
  ModelOptions masked;
  masked.mask_padding = true;
  EXPECT_THROW(make_cuda_replica(shape, 0, RnnAlgorithm::kPersistStaticSmallH, masked), UserError);
}

// The embedding's dropout masks are the CPU replica's (dropout.h, indexed by the CPU's unshifted rows even
// when the GPU shifts masked sequences), so the whole step still matches.
TEST(CudaReplica, EmbeddingDropoutDropsWhatTheCpuDrops) {
  DDP_REQUIRE_GPU();
  check_parity(1, RnnAlgorithm::kStandard, {Cell::kLstm, 2, false, false, 0.3});
  check_parity(2, RnnAlgorithm::kStandard, {Cell::kGru, 3, true, true, 0.3});
}

// cuDNN's dropout between stacked layers: a training step differs from the same model's without dropout
// and from its own next step on the same batch (another mask), while evaluation drops nothing and equals
// the model without dropout.
TEST(CudaReplica, DropoutBetweenLayersActsInTrainingOnly) {
  DDP_REQUIRE_GPU();
  const ModelShape shape{100, 32, 32, 2};
  ModelOptions dropping;
  dropping.dropout = 0.5;
  auto with = make_cuda_replica(shape, 0, RnnAlgorithm::kStandard, dropping);
  auto without = make_cuda_replica(shape, 0, RnnAlgorithm::kStandard);
  const std::vector<float> params = ddp::testing::test_params(with->layout(), 17);
  with->copy_params_from_host(params);
  without->copy_params_from_host(params);
  const HostBatch host = testing::contract_random_batch(shape.vocab_size, 16, 20, 5);
  const DeviceBatch device(host);

  with->set_dropout_key(1);
  without->set_dropout_key(1);
  with->train_step(device.view(), {});
  const std::vector<float> first = gradients_to_host(*with);
  with->set_dropout_key(2);
  with->train_step(device.view(), {});
  const std::vector<float> second = gradients_to_host(*with);
  without->train_step(device.view(), {});
  const std::vector<float> plain = gradients_to_host(*without);
  EXPECT_NE(first, plain) << "dropout 0.5 between the layers changed no gradient";
  EXPECT_NE(first, second) << "two steps drew the same dropout mask";
  with->take_stats();
  without->take_stats();

  with->evaluate(device.view());
  without->evaluate(device.view());
  const BatchStats evaluated = with->take_stats();
  const BatchStats reference = without->take_stats();
  EXPECT_NEAR(evaluated.loss_sum, reference.loss_sum, 1e-6 * std::abs(reference.loss_sum));
  EXPECT_EQ(evaluated.correct, reference.correct);
}

// cuDNN's dropout state between layers goes into checkpoints (rng_state): a replica that restores another's
// saved state draws the masks that one draws next, where a replica seeded from the key draws others; bytes
// from elsewhere are turned down, and a model without that dropout has no state to save.
TEST(CudaReplica, ARestoredDropoutStateDrawsTheMasksTheSavedOneWouldHave) {
  DDP_REQUIRE_GPU();
  const ModelShape shape{100, 32, 32, 2};
  ModelOptions dropping;
  dropping.dropout = 0.5;
  auto saving = make_cuda_replica(shape, 0, RnnAlgorithm::kStandard, dropping);
  auto restoring = make_cuda_replica(shape, 0, RnnAlgorithm::kStandard, dropping);
  auto seeded = make_cuda_replica(shape, 0, RnnAlgorithm::kStandard, dropping);
  const std::vector<float> params = ddp::testing::test_params(saving->layout(), 17);
  // As the trainer does before its first step and before it restores a state: the batch shape's cuDNN calls
  // are tried on scratch buffers (which draw from the dropout state) and settled.
  for (Replica* r : {saving.get(), restoring.get(), seeded.get()}) {
    r->copy_params_from_host(params);
    r->settle_shape(16, 20, r->try_shape(16, 20));
  }
  const HostBatch host = testing::contract_random_batch(shape.vocab_size, 16, 20, 5);
  const DeviceBatch device(host);

  saving->set_dropout_key(1);
  saving->train_step(device.view(), {});  // the state runs on past its seed
  const std::string saved = saving->rng_state();
  ASSERT_FALSE(saved.empty());
  saving->set_dropout_key(2);
  saving->train_step(device.view(), {});
  const std::vector<float> expected = gradients_to_host(*saving);

  EXPECT_FALSE(restoring->restore_rng_state("not a dropout state"));
  EXPECT_FALSE(restoring->restore_rng_state(saved.substr(0, saved.size() - 1)));
  ASSERT_TRUE(restoring->restore_rng_state(saved));
  restoring->set_dropout_key(2);
  restoring->train_step(device.view(), {});
  seeded->set_dropout_key(2);
  seeded->train_step(device.view(), {});
  const std::vector<float> restored = gradients_to_host(*restoring);
  const std::vector<float> fresh = gradients_to_host(*seeded);
  double restored_error = 0;
  double fresh_error = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    restored_error = std::max(restored_error, std::abs(static_cast<double>(restored[i]) - expected[i]));
    fresh_error = std::max(fresh_error, std::abs(static_cast<double>(fresh[i]) - expected[i]));
  }
  EXPECT_LT(restored_error, 1e-6) << "the restored state drew other masks";
  EXPECT_GT(fresh_error, 1e-4) << "a state seeded from the key drew the saved state's masks";
  EXPECT_TRUE(make_cuda_replica(shape, 0)->rng_state().empty());
}

// Auto picks the persistent small-hidden algorithm here (hidden 32), or falls back to the standard one if
// cuDNN turns it down; either way the results are the CPU's.
TEST(CudaReplica, MatchesTheCpuReplicaWithTheAutomaticAlgorithm) {
  DDP_REQUIRE_GPU();
  check_parity(1, RnnAlgorithm::kAuto);
}

// Asked for by name, the persistent small-hidden algorithm runs or is a UserError saying cuDNN turned it
// down (then this test is skipped with that reason: the algorithm is not there to check).
TEST(CudaReplica, PersistentSmallHiddenMatchesTheCpuReplica) {
  DDP_REQUIRE_GPU();
  for (const int layers : {1, 2}) {
    try {
      check_parity(layers, RnnAlgorithm::kPersistStaticSmallH);
    } catch (const UserError& e) {
      ASSERT_NE(std::string(e.what()).find("turned it down"), std::string::npos) << e.what();
      GTEST_SKIP() << e.what();
    }
  }
}

TEST(CudaReplica, ReportsTokensOutsideTheVocabulary) {
  DDP_REQUIRE_GPU();
  const ModelShape shape{10, 8, 8, 1};
  auto replica = make_cuda_replica(shape, 0);
  HostBatch host = random_batch(shape.vocab_size, 4, 6, 5);
  host.tokens[7] = shape.vocab_size;
  const DeviceBatch device(host);
  replica->evaluate(device.view());
  EXPECT_THROW(replica->take_stats(), std::out_of_range);
  // The flag is cleared once reported.
  const HostBatch good = random_batch(shape.vocab_size, 4, 6, 6);
  const DeviceBatch good_device(good);
  replica->evaluate(good_device.view());
  EXPECT_EQ(replica->take_stats().count, 4);
}

// --- The CUDA optimizers
// -------------------------------------------------------------------------------------

// `n` elements `offset` floats into device buffers (offset 1: the unaligned scalar path; 0: float4 + tail).
void check_optimizer(const optim::OptimizerSettings& settings, std::size_t n, std::size_t offset) {
  cudaStream_t stream = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  float* device_params = nullptr;
  float* device_grads = nullptr;
  cuda_ok(cudaMalloc(reinterpret_cast<void**>(&device_params), (n + offset) * sizeof(float)), "cudaMalloc");
  cuda_ok(cudaMalloc(reinterpret_cast<void**>(&device_grads), (n + offset) * sizeof(float)), "cudaMalloc");
  const std::string context =
      settings.name + ", n " + std::to_string(n) + ", offset " + std::to_string(offset);
  {
    std::mt19937_64 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> host_params(n);
    for (auto& p : host_params) p = normal(rng);
    upload(device_params + offset, host_params.data(), n * sizeof(float));
    auto host = optim::make_optimizer(settings, n);
    auto gpu = optim::make_cuda_optimizer(settings, n, 0, stream);
    EXPECT_EQ(gpu->name(), host->name());
    const std::span<float> gpu_params(device_params + offset, n);
    const std::span<const float> gpu_grads(device_grads + offset, n);
    std::vector<float> grads(n);
    auto one_step = [&](optim::Optimizer& cuda_optimizer) {
      for (auto& g : grads) g = 0.1f * normal(rng);
      // The last step's kernel may still read the gradients: wait before overwriting them.
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      upload(device_grads + offset, grads.data(), n * sizeof(float));
      if (settings.clip_norm > 0) {
        host->step_clipped(host_params, grads, nullptr, settings.clip_norm);
        cuda_optimizer.step_clipped(gpu_params, gpu_grads, nullptr, settings.clip_norm);
      } else {
        host->step(host_params, grads);
        cuda_optimizer.step(gpu_params, gpu_grads);
      }
    };
    // Both sides round every operation on its own (optimizer.cpp is built without FMA contraction), so they
    // agree to the last bit.
    auto expect_params_equal = [&](const std::string& when) {
      cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      std::vector<float> back(n);
      cuda_ok(cudaMemcpy(back.data(), device_params + offset, n * sizeof(float), cudaMemcpyDeviceToHost),
              "cudaMemcpy");
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (back[i] != host_params[i]) ++bad;
      }
      EXPECT_EQ(bad, 0u) << context << ", " << when;
    };

    for (int step = 0; step < 5; ++step) one_step(*gpu);
    expect_params_equal("after 5 steps");

    const ddp::OptimizerState host_state = host->state();
    const ddp::OptimizerState gpu_state = gpu->state();
    EXPECT_EQ(gpu_state.iterations, host_state.iterations) << context;
    ASSERT_EQ(gpu_state.buffers.size(), host_state.buffers.size()) << context;
    for (std::size_t b = 0; b < host_state.buffers.size(); ++b) {
      EXPECT_EQ(gpu_state.buffers[b].first, host_state.buffers[b].first) << context;
      ASSERT_EQ(gpu_state.buffers[b].second.size(), n) << context;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(gpu_state.buffers[b].second[i], host_state.buffers[b].second[i])
            << context << ", " << gpu_state.buffers[b].first << "[" << i << "]";
      }
    }

    // A fresh optimizer that loads the state continues exactly where the first one was.
    auto resumed = optim::make_cuda_optimizer(settings, n, 0, stream);
    resumed->load_state(gpu_state);
    one_step(*resumed);
    expect_params_equal("after resuming");

    ddp::OptimizerState wrong = gpu_state;
    wrong.buffers.front().first = "nonsense";
    EXPECT_THROW(resumed->load_state(wrong), UserError) << context;
    wrong = gpu_state;
    wrong.buffers.front().second.resize(n + 1);
    EXPECT_THROW(resumed->load_state(wrong), UserError) << context;
    cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  cudaFree(device_params);
  cudaFree(device_grads);
  cudaStreamDestroy(stream);
}

TEST(CudaOptimizer, AdamMatchesTheHostAdam) {
  DDP_REQUIRE_GPU();
  optim::OptimizerSettings settings;
  settings.name = "adam";
  settings.learning_rate = 0.01;
  for (const std::size_t offset : {0u, 1u}) check_optimizer(settings, 10007, offset);
}

// Clipping: the GPU's squared norm follows the host loop's order (gradient_clipping.h), so the scale and the
// whole update agree to the last bit, whether the norm is clipped (about 10 here, to 0.5) or not.
TEST(CudaOptimizer, ClippedStepsMatchTheHostBitForBit) {
  DDP_REQUIRE_GPU();
  for (const std::string name : {"adam", "sgd"}) {
    for (const double clip_norm : {0.5, 1000.0}) {
      optim::OptimizerSettings settings;
      settings.name = name;
      settings.learning_rate = 0.01;
      settings.momentum = 0.9;
      settings.clip_norm = clip_norm;
      for (const std::size_t offset : {0u, 1u}) check_optimizer(settings, 10007, offset);
    }
  }
}

TEST(CudaOptimizer, SgdMatchesTheHostSgd) {
  DDP_REQUIRE_GPU();
  optim::OptimizerSettings settings;
  settings.name = "sgd";
  settings.learning_rate = 0.05;
  settings.momentum = 0.9;
  for (const std::size_t offset : {0u, 1u}) check_optimizer(settings, 10007, offset);
}

}  // namespace
}  // namespace ddp::models

// --- The self-check the trainer and check-env run (engine/self_check.h) ------------------------------------

namespace ddp::engine {
namespace {

// At the IMDB model's shapes (the training batch and a short last evaluation batch), with each algorithm.
TEST(SelfCheck, PassesOnThisGpu) {
  DDP_REQUIRE_GPU();
  const std::vector<std::pair<int, int>> shapes{{32, 80}, {7, 80}};
  for (const auto algorithm : {models::RnnAlgorithm::kAuto, models::RnnAlgorithm::kStandard}) {
    for (const int layers : {1, 2}) {
      auto replica = models::make_cuda_replica({20000, 128, 128, layers}, 0, algorithm);
      for (const auto& [batch, seq] : shapes)
        replica->settle_shape(batch, seq, replica->try_shape(batch, seq));
      optim::OptimizerSettings adam;
      const SelfCheckReport report = check_gpu_replica(*replica, 0, shapes, adam, 1);
      EXPECT_TRUE(report.ok) << models::rnn_algorithm_name(algorithm) << ", layers " << layers << ": "
                             << report.failure;
      std::printf("self-check (%s, %d layer(s), %s): %s\n", models::rnn_algorithm_name(algorithm).c_str(),
                  layers, replica->recurrent_kernels().c_str(), report.summary().c_str());
    }
  }
}

// model.precision = tf32 (cuDNN may take the tensor cores on sm_80 and newer), bf16 and fp16 (16-bit data and
// weights; fp16 with loss scaling): the self-check passes within the bounds derived for each, at the IMDB
// shapes, at a larger model and on a masked bidirectional GRU. A 16-bit type a GPU or cuDNN lacks is
// skipped, saying why.
TEST(SelfCheck, PassesAtReducedPrecisionOnThisGpu) {
  DDP_REQUIRE_GPU();
  struct Case {
    models::ModelShape shape;
    std::vector<std::pair<int, int>> shapes;
    bool masked;
  };
  const std::vector<Case> cases{
      {{20000, 128, 128, 1}, {{32, 80}, {7, 80}}, false},
      {{20000, 256, 512, 2}, {{128, 200}, {3, 200}}, false},
      {{5000, 64, 128, 2, models::Cell::kGru, true, 3}, {{32, 60}}, true},
  };
  std::string skipped;
  for (const models::Precision precision :
       {models::Precision::kTf32, models::Precision::kBf16, models::Precision::kFp16}) {
    const std::string name = models::precision_name(precision);
    for (const Case& c : cases) {
      models::ModelOptions options;
      options.precision = precision;
      options.mask_padding = c.masked;
      std::unique_ptr<models::Replica> replica;
      try {
        replica = models::make_cuda_replica(c.shape, 0, models::RnnAlgorithm::kAuto, options);
      } catch (const UserError& e) {
        ASSERT_NE(precision, models::Precision::kTf32) << e.what();
        skipped = e.what();
        break;
      }
      for (const auto& [batch, seq] : c.shapes)
        replica->settle_shape(batch, seq, replica->try_shape(batch, seq));
      const SelfCheckReport report =
          check_gpu_replica(*replica, 0, c.shapes, optim::OptimizerSettings{}, 1, options);
      EXPECT_TRUE(report.ok) << name << ", hidden " << c.shape.hidden << ": " << report.failure;
      EXPECT_NE(replica->recurrent_kernels().find("(model.precision = " + name + ")"), std::string::npos)
          << replica->recurrent_kernels();
      std::printf("self-check at %s (E%d H%d L%d, %s): %s\n", name.c_str(), c.shape.embedding_dim,
                  c.shape.hidden, c.shape.layers, replica->recurrent_kernels().c_str(),
                  report.summary().c_str());
    }
  }
  if (!skipped.empty()) GTEST_SKIP() << "a 16-bit precision not run on this GPU: " << skipped;
}

// A shape settled on the standard algorithm (another rank's GPU refused the persistent one) runs there,
// says so, and still matches the CPU.
TEST(CudaReplica, ShapesSettledOnTheStandardAlgorithmMatchTheCpu) {
  DDP_REQUIRE_GPU();
  auto replica = models::make_cuda_replica({300, 32, 32, 1}, 0, models::RnnAlgorithm::kAuto);
  const bool persistent = replica->try_shape(16, 20);
  replica->settle_shape(16, 20, persistent);
  replica->settle_shape(5, 20, false);
  if (persistent) {
    EXPECT_NE(replica->recurrent_kernels().find("the standard one for batches 5 x 20"), std::string::npos)
        << replica->recurrent_kernels();
  }
  const std::vector<std::pair<int, int>> shapes{{16, 20}, {5, 20}};
  const SelfCheckReport report = check_gpu_replica(*replica, 0, shapes, optim::OptimizerSettings{}, 3);
  EXPECT_TRUE(report.ok) << report.failure;
}

}  // namespace
}  // namespace ddp::engine

// train.cuda_graph on a real GPU: steps replayed from CUDA graphs (engine/step_graph.h) train as the eager
// steps do, through the cuDNN replica, NCCL's all-reduce (one rank) and the GPU optimizer, with the batch,
// the embedding dropout's draw and the optimizer's coefficients changing at every step. Each batch holds
// every token once, so that the embedding gradient's atomics add nothing in a GPU-chosen order.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/all_reduce_step.h"
#include "engine/optimizer/optimizer.h"
#include "models/cuda_replica.h"
#include "tests/gpu/gpu_test_util.h"

namespace ddp {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

struct Variant {
  std::string name;
  models::ModelShape shape;
  models::ModelOptions options;
  double clip_norm = 0;
};

// The batches of the test, in device memory of their own each, as the prefetcher hands them over.
struct DeviceBatches {
  std::vector<int32_t*> tokens;
  std::vector<float*> labels;
  std::vector<int> rows;
  ~DeviceBatches() {
    for (int32_t* t : tokens) cudaFree(t);
    for (float* l : labels) cudaFree(l);
  }
};

constexpr int kSeq = 12;
constexpr int kSteps = 10;

TEST(StepGraph, ReplaysTheEagerStepsOnThisGpu) {
  DDP_REQUIRE_GPU();
  testing_gpu::ensure_mpi();
  ASSERT_CUDA(cudaSetDevice(0));
  std::vector<Variant> variants;
  variants.push_back({"LSTM E32 H32 (persistent where cuDNN takes it)", {1000, 32, 32, 1}, {}, 0});
  models::ModelShape gru{1000, 24, 48, 2};
  gru.cell = models::Cell::kGru;
  variants.push_back({"GRU E24 H48 L2, clipped", gru, {}, 0.05});
  models::ModelOptions dropped;
  dropped.embedding_dropout = 0.25;
  variants.push_back({"LSTM E32 H64, embedding dropout", {1000, 32, 64, 1}, dropped, 0});

  DeviceBatches batches;
  for (int k = 0; k < kSteps; ++k) {
    const int rows = k % 4 == 3 ? 3 : 8;  // every fourth batch the shorter last one
    std::vector<int32_t> tokens(static_cast<std::size_t>(rows * kSeq));
    for (std::size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int32_t>(1 + (static_cast<std::size_t>(k) * 97 + i) % 999);  // distinct
    std::vector<float> labels(static_cast<std::size_t>(rows));
    for (int r = 0; r < rows; ++r) labels[static_cast<std::size_t>(r)] = static_cast<float>((r * 3 + k) % 2);
    int32_t* device_tokens = nullptr;
    float* device_labels = nullptr;
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_tokens), tokens.size() * sizeof(int32_t)));
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_labels), labels.size() * sizeof(float)));
    batches.tokens.push_back(device_tokens);
    batches.labels.push_back(device_labels);
    batches.rows.push_back(rows);
    ASSERT_CUDA(cudaMemcpy(device_tokens, tokens.data(), tokens.size() * sizeof(int32_t), cudaMemcpyDefault));
    ASSERT_CUDA(cudaMemcpy(device_labels, labels.data(), labels.size() * sizeof(float), cudaMemcpyDefault));
  }

  for (const Variant& variant : variants) {
    SCOPED_TRACE(variant.name);
    std::vector<float> after[2];
    std::vector<engine::StepGraphs::Run> runs;
    std::vector<float> start;
    for (const bool graphed : {false, true}) {
      auto replica =
          models::make_cuda_replica(variant.shape, 0, models::RnnAlgorithm::kAuto, variant.options);
      start.resize(replica->layout().total_size());
      for (std::size_t i = 0; i < start.size(); ++i)
        start[i] = 0.02f * static_cast<float>(static_cast<int>(i % 23) - 11) / 11.0f;
      replica->copy_params_from_host(start);
      // As the trainer does before the first step: every shape of the run settled.
      for (const int rows : {8, 3}) replica->settle_shape(rows, kSeq, replica->try_shape(rows, kSeq));
      comm::HostGroup self(MPI_COMM_SELF);
      auto reducer = comm::make_nccl_reducer(self, replica->stream(), "none");
      optim::OptimizerSettings adam;
      adam.learning_rate = 0.01;
      adam.schedule = "cosine";
      adam.total_steps = kSteps;
      auto optimizer = optim::make_cuda_optimizer(adam, replica->layout().total_size(), 0, replica->stream());
      engine::AllReduceStep step(*replica, *reducer, *optimizer, /*sparse_exchange=*/false, variant.clip_norm,
                                 false, /*gpu_job=*/true, false, /*cuda_graphs=*/graphed);
      EXPECT_EQ(step.graph_note(),
                graphed ? "step in a CUDA graph per batch shape" : "eager step (train.cuda_graph = off)");
      for (int k = 0; k < kSteps; ++k) {
        replica->set_dropout_key(static_cast<uint64_t>(k) + 1);
        const auto i = static_cast<std::size_t>(k);
        step.run({batches.tokens[i], batches.labels[i], batches.rows[i], kSeq, nullptr});
        if (graphed) runs.push_back(step.last_run());
      }
      after[graphed].resize(start.size());
      replica->copy_params_to_host(after[graphed]);
      const models::BatchStats stats = replica->take_stats();
      EXPECT_EQ(stats.count, 8 * 7 + 3 * 3);
    }
    using Run = engine::StepGraphs::Run;
    EXPECT_EQ(runs, (std::vector<Run>{Run::kEager, Run::kCaptured, Run::kReplayed, Run::kEager,
                                      Run::kReplayed, Run::kReplayed, Run::kReplayed, Run::kCaptured,
                                      Run::kReplayed, Run::kReplayed}));
    double largest = 0, difference = 0, moved = 0;
    std::size_t identical = 0;
    for (std::size_t i = 0; i < start.size(); ++i) {
      largest = std::max(largest, std::abs(static_cast<double>(after[0][i])));
      difference = std::max(difference, std::abs(static_cast<double>(after[1][i]) - after[0][i]));
      moved = std::max(moved, std::abs(static_cast<double>(after[0][i]) - start[i]));
      if (after[1][i] == after[0][i]) ++identical;
    }
    EXPECT_GT(moved, 1e-3) << "the steps did not train";
    // The same kernels on the same data: equal, up to cuDNN's own reproducibility.
    EXPECT_LE(difference, 1e-6 * largest) << identical << " of " << start.size() << " parameters identical";
  }
}

}  // namespace
}  // namespace ddp

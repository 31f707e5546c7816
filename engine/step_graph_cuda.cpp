// CUDA's graphs for StepGraphs (step_graph.h): stream capture in thread-local mode, so that other threads'
// CUDA calls (the prefetcher's copies, the watchdog's queries) neither join nor break the capture.
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "engine/base/cuda_check.h"
#include "engine/base/errors.h"
#include "engine/step_graph.h"

namespace ddp::engine {
namespace {

class CudaGraphRecorder final : public GraphRecorder {
 public:
  explicit CudaGraphRecorder(cudaStream_t stream) : stream_(stream) {}
  ~CudaGraphRecorder() override {
    for (cudaGraphExec_t graph : graphs_) warn_cuda(cudaGraphExecDestroy(graph), "cudaGraphExecDestroy");
  }
  CudaGraphRecorder(const CudaGraphRecorder&) = delete;
  CudaGraphRecorder& operator=(const CudaGraphRecorder&) = delete;

  void begin_capture() override {
    DDP_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }

  std::size_t end_capture() override {
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
    if (ended != cudaSuccess) {
      // A call during the step that a capture cannot take (an allocation, a host synchronisation) shows
      // here, or at that call.
      DDP_FATAL(std::string("capturing the training step into a CUDA graph failed: ") +
                cudaGetErrorString(ended) + " (train.cuda_graph = off runs the step eagerly)");
    }
    cudaGraphExec_t exec = nullptr;
    // Each node keeps the priority of the stream it was captured on: NCCL's kernels stay ahead of the
    // backward's, which they overlap (a graph would otherwise run at the launching stream's priority).
    const cudaError_t instantiated =
        cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
    warn_cuda(cudaGraphDestroy(graph), "cudaGraphDestroy");
    if (instantiated != cudaSuccess) {
      DDP_FATAL(std::string("cudaGraphInstantiate of the training step failed: ") +
                cudaGetErrorString(instantiated) + " (train.cuda_graph = off runs the step eagerly)");
    }
    graphs_.push_back(exec);
    return graphs_.size() - 1;
  }

  void abandon_capture() noexcept override {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) cudaGraphDestroy(graph);
    (void)cudaGetLastError();  // the capture's error is the one being reported
  }

  void launch(std::size_t graph) override { DDP_CUDA_CHECK(cudaGraphLaunch(graphs_.at(graph), stream_)); }

  // A graph still running is freed when it completes (cudaGraphExecDestroy).
  void clear() override {
    for (cudaGraphExec_t graph : graphs_) DDP_CUDA_CHECK(cudaGraphExecDestroy(graph));
    graphs_.clear();
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaGraphExec_t> graphs_;
};

}  // namespace

std::unique_ptr<GraphRecorder> make_cuda_graph_recorder(void* stream) {
  return std::make_unique<CudaGraphRecorder>(static_cast<cudaStream_t>(stream));
}

}  // namespace ddp::engine

// MPI for a GPU replica: device segments are staged through pinned host memory around the MPI backend, so
// GPU ranks and CPU ranks of one job run the very same MPI collectives (same sizes, same order).
//
// start_average(): a copy stream waits on an event recorded on the compute stream (backward has written the
// segment), copies it to a pinned buffer, and the host waits for that copy before handing the buffer to the
// MPI backend's non-blocking all-reduce. The host wait is the price of simplicity: MPI cannot start on data
// that is not there yet. finish_average(): the MPI backend waits for its reductions (and scales by 1/size),
// then the averaged buffers are copied back on the copy stream and the compute stream waits on an event
// recorded after those copies; the host does not wait for them. A pinned buffer is written again only after
// a cudaStreamSynchronize of the copy stream (in the next start_average()), which orders it after its
// previous copy back.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/base/cuda_check.h"
#include "engine/base/cuda_handles.h"
#include "engine/base/errors.h"

namespace ddp::comm {
namespace {

class StagedMpiReducer final : public GradientReducer {
 public:
  StagedMpiReducer(const HostGroup& group, void* compute_stream, const MpiReducerOptions& options)
      : inner_(make_mpi_reducer(group, options)), compute_(static_cast<cudaStream_t>(compute_stream)) {
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(copy_.out(), cudaStreamNonBlocking));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(computed_.out(), cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(copied_back_.out(), cudaEventDisableTiming));
  }

  // The owners then destroy computed_, copied_back_ and copy_, in that order (see their declaration).
  ~StagedMpiReducer() override {
    warn_cuda(cudaStreamSynchronize(copy_.get()), "cudaStreamSynchronize(copy stream)");
    // Buffers still lent to a running MPI_Iallreduce (an error left a step unfinished) are leaked rather
    // than freed under MPI's feet.
    const std::size_t lent = pending_.size();
    for (std::size_t i = lent; i < buffers_.size(); ++i) {
      if (buffers_[i].data != nullptr) warn_cuda(cudaFreeHost(buffers_[i].data), "cudaFreeHost");
    }
  }

  StagedMpiReducer(const StagedMpiReducer&) = delete;
  StagedMpiReducer& operator=(const StagedMpiReducer&) = delete;

  std::string backend() const override { return "mpi"; }
  int size() const override { return inner_->size(); }

  // `segment` is device memory. With one rank the staging still runs (the MPI backend then has nothing to
  // do); a one-GPU job is better served by comm.backend = auto or nccl.
  void start_average(std::span<float> segment) override {
    if (segment.empty()) return;
    // The i-th segment of a step uses the i-th buffer: same segments every step, so no growth after step 1.
    const std::size_t i = pending_.size();
    if (i == buffers_.size()) buffers_.emplace_back();
    float* host = reserve(buffers_[i], segment.size());
    DDP_CUDA_CHECK(cudaEventRecord(computed_.get(), compute_));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), computed_.get(), 0));
    DDP_CUDA_CHECK(
        cudaMemcpyAsync(host, segment.data(), segment.size_bytes(), cudaMemcpyDeviceToHost, copy_.get()));
    DDP_CUDA_CHECK(cudaStreamSynchronize(copy_.get()));
    const std::span<float> staged(host, segment.size());
    pending_.push_back(Pending{segment, staged});
    inner_->start_average(staged);
  }

  void finish_average() override {
    if (pending_.empty()) return;
    inner_->finish_average();
    for (const Pending& p : pending_) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(p.device.data(), p.host.data(), p.device.size_bytes(),
                                     cudaMemcpyHostToDevice, copy_.get()));
    }
    DDP_CUDA_CHECK(cudaEventRecord(copied_back_.get(), copy_.get()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_back_.get(), 0));
    pending_.clear();
  }

  // A GPU replica tracks no touched rows, and the trainer turns sparse exchange off on every rank of a job
  // with a GPU rank, so the CPU ranks of a mixed job call start_average() for the embedding too: stage and
  // average the whole matrix, and return no rows (every row holds the average; the caller clears the whole
  // gradient).
  std::vector<int32_t> start_average_rows(std::span<float> matrix, std::size_t /*width*/,
                                          std::span<const int32_t> /*rows*/) override {
    start_average(matrix);
    return {};
  }

  std::optional<std::string> asynchronous_error() override { return inner_->asynchronous_error(); }

 private:
  struct PinnedBuffer {
    float* data = nullptr;
    std::size_t capacity = 0;  // floats
  };
  struct Pending {
    std::span<float> device;
    std::span<float> host;
  };

  float* reserve(PinnedBuffer& buffer, std::size_t n) {
    if (n <= buffer.capacity) return buffer.data;
    if (buffer.data != nullptr) {
      DDP_CUDA_CHECK(cudaStreamSynchronize(copy_.get()));  // its last copy back may still read it
      DDP_CUDA_CHECK(cudaFreeHost(buffer.data));
      buffer = PinnedBuffer{};
    }
    void* memory = nullptr;
    DDP_CUDA_CHECK(cudaHostAlloc(&memory, n * sizeof(float), cudaHostAllocDefault));
    buffer.data = static_cast<float*>(memory);
    buffer.capacity = n;
    return buffer.data;
  }

  std::unique_ptr<GradientReducer> inner_;  // the MPI backend, on host buffers
  cudaStream_t compute_ = nullptr;
  // Members are destroyed in reverse order, after the destructor's body has freed the pinned buffers:
  // computed_, then copied_back_, then copy_.
  cuda::Stream copy_;
  cuda::Event copied_back_;  // copies back -> compute
  cuda::Event computed_;     // compute -> copy to host
  // By hand, not owners: the destructor frees only those not lent to a running MPI_Iallreduce, and a failed
  // cudaFreeHost while one grows is fatal.
  std::vector<PinnedBuffer> buffers_;
  std::vector<Pending> pending_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_staged_mpi_reducer(const HostGroup& group, void* compute_stream,
                                                         const MpiReducerOptions& options) {
  return std::make_unique<StagedMpiReducer>(group, compute_stream, options);
}

}  // namespace ddp::comm

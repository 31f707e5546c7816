// The device input pipeline: BatchReader (prefetch thread, host memory) -> pinned slot -> copy stream ->
// device slot, over a ring of `depth` slots, with depth - 1 copies in flight ahead of the batch handed out.
//
// Batch k lives in slot k % depth. The call that hands out batch k first records "consumed" on the compute
// stream for batch k - 1 (the consumer has enqueued all its work on it by now), then tops the ring up to
// batch k + depth - 1, which reuses batch k - 1's slot:
//  - the host waits on the slot's previous "copied" event before overwriting its pinned buffers (the copy
//    that read them must be done);
//  - the copy stream waits on the slot's "consumed" event before overwriting its device buffers (the
//    compute stream must be done with the batch that used them).
// Then the compute stream waits on batch k's "copied" event; the host never waits on a copy of the batch it
// hands out. The host-side wait on "copied" of batch k - 1 is at most about depth batches behind, which is
// also what bounds how far the host runs ahead of the GPU here.
//
// Input wait = host seconds blocked in BatchReader::next() + GPU seconds the compute stream stood still on a
// "copied" event, measured by a pair of timing events around that wait and added up once they complete.
//
// Threads: next() and input_wait_seconds() are called from one thread, the one that enqueues the compute
// stream's work. The compute stream must outlive the source.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <vector>

#include "engine/base/cuda_check.h"
#include "engine/base/cuda_handles.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "io/batch_source.h"

namespace ddp::io {
namespace {

// Runs before the reader starts its thread, so a bad device fails without touching the data.
int select_device(int device) {
  const cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) {
    // The failure is not sticky but stays the last error: clear it so a later launch check does not see it.
    static_cast<void>(cudaGetLastError());
    throw UserError("device = cuda: no GPU visible as device " + std::to_string(device) + " (" +
                    cudaGetErrorString(status) + ")");
  }
  return device;
}

class DeviceBatchSource final : public BatchSource {
 public:
  DeviceBatchSource(const BatchReaderOptions& options, int device, void* compute_stream, int depth)
      : device_(select_device(device)),
        compute_(static_cast<cudaStream_t>(compute_stream)),
        rows_(std::max(1, options.batch_size)),
        reader_(options),
        slots_(static_cast<std::size_t>(std::max(2, depth))) {
    DDP_CUDA_CHECK(cudaStreamCreateWithFlags(copy_.out(), cudaStreamNonBlocking));
    for (Slot& slot : slots_) {
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
      DDP_CUDA_CHECK(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming));
    }
  }

  ~DeviceBatchSource() override {
    // The compute stream may still be reading the last batch handed out, and the copy stream may still be
    // writing slots: let both finish before freeing what they use.
    if (handed_slot_ >= 0) {
      Slot& last = slots_[static_cast<std::size_t>(handed_slot_)];
      warn_cuda(cudaEventRecord(last.consumed, compute_), "cudaEventRecord(consumed)");
      last.consumed_recorded = true;
    }
    for (Slot& slot : slots_) {
      if (slot.consumed_recorded)
        warn_cuda(cudaEventSynchronize(slot.consumed), "cudaEventSynchronize(consumed)");
    }
    warn_cuda(cudaStreamSynchronize(copy_.get()), "cudaStreamSynchronize(copy stream)");
    for (Slot& slot : slots_) {
      release(slot);
      warn_cuda(cudaEventDestroy(slot.copied), "cudaEventDestroy");
      warn_cuda(cudaEventDestroy(slot.consumed), "cudaEventDestroy");
    }
    // Timing events not yet complete are dropped with their measurement.
    for (const TimingPair& pair : timing_pending_) destroy(pair);
    for (const TimingPair& pair : timing_free_) destroy(pair);
    // copy_'s owner destroys the stream last, after this body.
  }

  DeviceBatchSource(const DeviceBatchSource&) = delete;
  DeviceBatchSource& operator=(const DeviceBatchSource&) = delete;

  int64_t num_batches() const override { return reader_.num_batches(); }

  std::optional<BatchView> next() override {
    // The consumer has enqueued its work on the previous batch: mark where it ends.
    if (handed_slot_ >= 0) mark_consumed();
    harvest_timing();

    const int64_t k = handed_;
    const int64_t depth = static_cast<int64_t>(slots_.size());
    while (!reader_done_ && enqueued_ < k + depth) enqueue_next();
    if (k >= enqueued_) return std::nullopt;

    const std::size_t s = static_cast<std::size_t>(k % depth);
    Slot& slot = slots_[s];
    const TimingPair pair = take_timing_pair();
    DDP_CUDA_CHECK(cudaEventRecord(pair.begin, compute_));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, slot.copied, 0));
    DDP_CUDA_CHECK(cudaEventRecord(pair.end, compute_));
    timing_pending_.push_back(pair);

    handed_slot_ = static_cast<int>(s);
    ++handed_;
    // The slot's pinned host tokens stay as they are until a later next() refills the slot.
    return BatchView{slot.tokens, slot.labels, slot.batch_size, slot.seq, slot.host_tokens};
  }

  double input_wait_seconds() override {
    harvest_timing();
    return reader_.wait_seconds() + gpu_wait_ms_ / 1000.0;
  }

 private:
  struct Slot {
    int32_t* host_tokens = nullptr;  // pinned
    float* host_labels = nullptr;    // pinned
    int32_t* tokens = nullptr;       // device
    float* labels = nullptr;         // device
    std::size_t token_capacity = 0;  // elements, same for host and device
    std::size_t label_capacity = 0;
    cudaEvent_t copied = nullptr;    // on the copy stream, after this slot's last copy
    cudaEvent_t consumed = nullptr;  // on the compute stream, after the last work on this slot's batch
    bool copy_recorded = false;
    bool consumed_recorded = false;
    int batch_size = 0;
    int seq = 0;
  };
  struct TimingPair {
    cudaEvent_t begin = nullptr;
    cudaEvent_t end = nullptr;
  };

  void mark_consumed() {
    Slot& slot = slots_[static_cast<std::size_t>(handed_slot_)];
    DDP_CUDA_CHECK(cudaEventRecord(slot.consumed, compute_));
    slot.consumed_recorded = true;
    handed_slot_ = -1;
  }

  // Reads the next batch into its slot and enqueues its copy to the device.
  void enqueue_next() {
    const Batch* batch = reader_.next();  // blocks on the disk at worst; the reader times that
    if (batch == nullptr) {
      reader_done_ = true;
      return;
    }
    const int64_t depth = static_cast<int64_t>(slots_.size());
    Slot& slot = slots_[static_cast<std::size_t>(enqueued_ % depth)];
    timeline::Span span("host-to-device copy");  // staging into pinned memory and the copies' enqueue
    if (slot.copy_recorded) DDP_CUDA_CHECK(cudaEventSynchronize(slot.copied));  // pinned buffers free again
    reserve(slot, batch->tokens.size(), batch->labels.size(), static_cast<std::size_t>(batch->seq));
    std::copy(batch->tokens.begin(), batch->tokens.end(), slot.host_tokens);
    std::copy(batch->labels.begin(), batch->labels.end(), slot.host_labels);
    if (slot.consumed_recorded) DDP_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), slot.consumed, 0));
    DDP_CUDA_CHECK(cudaMemcpyAsync(slot.tokens, slot.host_tokens, batch->tokens.size() * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, copy_.get()));
    DDP_CUDA_CHECK(cudaMemcpyAsync(slot.labels, slot.host_labels, batch->labels.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, copy_.get()));
    DDP_CUDA_CHECK(cudaEventRecord(slot.copied, copy_.get()));
    slot.copy_recorded = true;
    slot.batch_size = batch->batch_size;
    slot.seq = batch->seq;
    ++enqueued_;
  }

  // Sized for a full batch at the first batch (a short last batch fits); grows only if a batch is larger,
  // after the slot's last copy and its last consumer are done.
  void reserve(Slot& slot, std::size_t tokens, std::size_t labels, std::size_t seq) {
    if (tokens <= slot.token_capacity && labels <= slot.label_capacity) return;
    if (slot.consumed_recorded) DDP_CUDA_CHECK(cudaEventSynchronize(slot.consumed));
    release(slot);
    slot.token_capacity = std::max(tokens, static_cast<std::size_t>(rows_) * seq);
    slot.label_capacity = std::max(labels, static_cast<std::size_t>(rows_));
    void* memory = nullptr;
    DDP_CUDA_CHECK(cudaHostAlloc(&memory, slot.token_capacity * sizeof(int32_t), cudaHostAllocDefault));
    slot.host_tokens = static_cast<int32_t*>(memory);
    DDP_CUDA_CHECK(cudaHostAlloc(&memory, slot.label_capacity * sizeof(float), cudaHostAllocDefault));
    slot.host_labels = static_cast<float*>(memory);
    DDP_CUDA_CHECK(cudaMalloc(&memory, slot.token_capacity * sizeof(int32_t)));
    slot.tokens = static_cast<int32_t*>(memory);
    DDP_CUDA_CHECK(cudaMalloc(&memory, slot.label_capacity * sizeof(float)));
    slot.labels = static_cast<float*>(memory);
  }

  static void release(Slot& slot) {
    if (slot.host_tokens != nullptr) warn_cuda(cudaFreeHost(slot.host_tokens), "cudaFreeHost");
    if (slot.host_labels != nullptr) warn_cuda(cudaFreeHost(slot.host_labels), "cudaFreeHost");
    if (slot.tokens != nullptr) warn_cuda(cudaFree(slot.tokens), "cudaFree");
    if (slot.labels != nullptr) warn_cuda(cudaFree(slot.labels), "cudaFree");
    slot.host_tokens = nullptr;
    slot.host_labels = nullptr;
    slot.tokens = nullptr;
    slot.labels = nullptr;
    slot.token_capacity = 0;
    slot.label_capacity = 0;
  }

  TimingPair take_timing_pair() {
    if (!timing_free_.empty()) {
      const TimingPair pair = timing_free_.back();
      timing_free_.pop_back();
      return pair;
    }
    TimingPair pair;
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&pair.begin, cudaEventDefault));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(&pair.end, cudaEventDefault));
    return pair;
  }

  // Adds up the waits that have completed, oldest first, without blocking.
  void harvest_timing() {
    while (!timing_pending_.empty()) {
      const TimingPair pair = timing_pending_.front();
      const cudaError_t status = cudaEventQuery(pair.end);
      if (status == cudaErrorNotReady) {
        // "Not ready" is no error, but the runtime may keep it as the last error: clear it so that the next
        // kernel launch check does not trip over it.
        (void)cudaGetLastError();
        break;
      }
      DDP_CUDA_CHECK(status);
      float ms = 0;
      DDP_CUDA_CHECK(cudaEventElapsedTime(&ms, pair.begin, pair.end));
      gpu_wait_ms_ += ms;
      timing_pending_.pop_front();
      timing_free_.push_back(pair);
    }
  }

  static void destroy(const TimingPair& pair) {
    warn_cuda(cudaEventDestroy(pair.begin), "cudaEventDestroy");
    warn_cuda(cudaEventDestroy(pair.end), "cudaEventDestroy");
  }

  const int device_;  // set (cudaSetDevice) before anything else is built
  cudaStream_t compute_ = nullptr;
  const int rows_;  // full batch size, for the slots' capacity
  BatchReader reader_;
  // The stream is an owner, destroyed after the body of the destructor and before reader_. The slots'
  // buffers and events and the timing pairs stay by hand: the pairs are copied between timing_pending_ and
  // timing_free_, and owners on the slots would release them after the timing pairs, not before.
  cuda::Stream copy_;
  std::vector<Slot> slots_;
  int64_t enqueued_ = 0;  // batches whose copy is enqueued
  int64_t handed_ = 0;    // batches handed out
  int handed_slot_ = -1;  // slot of the batch handed out last, until its "consumed" is recorded
  bool reader_done_ = false;
  std::deque<TimingPair> timing_pending_;  // recorded, not yet added up
  std::vector<TimingPair> timing_free_;
  double gpu_wait_ms_ = 0;
};

}  // namespace

std::unique_ptr<BatchSource> make_device_batch_source(const BatchReaderOptions& options, int device,
                                                      void* compute_stream, int depth) {
  return std::make_unique<DeviceBatchSource>(options, device, compute_stream, depth);
}

}  // namespace ddp::io

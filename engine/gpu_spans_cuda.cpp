#include <cuda_runtime_api.h>

#include <mutex>
#include <utility>
#include <vector>

#include "engine/cuda_check.h"
#include "engine/gpu_spans.h"
#include "engine/timeline.h"

namespace ddp::timeline {

struct GpuSpans::State {
  cudaStream_t stream = nullptr;
  int device = 0;
  const char* track_name = nullptr;
  int track = -1;
  std::mutex mutex;                      // the pool is shared with the writer thread
  std::vector<cudaEvent_t> free_events;  // recorded events go back here once resolved
  std::vector<cudaEvent_t> all_events;
  cudaEvent_t reference = nullptr;  // recorded once; its host time is reference_time
  Clock::time_point reference_time;

  ~State() {
    for (cudaEvent_t e : all_events) warn_cuda(cudaEventDestroy(e), "cudaEventDestroy");
  }

  cudaEvent_t take_event() {
    std::lock_guard<std::mutex> lock(mutex);
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    DDP_CUDA_CHECK(cudaEventCreate(&e));  // with timing: the default flags
    all_events.push_back(e);
    return e;
  }

  void give_back(cudaEvent_t begin, cudaEvent_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    free_events.push_back(begin);
    free_events.push_back(end);
  }

  // Host time of a completed event: the reference's host time plus the GPU time between them.
  bool host_time(cudaEvent_t event, Clock::time_point& out) const {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, reference, event) != cudaSuccess) return false;
    out = reference_time +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
    return true;
  }
};

GpuSpans::GpuSpans(void* stream, int device, const char* track_name) : state_(std::make_shared<State>()) {
  state_->stream = static_cast<cudaStream_t>(stream);
  state_->device = device;
  state_->track_name = track_name;
}

GpuSpans::~GpuSpans() = default;

void* GpuSpans::begin() {
  if (!enabled()) return nullptr;
  State& s = *state_;
  if (s.reference == nullptr) {
    s.reference = s.take_event();
    s.track = track(s.track_name, s.device);
    // The one host synchronisation: pins the reference event to a host time (to within the wake-up latency).
    DDP_CUDA_CHECK(cudaEventRecord(s.reference, s.stream));
    DDP_CUDA_CHECK(cudaEventSynchronize(s.reference));
    s.reference_time = Clock::now();
  }
  cudaEvent_t begin_event = s.take_event();
  DDP_CUDA_CHECK(cudaEventRecord(begin_event, s.stream));
  return begin_event;
}

void GpuSpans::end(void* begin_handle, const char* name) {
  if (begin_handle == nullptr) return;
  auto begin_event = static_cast<cudaEvent_t>(begin_handle);
  cudaEvent_t end_event = state_->take_event();
  DDP_CUDA_CHECK(cudaEventRecord(end_event, state_->stream));
  // Runs on the writer thread: it must not end the job, so a failure only drops the span.
  record_deferred(name, state_->track,
                  [state = state_, begin_event, end_event](Clock::time_point& begin, Clock::time_point& end) {
                    const bool timed = cudaSetDevice(state->device) == cudaSuccess &&
                                       cudaEventSynchronize(end_event) == cudaSuccess &&
                                       state->host_time(begin_event, begin) &&
                                       state->host_time(end_event, end);
                    state->give_back(begin_event, end_event);
                    return timed;
                  });
}

}  // namespace ddp::timeline

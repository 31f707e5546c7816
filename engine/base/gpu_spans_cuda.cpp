#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/base/cuda_check.h"
#include "engine/base/gpu_spans.h"
#include "engine/base/timeline.h"

namespace ddp::timeline {

struct GpuSpans::State {
  cudaStream_t stream = nullptr;
  int device = 0;
  const char* track_name = nullptr;
  int track = -1;
  std::mutex mutex;                      // the pool is shared with the writer thread
  std::vector<cudaEvent_t> free_events;  // recorded events go back here once resolved
  std::vector<cudaEvent_t> all_events;
  // An event pinned to a host time. cudaEventElapsedTime is a float of milliseconds, 62 us coarse ten minutes
  // after its reference, and the GPU's clock drifts from the host's: a new anchor every minute keeps a span's
  // start within a few microseconds. Spans still being written keep their own anchor alive.
  struct Anchor {
    cudaEvent_t event = nullptr;
    Clock::time_point time;
  };
  std::shared_ptr<const Anchor> anchor;

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

  // Records a new anchor on the stream and waits for it: the only host synchronisation, once a minute.
  void anchor_now() {
    cudaEvent_t event = nullptr;
    DDP_CUDA_CHECK(cudaEventCreate(&event));
    {
      std::lock_guard<std::mutex> lock(mutex);
      all_events.push_back(event);  // destroyed with the pool
    }
    DDP_CUDA_CHECK(cudaEventRecord(event, stream));
    DDP_CUDA_CHECK(cudaEventSynchronize(event));
    anchor = std::make_shared<const Anchor>(Anchor{event, Clock::now()});
  }
};

namespace {

// `to` - `from` of two completed events, as a host duration.
bool elapsed(cudaEvent_t from, cudaEvent_t to, Clock::duration& out) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) return false;
  out = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
  return true;
}

constexpr auto kAnchorLifetime = std::chrono::seconds(60);

}  // namespace

GpuSpans::GpuSpans(void* stream, int device, const char* track_name) : state_(std::make_shared<State>()) {
  state_->stream = static_cast<cudaStream_t>(stream);
  state_->device = device;
  state_->track_name = track_name;
}

GpuSpans::~GpuSpans() = default;

void* GpuSpans::begin() {
  if (!enabled()) return nullptr;
  State& s = *state_;
  if (s.anchor == nullptr) s.track = track(s.track_name, s.device);
  if (s.anchor == nullptr || Clock::now() - s.anchor->time > kAnchorLifetime) s.anchor_now();
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
  // The start from the anchor; the length from the span's own two events, at full precision.
  record_deferred(name, state_->track,
                  [state = state_, anchor = state_->anchor, begin_event, end_event](Clock::time_point& begin,
                                                                                    Clock::time_point& end) {
                    Clock::duration since_anchor{};
                    Clock::duration length{};
                    const bool timed = cudaSetDevice(state->device) == cudaSuccess &&
                                       cudaEventSynchronize(end_event) == cudaSuccess &&
                                       elapsed(anchor->event, begin_event, since_anchor) &&
                                       elapsed(begin_event, end_event, length);
                    state->give_back(begin_event, end_event);
                    begin = anchor->time + since_anchor;
                    end = begin + length;
                    return timed;
                  });
}

}  // namespace ddp::timeline

// GPU work on the timeline (timeline.h): spans timed with CUDA events on a stream, so the trace shows when
// the GPU ran forward and backward rather than when the host enqueued them. Only the CUDA build has it
// (gpu_spans_cuda.cpp); only CUDA code uses it.
//
// A span costs two cudaEventRecord calls and no host synchronisation: the timeline's writer thread waits
// for the end event and converts the events' times to host times through an anchor event, recorded (and
// waited for) when the first span begins and again once a minute.
#pragma once

#include <memory>

namespace ddp::timeline {

class GpuSpans {
 public:
  // `stream` is a cudaStream_t on CUDA device `device`; its spans go on the track "<track_name> <device>".
  GpuSpans(void* stream, int device, const char* track_name = "GPU stream");
  ~GpuSpans();
  GpuSpans(const GpuSpans&) = delete;
  GpuSpans& operator=(const GpuSpans&) = delete;

  // The stream's work enqueued between begin() and end() becomes the span `name` (a string literal) on the
  // stream's track. begin() returns the start event (a cudaEvent_t) for end(); both do nothing
  // while the timeline is off (begin() then returns nullptr).
  void* begin();
  void end(void* begin_event, const char* name);

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the writer thread's pending spans, which may outlive this
};

}  // namespace ddp::timeline

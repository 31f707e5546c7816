// The training timeline (--log.timeline FILE): a Chrome trace (JSON array format, loads in chrome://tracing
// and Perfetto) with one process per rank and one track per thread: data wait, HDF5 read, host-to-device
// copy, forward, backward, each gradient bucket's reduction (a track per bucket, since buckets overlap
// backward and each other), optimizer, evaluation, checkpoint.
//
// Cost. Off, a span is one relaxed atomic load. On, recording appends a fixed-size event to a buffer under a
// mutex (no formatting, no allocation in the steady state); a writer thread swaps the buffer out every 100
// ms, formats it and appends it to this rank's part file (FILE.rank<R>.part), so a crashed run still leaves
// its events on disk. At the end the ranks send their parts to rank 0, which writes FILE.
//
// Times are host times. On a GPU, compute is asynchronous: the main thread's spans there are the host's
// enqueue time, and the GPU's own forward and backward are timed with CUDA events on a "GPU stream" track,
// NCCL's bucket reductions on an "NCCL stream" track (engine/base/gpu_spans.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::timeline {

using Clock = std::chrono::steady_clock;

bool enabled();

// Starts recording (and the writer thread) for this rank.
void start(const std::string& path, int rank, const std::string& process_label);
// Stops recording; returns this rank's events as JSON objects separated by ",\n" (the part file is removed).
std::string finish();
// Rank 0: writes the trace from every rank's finish() text, atomically. Throws UserError if it cannot.
void write_trace(const std::string& path, const std::vector<std::string>& ranks_events);
// Rank 0, before write_trace: an earlier trace at `path` (a resumed run's first part) is renamed to the first
// free "STEM.N.EXT" (trace.1.json, trace.2.json, ...), so the new one does not destroy it. Returns the new
// name, or "" where there was none. Throws UserError if it cannot be renamed.
std::string keep_earlier_trace(const std::string& path);
// Rank 0 of a run that replaces the one before (checkpoint.overwrite), its trace inside the run directory:
// the earlier runs' numbered traces and part files beside `path` (STEM.N.EXT, STEM.N.EXT.rankR.part) go, as
// their last.h5 did. Returns how many files it removed.
int remove_earlier_traces(const std::string& path);

// The calling thread's track name ("main", "prefetch", ...); the first span of an unnamed thread names it
// "thread N".
void name_this_thread(const char* name);
// A track of its own for work that overlaps the thread's other spans (a reduction bucket); `index` tells
// tracks of the same kind apart.
int track(const char* kind, int index);

// One span. `name` must outlive the run (a string literal). `arg` >= 0 is shown as args.value.
void record(const char* name, Clock::time_point begin, Clock::time_point end, int track = -1,
            int64_t arg = -1);

// A span whose times are known only later (GPU work, timed by CUDA events): the writer thread calls
// `resolve`, which may block until the work is done, to get them; false drops the span.
using TimeResolver = std::function<bool(Clock::time_point& begin, Clock::time_point& end)>;
void record_deferred(const char* name, int track, TimeResolver resolve);

// Records [construction, destruction) on the calling thread's track.
class Span {
 public:
  explicit Span(const char* name, int64_t arg = -1) : name_(name), arg_(arg), on_(enabled()) {
    if (on_) begin_ = Clock::now();
  }
  ~Span() {
    if (on_) record(name_, begin_, Clock::now(), -1, arg_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* name_;
  int64_t arg_;
  bool on_;
  Clock::time_point begin_;
};

}  // namespace ddp::timeline

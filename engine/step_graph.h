// A GPU rank's training step captured once into a CUDA graph and replayed (train.cuda_graph = auto): the
// step's kernels, cuDNN's calls, NCCL's all-reduce and the optimizer then leave the host as one launch, with
// nothing of the host between them, instead of some fifty launches that a small batch's GPU work cannot
// hide. What changes between steps is put on the device before the launch, outside the graph: the batch,
// copied into the replica's own buffers (Replica::begin_step), the optimizer's coefficients
// (Optimizer::prepare_step) and the embedding dropout's draw. Each batch shape gets its own graph: its first
// step runs eagerly (libraries set themselves up on first use, which a capture must not see), the second is
// captured and launched, the others replay it (training's batches are all full: one shape, one graph; a
// shorter batch would get a graph of its own at its second step). A replica that reallocates the memory its
// graphs point at (a larger shape) makes them stale: they are dropped and captured again. Where the step
// holds a collective over several ranks (NCCL's all-reduce), whether it runs eagerly, captured or from a
// graph must be the same on every rank (NCCL's rule for collectives in graphs): every rank steps through the
// same shapes in the same order (every rank settles the same shapes at start-up), so the decision is the
// same everywhere as long as no rank reallocates after its first step; one that does ends the job rather
// than launch a collective the others do not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "comm/gradient_reducer.h"
#include "engine/optimizer/optimizer.h"
#include "models/replica.h"

namespace ddp::engine {

// What AllReduceStep's steps need to be replayed from graphs: the replica's, the exchange's and the
// optimizer's work enqueued on the GPU alone, and the timeline off (it times every launch with events).
struct StepGraphFacts {
  bool wanted = true;              // train.cuda_graph = auto (off: false)
  std::string replica_refusal;     // Replica::step_graph_refusal()
  bool reducer_capturable = true;  // GradientReducer::capturable()
  std::string backend;             // the reducer's, for the message
  bool optimizer_splits = true;    // Optimizer::splits_steps()
  bool skips_nonfinite = false;    // fp16's loss scaling decides on the host whether a step applies
  bool delayed = false;            // comm.overlap = delayed
  bool timeline = false;           // log.timeline is on
};
// Why the steps cannot be replayed, in a few words for the start log, or "" where they can.
std::string step_graph_refusal(const StepGraphFacts& facts);
StepGraphFacts step_graph_facts(const models::Replica& replica, const comm::GradientReducer& reducer,
                                const optim::Optimizer& optimizer, bool wanted, bool skips_nonfinite,
                                bool delayed, bool timeline);

// What capturing needs of CUDA, apart from StepGraphs so that its rules are tested without a GPU.
class GraphRecorder {
 public:
  virtual ~GraphRecorder() = default;
  // Starts capturing the work this thread enqueues on the stream, and on streams that wait on its events.
  virtual void begin_capture() = 0;
  // Ends the capture and instantiates the graph; returns its handle for launch().
  virtual std::size_t end_capture() = 0;
  // Ends a capture that an error interrupted, discarding it. Never throws.
  virtual void abandon_capture() noexcept = 0;
  // Enqueues one run of the graph on the stream.
  virtual void launch(std::size_t graph) = 0;
  // Destroys every graph (one still running finishes first).
  virtual void clear() = 0;
};

// CUDA's, on `stream` (the replica's cudaStream_t). In a build without CUDA: throws std::logic_error.
std::unique_ptr<GraphRecorder> make_cuda_graph_recorder(void* stream);

class StepGraphs {
 public:
  // At most `max_graphs` shapes get graphs; steps of further shapes run eagerly. `collective`: the step
  // holds a collective over several ranks.
  StepGraphs(std::unique_ptr<GraphRecorder> recorder, bool collective, std::size_t max_graphs = 4);

  enum class Run { kEager, kCaptured, kReplayed };
  // One step of a batch of `batch` x `seq`, whose device work `enqueue` enqueues on the recorder's stream,
  // pointing at memory of `generation` (Replica::memory_generation): eagerly, captured (and launched), or
  // replayed, as above. `enqueue` is called for the first two only.
  Run run(int batch, int seq, uint64_t generation, const std::function<void()>& enqueue);

  std::size_t graphs() const { return graphs_.size(); }
  // Destroys every graph (one still running is freed when it completes) and the recorder: on the way out of
  // a failed run, before NCCL's communicator is aborted, which waits until no graph holds its collectives.
  // No run() may follow.
  void release() noexcept;

 private:
  std::unique_ptr<GraphRecorder> recorder_;
  bool collective_;
  std::size_t max_graphs_;
  uint64_t generation_ = 0;
  std::map<std::pair<int, int>, std::size_t> graphs_;  // by (batch, seq): the recorder's handle
  std::map<std::pair<int, int>, int> eager_runs_;      // shapes run eagerly in this generation
};

}  // namespace ddp::engine

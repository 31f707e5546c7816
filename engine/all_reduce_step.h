// One synchronous all-reduce step, shared by the trainer and the benchmarks: forward and backward on the
// replica, gradients averaged over ranks (each segment's reduction starts as soon as backward finishes it;
// the embedding's rows travel sparsely), then the optimizer on the flat buffer.
//
// Delayed (comm.overlap = delayed, CPU replicas): pipelined SGD. Step k's gradient is copied aside and its
// average travels during step k + 1's forward and backward, and is applied after them, so the exchange
// overlaps a whole step instead of the end of backward. Each update then lands one update later than the
// parameters its gradient was computed at; to make up for it, the gradient is computed at the parameters
// predicted for that moment: the current ones plus the last update (weight prediction, as in SpecTrain),
// restored after backward. flush() applies the gradient still in flight, at the end of every run of steps,
// so that a checkpoint holds every step's update, and forgets the last update: a run resumed from that
// checkpoint starts as the uninterrupted run goes on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "engine/optimizer/optimizer.h"
#include "engine/step_graph.h"
#include "models/replica.h"

namespace ddp::engine {

class AllReduceStep {
 public:
  // `sparse_exchange`: exchange only the embedding rows some rank touched (comm.sparse_embedding).
  // `clip_norm` > 0: the averaged gradient's global norm is clipped to it (train.clip_norm), computed by the
  // optimizer where the gradient is, the same on every rank (Optimizer::step_clipped).
  // `delayed`: comm.overlap = delayed (above); the replica must be on the CPU. `gpu_job`: some rank of the
  // job runs on a GPU, which picks the order of the reductions (ParamLayout::reduction_order).
  // `skip_nonfinite`: model.precision = fp16 somewhere in the job (dynamic loss scaling, models/
  // loss_scale.h): a step whose averaged gradient is not finite is not applied, on every rank alike (they
  // all hold the same average), and the replica hears of every step's fate (Replica::after_update).
  // `cuda_graphs`: train.cuda_graph = auto; a GPU replica's steps are replayed from CUDA graphs where the
  // replica, the reducer and the optimizer allow it (step_graph.h; graph_note() says which).
  AllReduceStep(models::Replica& replica, comm::GradientReducer& reducer, optim::Optimizer& optimizer,
                bool sparse_exchange, double clip_norm = 0, bool delayed = false, bool gpu_job = false,
                bool skip_nonfinite = false, bool cuda_graphs = false);
  // A step left with its exchange in flight (an error on this rank between steps) leaves the exchange's
  // buffer to the reducer, which MPI may still write into until the job ends.
  ~AllReduceStep();
  AllReduceStep(const AllReduceStep&) = delete;
  AllReduceStep& operator=(const AllReduceStep&) = delete;

  // The batch's loss and accuracy go to the replica's running stats (Replica::take_stats).
  void run(const BatchView& batch);
  // Delayed: waits for the last run's average and applies it. Otherwise (and with nothing in flight) nothing.
  void flush();

  // Time of the last run() split in its parts, for benchmarks.
  struct Timing {
    double compute_s = 0;   // forward and backward (with the reductions it started)
    double reduce_s = 0;    // waiting for the gradient exchange to finish
    double optimize_s = 0;  // the optimizer
  };
  const Timing& last_timing() const { return timing_; }

  // A GPU rank's way of running the step, for the start log: "step in a CUDA graph per batch shape" or
  // "eager step (why not)"; "" on a CPU rank.
  std::string graph_note() const;
  bool uses_graphs() const { return uses_graphs_; }
  // How the last run() went (kEager where no graphs are used).
  StepGraphs::Run last_run() const { return last_run_; }
  // On the way out of a failed run: the step's graphs go (StepGraphs::release). No step may follow.
  void release_graphs() noexcept {
    if (graphs_) graphs_->release();
  }
  // For tests: the graphs record and replay through `recorder` instead of CUDA's. Before the first run().
  void use_graph_recorder(std::unique_ptr<GraphRecorder> recorder);

 private:
  models::Replica& replica_;
  comm::GradientReducer& reducer_;
  optim::Optimizer& optimizer_;
  bool sparse_exchange_;
  double clip_norm_;
  bool skip_nonfinite_;
  // The optimizer on `grads`, averaged (with the embedding rows of embedding_rows_ where sparse).
  void apply(std::span<const float> grads);
  void run_delayed(const BatchView& batch);
  // The step split for graphs (Replica::begin_step, Optimizer::prepare_step), its device work replayed.
  void run_graphed(const BatchView& batch);
  // Backward has finished `segment`: starts the reductions now due, in order_ (next_ is the next to start).
  void start_due_reductions(const models::ParamSegment& segment);

  std::vector<int32_t> embedding_rows_;  // rows averaged in the last step
  std::vector<bool> finished_;           // per segment: the replica has reported its gradient this step
  std::size_t next_ = 0;                 // order_[next_] is the next reduction to start
  Timing timing_;
  const bool delayed_;
  const std::vector<std::size_t> order_;  // the reductions' start order
  std::vector<float> in_flight_;  // delayed: the last step's gradient, being averaged (zero elsewhere)
  bool pending_ = false;          // delayed: in_flight_ holds a gradient not yet applied
  // Delayed: the parameters at the step's start, and the last update applied (valid where
  // has_last_update_; none at a run of steps' start).
  std::vector<float> step_start_, last_update_;
  bool has_last_update_ = false;
  // Delayed: waits for the gradient in flight and applies it (nothing if none).
  void apply_in_flight();
  bool uses_graphs_ = false;            // a GPU replica whose steps can be replayed
  std::string graph_refusal_;           // why not, where they cannot
  std::unique_ptr<StepGraphs> graphs_;  // made at the first run()
  StepGraphs::Run last_run_ = StepGraphs::Run::kEager;
};

}  // namespace ddp::engine

#include "engine/step_graph.h"

#include <fmt/format.h>

#include <exception>

#include "engine/base/errors.h"

namespace ddp::engine {

std::string step_graph_refusal(const StepGraphFacts& facts) {
  if (!facts.wanted) return "train.cuda_graph = off";
  if (!facts.replica_refusal.empty()) return facts.replica_refusal;
  if (facts.delayed) return "comm.overlap = delayed";
  if (!facts.reducer_capturable) return "the " + facts.backend + " exchange goes through the host";
  if (!facts.optimizer_splits) return "the optimizer runs on the host";
  if (facts.skips_nonfinite) return "fp16's skipped steps are decided on the host";
  if (facts.timeline) return "log.timeline times each launch";
  return "";
}

StepGraphFacts step_graph_facts(const models::Replica& replica, const comm::GradientReducer& reducer,
                                const optim::Optimizer& optimizer, bool wanted, bool skips_nonfinite,
                                bool delayed, bool timeline) {
  StepGraphFacts facts;
  facts.wanted = wanted;
  facts.replica_refusal = replica.step_graph_refusal();
  facts.reducer_capturable = reducer.capturable();
  facts.backend = reducer.backend();
  facts.optimizer_splits = optimizer.splits_steps();
  facts.skips_nonfinite = skips_nonfinite;
  facts.delayed = delayed;
  facts.timeline = timeline;
  return facts;
}

StepGraphs::StepGraphs(std::unique_ptr<GraphRecorder> recorder, bool collective, std::size_t max_graphs)
    : recorder_(std::move(recorder)), collective_(collective), max_graphs_(max_graphs) {}

void StepGraphs::release() noexcept {
  // The recorder's destructor destroys its graphs, warning of an error rather than ending the job with it:
  // the error being unwound is the one to report.
  recorder_.reset();
  graphs_.clear();
  eager_runs_.clear();
}

StepGraphs::Run StepGraphs::run(int batch, int seq, uint64_t generation,
                                const std::function<void()>& enqueue) {
  if (generation != generation_) {
    if (collective_ && !(graphs_.empty() && eager_runs_.empty())) {
      DDP_FATAL(fmt::format(
          "the replica reallocated its memory after its first step (generation {} to {}, a {}x{} batch): "
          "its steps would leave their CUDA graphs while other ranks replay theirs, and NCCL's all-reduce "
          "in them must be launched alike on every rank (train.cuda_graph = off steps eagerly)",
          generation_, generation, batch, seq));
    }
    // The graphs point at memory the replica has since reallocated; a shape's next step runs eagerly first,
    // as the new memory may be new to the libraries too.
    if (!graphs_.empty()) recorder_->clear();
    graphs_.clear();
    eager_runs_.clear();
    generation_ = generation;
  }
  const std::pair<int, int> shape{batch, seq};
  if (const auto found = graphs_.find(shape); found != graphs_.end()) {
    recorder_->launch(found->second);
    return Run::kReplayed;
  }
  int& eager_runs = eager_runs_[shape];
  if (eager_runs == 0 || graphs_.size() >= max_graphs_) {
    ++eager_runs;
    enqueue();
    return Run::kEager;
  }
  recorder_->begin_capture();
  try {
    enqueue();
  } catch (...) {
    recorder_->abandon_capture();
    throw;
  }
  const std::size_t graph = recorder_->end_capture();
  graphs_.emplace(shape, graph);
  // Capturing ran nothing: this step runs now, from its graph.
  recorder_->launch(graph);
  return Run::kCaptured;
}

}  // namespace ddp::engine

#include "engine/all_reduce_step.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "engine/step_graph.h"

namespace ddp::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

AllReduceStep::AllReduceStep(models::Replica& replica, comm::GradientReducer& reducer,
                             optim::Optimizer& optimizer, bool sparse_exchange, double clip_norm,
                             bool delayed, bool gpu_job, bool skip_nonfinite, bool cuda_graphs)
    : replica_(replica),
      reducer_(reducer),
      optimizer_(optimizer),
      sparse_exchange_(sparse_exchange),
      clip_norm_(clip_norm),
      skip_nonfinite_(skip_nonfinite),
      delayed_(delayed),
      order_(replica.layout().reduction_order(gpu_job)) {
  if (delayed_ && replica_.device() != models::DeviceKind::kCpu) {
    throw std::invalid_argument("AllReduceStep: the delayed exchange runs on CPU replicas");
  }
  if (delayed_ && skip_nonfinite_) {
    throw std::invalid_argument("AllReduceStep: the delayed exchange does not skip steps");
  }
  if (replica_.device() == models::DeviceKind::kCuda) {
    graph_refusal_ = step_graph_refusal(step_graph_facts(replica_, reducer_, optimizer_, cuda_graphs,
                                                         skip_nonfinite_, delayed_, timeline::enabled()));
    uses_graphs_ = graph_refusal_.empty();
  }
}

std::string AllReduceStep::graph_note() const {
  if (replica_.device() != models::DeviceKind::kCuda) return "";
  return uses_graphs_ ? "step in a CUDA graph per batch shape" : "eager step (" + graph_refusal_ + ")";
}

void AllReduceStep::use_graph_recorder(std::unique_ptr<GraphRecorder> recorder) {
  if (!uses_graphs_) throw std::logic_error("AllReduceStep: no graphs to record (" + graph_refusal_ + ")");
  graphs_ = std::make_unique<StepGraphs>(std::move(recorder), reducer_.size() > 1);
}

AllReduceStep::~AllReduceStep() {
  // Not freed: a pending non-blocking reduction (and the MPI backend's progress thread) may still write into
  // it. Only on the way out of a failed run, which ends the job.
  if (pending_) new std::vector<float>(std::move(in_flight_));
}

void AllReduceStep::run(const BatchView& batch) {
  if (delayed_) {
    run_delayed(batch);
    return;
  }
  if (uses_graphs_) {
    run_graphed(batch);
    return;
  }
  const auto start = Clock::now();
  std::span<float> grads = replica_.grads();
  // The reductions start in one order on every rank (ParamLayout::reduction_order), whatever order this
  // rank's replica finishes the segments in (start_due_reductions).
  finished_.assign(replica_.layout().segments().size(), false);
  next_ = 0;
  replica_.train_step(batch, [this](const models::ParamSegment& segment) { start_due_reductions(segment); });
  if (next_ != order_.size()) {
    throw std::logic_error("the replica's train_step left the gradient of " +
                           replica_.layout().segments()[order_[next_]].name + " unreported");
  }
  const auto computed = Clock::now();

  {
    timeline::Span span("reduction wait");
    reducer_.finish_average();
  }
  const auto reduced = Clock::now();

  // fp16 overflowed on some rank: every rank holds the same average, so every rank skips alike.
  const bool applies = !skip_nonfinite_ || replica_.gradients_finite();
  if (applies) apply(grads);
  if (skip_nonfinite_) replica_.after_update(applies);

  // The exchange wrote other ranks' rows into this rank's embedding gradient. Clear them, so that the
  // replica's promise (rows it did not touch are zero) holds at the next step.
  if (sparse_exchange_) {
    replica_.clear_embedding_gradient_rows(embedding_rows_);
  } else if (reducer_.size() > 1) {
    replica_.clear_embedding_gradient();
  }
  const auto done = Clock::now();
  timing_ = {seconds_between(start, computed), seconds_between(computed, reduced),
             seconds_between(reduced, done)};
}

void AllReduceStep::start_due_reductions(const models::ParamSegment& segment) {
  // Collectives pair up by order, and a GPU rank and a CPU rank of one job differ (the CPU replica hands the
  // embedding over before the first layer's weights, cuDNN computes every layer's weights in one call), so a
  // segment that finishes early waits for the ones before it. The embedding's rows (all-CPU jobs only, whose
  // replicas all report alike) start as soon as it is ready.
  const models::ParamLayout& layout = replica_.layout();
  const std::vector<models::ParamSegment>& segments = layout.segments();
  const models::ParamSegment& embedding = segments.front();
  const std::span<float> grads = replica_.grads();
  if (sparse_exchange_ && segment.offset == embedding.offset) {
    // By rows, in the background like the other segments: the CPU replica hands the embedding over before
    // the first layer's weight gradients, which it computes while the rows travel.
    timeline::Span span("embedding rows exchange");
    embedding_rows_ = reducer_.start_average_rows(grads.subspan(embedding.offset, embedding.size),
                                                  static_cast<std::size_t>(layout.shape().embedding_dim),
                                                  replica_.touched_embedding_rows());
  }
  finished_[layout.segment_index(segment.offset)] = true;
  for (; next_ < order_.size() && finished_[order_[next_]]; ++next_) {
    const models::ParamSegment& ready = segments[order_[next_]];
    if (sparse_exchange_ && ready.offset == embedding.offset) continue;  // its rows are on their way
    reducer_.start_average(grads.subspan(ready.offset, ready.size));
  }
}

void AllReduceStep::run_graphed(const BatchView& batch) {
  if (!graphs_) {
    graphs_ = std::make_unique<StepGraphs>(make_cuda_graph_recorder(replica_.stream()), reducer_.size() > 1);
  }
  const auto start = Clock::now();
  // The host's part of the step, outside any graph: the batch into the replica's buffers, this step's
  // dropout draw and optimizer coefficients onto the device.
  const BatchView staged = replica_.begin_step(batch);
  optimizer_.prepare_step();
  last_run_ = graphs_->run(batch.batch, batch.seq, replica_.memory_generation(), [&] {
    // The step's device work, in the eager step's order: backward starting the reductions, the wait for
    // them on the device, the (clipped) update. A GPU replica's embedding gradient is dense and exchanged
    // whole, so nothing is left to clear.
    finished_.assign(replica_.layout().segments().size(), false);
    next_ = 0;
    replica_.enqueue_step(staged,
                          [this](const models::ParamSegment& segment) { start_due_reductions(segment); });
    if (next_ != order_.size()) {
      throw std::logic_error("the replica's enqueue_step left the gradient of " +
                             replica_.layout().segments()[order_[next_]].name + " unreported");
    }
    reducer_.finish_average();
    optimizer_.enqueue_step(replica_.params(), replica_.grads(), clip_norm_);
  });
  // A replay enqueued no reduction through the reducer, which checks for a peer's failure there: ask now,
  // before a later host synchronisation waits on a collective that will not finish.
  if (last_run_ == StepGraphs::Run::kReplayed) {
    if (const std::optional<std::string> error = reducer_.asynchronous_error()) DDP_FATAL(*error);
  }
  // The host waited for nothing: the whole step is the time to enqueue it.
  timing_ = {seconds_between(start, Clock::now()), 0, 0};
}

void AllReduceStep::apply(std::span<const float> grads) {
  const models::ParamLayout& layout = replica_.layout();
  const models::ParamSegment& embedding = layout.segments().front();
  const optim::TouchedRows rows{embedding.offset, static_cast<std::size_t>(layout.shape().embedding_dim),
                                static_cast<std::size_t>(layout.shape().vocab_size), embedding_rows_};
  timeline::Span span("optimizer");
  const optim::TouchedRows* sparse = sparse_exchange_ ? &rows : nullptr;
  if (clip_norm_ > 0) {
    optimizer_.step_clipped(replica_.params(), grads, sparse, clip_norm_);
  } else {
    optimizer_.step(replica_.params(), grads, sparse);
  }
}

void AllReduceStep::run_delayed(const BatchView& batch) {
  const auto start = Clock::now();
  // The gradient computed now is applied after the next update: computed at the parameters predicted for
  // then (the last update once more), which are restored after backward.
  const std::span<float> params = replica_.params();
  const bool applies = pending_;  // a last update exists only where a gradient is pending
  if (applies) step_start_.resize(params.size());
  if (has_last_update_) {
    for (std::size_t i = 0; i < params.size(); ++i) {  // one pass: saved, then moved
      step_start_[i] = params[i];
      params[i] += last_update_[i];
    }
  } else if (applies) {
    std::copy(params.begin(), params.end(), step_start_.begin());
  }
  // Backward runs while the last step's average travels; nothing starts during it.
  replica_.train_step(batch, {});
  if (has_last_update_) std::copy(step_start_.begin(), step_start_.end(), params.begin());
  const auto computed = Clock::now();
  apply_in_flight();
  if (applies) {
    last_update_.resize(params.size());
    for (std::size_t i = 0; i < params.size(); ++i) last_update_[i] = params[i] - step_start_[i];
    has_last_update_ = true;
  }
  const auto reduced = Clock::now();

  // This step's gradient, copied aside for its exchange: in_flight_ is zero but where the last exchange
  // wrote (cleared in apply_in_flight), so the sparse copy needs only the rows this rank touched.
  const std::span<const float> grads = replica_.grads();
  const models::ParamLayout& layout = replica_.layout();
  const models::ParamSegment& embedding = layout.segments().front();
  const auto width = static_cast<std::size_t>(layout.shape().embedding_dim);
  in_flight_.resize(grads.size(), 0.0f);
  if (sparse_exchange_) {
    const std::span<const int32_t> touched = replica_.touched_embedding_rows();
    for (const int32_t row : touched) {
      const std::size_t at = embedding.offset + static_cast<std::size_t>(row) * width;
      std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(at), width,
                  in_flight_.begin() + static_cast<std::ptrdiff_t>(at));
    }
    std::copy(grads.begin() + static_cast<std::ptrdiff_t>(embedding.offset + embedding.size), grads.end(),
              in_flight_.begin() + static_cast<std::ptrdiff_t>(embedding.offset + embedding.size));
  } else {
    std::copy(grads.begin(), grads.end(), in_flight_.begin());
  }
  const std::span<float> staged(in_flight_);
  for (const std::size_t index : order_) {
    const models::ParamSegment& segment = layout.segments()[index];
    if (sparse_exchange_ && segment.offset == embedding.offset) {
      embedding_rows_ = reducer_.start_average_rows(staged.subspan(embedding.offset, embedding.size), width,
                                                    replica_.touched_embedding_rows());
    } else {
      reducer_.start_average(staged.subspan(segment.offset, segment.size));
    }
  }
  pending_ = true;
  // The replica's own gradient was not touched by any exchange: its promise (rows it did not touch are
  // zero) holds as it is.
  timing_ = {seconds_between(start, computed), seconds_between(computed, reduced),
             seconds_between(reduced, Clock::now())};
}

void AllReduceStep::flush() {
  apply_in_flight();
  has_last_update_ = false;
}

void AllReduceStep::apply_in_flight() {
  if (!pending_) return;
  {
    timeline::Span span("reduction wait");
    reducer_.finish_average();
  }
  apply(in_flight_);
  pending_ = false;
  // Ready for the next step's copy: zero where this exchange wrote other ranks' values.
  const models::ParamLayout& layout = replica_.layout();
  const models::ParamSegment& embedding = layout.segments().front();
  if (!sparse_exchange_) return;
  const auto width = static_cast<std::size_t>(layout.shape().embedding_dim);
  for (const int32_t row : embedding_rows_) {
    std::fill_n(in_flight_.begin() +
                    static_cast<std::ptrdiff_t>(embedding.offset + static_cast<std::size_t>(row) * width),
                width, 0.0f);
  }
}

}  // namespace ddp::engine

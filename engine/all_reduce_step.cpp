#include "engine/all_reduce_step.h"

#include <chrono>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The squared L2 norm of the averaged gradient, in double; with `sparse`, the matrix's untouched rows are
// zero and skipped.
double squared_norm(std::span<const float> grads, const TouchedRows* sparse) {
  double sum = 0;
  auto add = [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) sum += static_cast<double>(grads[i]) * grads[i];
  };
  if (sparse == nullptr) {
    add(0, grads.size());
    return sum;
  }
  add(0, sparse->offset);
  for (const int32_t row : sparse->rows) {
    const std::size_t begin = sparse->offset + static_cast<std::size_t>(row) * sparse->width;
    add(begin, begin + sparse->width);
  }
  add(sparse->offset + sparse->count * sparse->width, grads.size());
  return sum;
}

}  // namespace

AllReduceStep::AllReduceStep(models::Replica& replica, comm::Communicator& comm, Optimizer& optimizer,
                             bool sparse_exchange, double clip_norm)
    : replica_(replica),
      comm_(comm),
      optimizer_(optimizer),
      sparse_exchange_(sparse_exchange),
      clip_norm_(clip_norm) {
  if (clip_norm > 0 && replica.device() != models::DeviceKind::kCpu) {
    throw UserError("train.clip_norm on GPU ranks is not supported yet (the norm is computed on the host)");
  }
}

void AllReduceStep::run(const BatchView& batch) {
  const auto start = Clock::now();
  std::span<float> grads = replica_.grads();
  const models::ParamLayout& layout = replica_.layout();
  const models::ParamSegment& embedding = layout.segments().front();
  const auto width = static_cast<std::size_t>(layout.shape().embedding_dim);
  replica_.train_step(batch, [&](const models::ParamSegment& segment) {
    if (sparse_exchange_ && segment.offset == embedding.offset) {
      // By rows, in the background like the other segments: the CPU replica hands the embedding over
      // before the first layer's weight gradients, which it computes while the rows travel.
      timeline::Span span("embedding rows exchange");
      embedding_rows_ = comm_.start_average_rows(grads.subspan(embedding.offset, embedding.size), width,
                                                 replica_.touched_embedding_rows());
      return;
    }
    comm_.start_average(grads.subspan(segment.offset, segment.size));
  });
  const auto computed = Clock::now();

  {
    timeline::Span span("reduction wait");
    comm_.finish_average();
  }
  const auto reduced = Clock::now();

  const TouchedRows rows{embedding.offset, width, static_cast<std::size_t>(layout.shape().vocab_size),
                         embedding_rows_};
  {
    timeline::Span span("optimizer");
    const float scale =
        clip_norm_ > 0 ? clipping_scale(squared_norm(grads, sparse_exchange_ ? &rows : nullptr), clip_norm_)
                       : 1.0f;
    optimizer_.step(replica_.params(), grads, sparse_exchange_ ? &rows : nullptr, scale);
  }

  // The exchange wrote other ranks' rows into this rank's embedding gradient. Clear them, so that the
  // replica's promise (rows it did not touch are zero) holds at the next step.
  if (sparse_exchange_) {
    replica_.clear_embedding_gradient_rows(embedding_rows_);
  } else if (comm_.size() > 1) {
    replica_.clear_embedding_gradient();
  }
  const auto done = Clock::now();
  timing_ = {seconds_between(start, computed), seconds_between(computed, reduced),
             seconds_between(reduced, done)};
}

}  // namespace ddp::engine

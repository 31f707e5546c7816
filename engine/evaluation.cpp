#include "engine/evaluation.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "engine/base/timeline.h"
#include "engine/classification_report.h"

namespace ddp::engine {

std::unique_ptr<io::BatchSource> ReplicaBatches::training(const io::Shard& rows, uint64_t seed, int64_t epoch,
                                                          int64_t first, int64_t count) const {
  io::BatchReaderOptions options = reading("train", rows, "prefetch (training)");
  options.shuffle = true;
  options.seed = seed;
  options.epoch = epoch;
  options.drop_last = true;
  options.first_batch = first;
  options.max_batches = count;
  return open(options);
}

std::unique_ptr<io::BatchSource> ReplicaBatches::in_order(const io::RowSet& rows) const {
  io::BatchReaderOptions options = reading(rows.split, rows.shard, "prefetch (evaluation)");
  options.shuffle = false;
  options.drop_last = false;
  return open(options);
}

io::BatchReaderOptions ReplicaBatches::reading(const std::string& split, const io::Shard& rows,
                                               const char* timeline_track) const {
  io::BatchReaderOptions options;
  options.path = data_.path;
  options.split = split;
  options.shard = rows;
  options.batch_size = config_.train.batch_size;
  options.prefetch = config_.data.prefetch;
  options.timeline_track = timeline_track;
  options.expected_stamp = data_.stamp;
  return options;
}

std::unique_ptr<io::BatchSource> ReplicaBatches::open(const io::BatchReaderOptions& options) const {
  if (replica_.device() == models::DeviceKind::kCuda) {
    return io::make_device_batch_source(options, gpu_, replica_.stream(), std::max(2, options.prefetch));
  }
  return io::make_host_batch_source(options);
}

double macro_f1(const models::BatchStats& stats, int classes) {
  if (classes == 2 || stats.confusion.empty()) return -1;
  return classification_report(stats.confusion, classes).macro_f1;
}

void Evaluator::add_held_out(EpochMetrics& m, const io::RowSet& rows, int64_t global_step) {
  const auto start = std::chrono::steady_clock::now();
  const models::BatchStats held_out = evaluate(rows, global_step);
  m.eval_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.held_out = rows.name;
  m.val_loss = held_out.loss_sum / static_cast<double>(held_out.count);
  m.val_acc = static_cast<double>(held_out.correct) / static_cast<double>(held_out.count);
  m.val_macro_f1 = macro_f1(held_out, replica_.layout().shape().classes);
}

models::BatchStats Evaluator::evaluate(const io::RowSet& rows, int64_t global_step) {
  timeline::Span span("evaluation");
  if (rows.shard.size() > 0) {
    std::unique_ptr<io::BatchSource> source = batches_.in_order(rows);
    while (const std::optional<BatchView> batch = source->next()) {
      replica_.evaluate(*batch);
      ranks_.watchdog.beat(global_step);
    }
  }
  const models::BatchStats local = replica_.take_stats();
  // The confusion counts travel with the sums, classes x classes on every rank (zeros where a replica
  // keeps none, a GPU's); they count only when they cover every row.
  const auto classes = static_cast<std::size_t>(replica_.layout().shape().classes);
  std::vector<double> sums{local.loss_sum, static_cast<double>(local.correct),
                           static_cast<double>(local.count)};
  sums.resize(3 + classes * classes, 0.0);
  for (std::size_t i = 0; i < local.confusion.size() && i < classes * classes; ++i)
    sums[3 + i] = static_cast<double>(local.confusion[i]);
  ranks_.comm.sum(sums);
  models::BatchStats total{sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2]), {}};
  std::vector<int64_t> confusion(classes * classes);
  int64_t counted = 0;
  for (std::size_t i = 0; i < confusion.size(); ++i)
    counted += confusion[i] = static_cast<int64_t>(sums[3 + i]);
  if (counted == total.count && total.count > 0) total.confusion = std::move(confusion);
  return total;
}

}  // namespace ddp::engine

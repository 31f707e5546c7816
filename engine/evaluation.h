// Batches read into a replica's memory, and a split's loss and accuracy summed over the training ranks: the
// validation rows after each epoch, the test rows on best.h5's model at the end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/config.h"
#include "engine/metrics.h"
#include "engine/training_setup.h"
#include "io/batch_reader.h"
#include "io/batch_source.h"
#include "io/data_plan.h"
#include "io/dataset.h"
#include "models/replica.h"

namespace ddp::engine {

// Batches read into a replica's memory: a GPU replica (on CUDA device `gpu`) gets them through the
// copy-stream pipeline.
class ReplicaBatches {
 public:
  ReplicaBatches(const Config& config, const io::DatasetInfo& data, models::Replica& replica, int gpu)
      : config_(config), data_(data), replica_(replica), gpu_(gpu) {}

  // The batches of `epoch` of the training shard `rows`, in the epoch's order shuffled from `seed`: `count`
  // full batches from batch `first` on.
  std::unique_ptr<io::BatchSource> training(const io::Shard& rows, uint64_t seed, int64_t epoch,
                                            int64_t first, int64_t count) const;
  // `rows` in their order, the last batch short.
  std::unique_ptr<io::BatchSource> in_order(const io::RowSet& rows) const;

 private:
  std::unique_ptr<io::BatchSource> open(const io::BatchReaderOptions& options) const;
  // What every reader of this replica shares: the file, `split`'s `rows`, the batch size and prefetch depth.
  io::BatchReaderOptions reading(const std::string& split, const io::Shard& rows,
                                 const char* timeline_track) const;

  const Config& config_;
  const io::DatasetInfo& data_;
  models::Replica& replica_;
  int gpu_;
};

// Macro-F1 of evaluated stats, for more than two classes; -1 otherwise or where they were not counted.
double macro_f1(const models::BatchStats& stats, int classes);

class Evaluator {
 public:
  // `batches` reads into `replica`.
  Evaluator(const ReplicaBatches& batches, models::Replica& replica, const TrainingRanks& ranks)
      : batches_(batches), replica_(replica), ranks_(ranks) {}

  // Collective over the training ranks: the loss and accuracy over every row of `rows` (each rank reads its
  // shard), with the confusion counts where every replica keeps them. Each batch beats the watchdog at
  // `global_step`.
  models::BatchStats evaluate(const io::RowSet& rows, int64_t global_step);
  // Collective as evaluate(): the epoch's held-out metrics (loss, accuracy, macro-F1, time) on `rows`.
  void add_held_out(EpochMetrics& m, const io::RowSet& rows, int64_t global_step);

 private:
  const ReplicaBatches& batches_;
  models::Replica& replica_;
  TrainingRanks ranks_;
};

}  // namespace ddp::engine

// Batches read into a replica's memory, and a split's loss and accuracy summed over the training ranks: the
// validation rows after each epoch, the test rows on best.h5's model at the end.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/config.h"
#include "engine/training_setup.h"
#include "io/batch_reader.h"
#include "io/batch_source.h"
#include "io/data_plan.h"
#include "io/dataset.h"
#include "models/replica.h"

namespace ddp::engine {

// `options`' batches in the replica's memory: a GPU replica (on CUDA device `gpu`) gets them through the
// copy-stream pipeline.
std::unique_ptr<io::BatchSource> replica_batch_source(models::Replica& replica, int gpu,
                                                      const io::BatchReaderOptions& options);

// Macro-F1 of evaluated stats, for more than two classes; -1 otherwise or where they were not counted.
double macro_f1(const models::BatchStats& stats, int classes);

class Evaluator {
 public:
  Evaluator(const Config& config, const io::DatasetInfo& data, models::Replica& replica,
            const TrainingRanks& ranks)
      : config_(config), data_(data), replica_(replica), ranks_(ranks) {}

  // Collective over the training ranks: the loss and accuracy over every row of `rows` (each rank reads its
  // shard), with the confusion counts where every replica keeps them. Each batch beats the watchdog at
  // `global_step`.
  models::BatchStats evaluate(const io::RowSet& rows, int64_t global_step);

 private:
  const Config& config_;
  const io::DatasetInfo& data_;
  models::Replica& replica_;
  TrainingRanks ranks_;
};

}  // namespace ddp::engine

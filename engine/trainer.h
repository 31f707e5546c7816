// The data-parallel training loop. One TrainingRun per training rank; all of them run the same steps in the
// same order:
//
//   batch <- BatchReader (this rank's shard, prefetched)      io/
//   forward + backward on the replica                         models/
//   the update (engine/updater.h):                            comm/, engine/optimizer
//     all-reduce (mpi, nccl): each finished gradient segment -> start_average(); finish_average(); the
//       optimizer step on the flat buffer
//     parameter server (ps): push the gradients, pull the servers' parameters (engine/ps_updater.h)
//   after each epoch: sharded evaluation, summed over the training ranks (evaluation.h); rank 0 prints,
//   appends metrics.jsonl and writes last.h5 / best.h5 (epoch_record.h)
//   at the end: the test rows scored on best.h5 (test_score.h)
// Before the first step comes the start-up (training_startup.h): the device, a fresh start or a resume, the
// starting point handed to every replica, and the start log.
//
// Rank 0's initial parameters (or the resumed checkpoint) are broadcast, so every replica starts identical
// and, averaging bit-identical gradients (or pulling the same parameters), stays identical; in the parameter
// server's async mode the workers drift apart within a run of steps and meet again at its end. With the
// parameter server's dedicated layout the last comm.ps_servers ranks do not train: they serve their shards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/epoch_record.h"
#include "engine/metrics.h"
#include "engine/training_setup.h"
#include "engine/updater.h"
#include "io/dataset.h"
#include "models/replica.h"

namespace ddp::engine {

struct TrainResult {
  std::vector<EpochMetrics> history;  // the epochs this invocation trained (empty on a parameter server)
  std::vector<float> params;          // the final parameters (identical on every rank)
  std::string run_id;                 // on the first training rank (engine/run_directory.h)
  bool stopped_by_signal = false;     // a training rank got a stop signal; last.h5 holds the progress
  int stop_signal = 0;      // which one (SIGINT, ...; engine::stop_signal_name), agreed by the training ranks
  int64_t epochs_done = 0;  // where the run stands at the end (last.h5 holds the same on a stop)
  int64_t steps_done_in_epoch = 0;
};

// One rank's training, the epoch loop: every rank of the all-reduce backends and of the colocated parameter
// server, or a worker of the dedicated one (training_job.h makes it).
class TrainingRun {
 public:
  // `ranks` are the training ranks (training_setup.h); `backend_reason` goes into the start log;
  // `epoch_written` is called on rank 0 after each epoch's record (epoch_record.h). Throws UserError (the
  // same on every rank) for problems found before the first step.
  TrainingRun(const Config& config, const TrainingRanks& ranks, const io::DatasetInfo& data,
              std::unique_ptr<models::Replica> replica, std::unique_ptr<Updater> updater,
              std::string backend_reason, EpochWritten epoch_written);
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // Trains the remaining epochs (or until a stop signal), then scores best.h5 on the test rows.
  TrainResult run();

 private:
  class Loop;
  std::unique_ptr<Loop> loop_;
};

}  // namespace ddp::engine

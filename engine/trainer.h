// The data-parallel training loop. One TrainingRun per training rank; all of them run the same steps in the
// same order:
//
//   batch <- BatchReader (this rank's shard, prefetched)      io/
//   forward + backward on the replica                         models/
//   the update (engine/updater.h):                            comm/, engine/optimizer
//     all-reduce (mpi, nccl): each finished gradient segment -> start_average(); finish_average(); the
//       optimizer step on the flat buffer
//     parameter server (ps): push the gradients, pull the servers' parameters (engine/ps_updater.h)
//   after each epoch: sharded evaluation, summed over the training ranks; rank 0 prints, appends
//   metrics.jsonl and writes last.h5 / best.h5                engine/metrics, engine/checkpoint
//
// Rank 0's initial parameters (or the resumed checkpoint) are broadcast, so every replica starts identical
// and, averaging bit-identical gradients (or pulling the same parameters), stays identical; in the parameter
// server's async mode the workers drift apart within a run of steps and meet again at its end. With the
// parameter server's dedicated layout the last comm.ps_servers ranks do not train: they serve their shards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "engine/config.h"
#include "engine/metrics.h"
#include "engine/preemption.h"
#include "engine/run_directory.h"
#include "engine/topology.h"
#include "engine/updater.h"
#include "engine/watchdog.h"
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

// Called on rank 0 after each epoch's line is in the run directory's metrics.jsonl, before its checkpoint
// (the application redraws the learning curves there). A UserError it throws ends the job.
using EpochWritten = std::function<void(const RunFiles& files)>;

// One rank's training, the epoch loop: every rank of the all-reduce backends and of the colocated parameter
// server, or a worker of the dedicated one (training_job.h makes it). `comm` spans the ranks that train (data
// shards, metrics, evaluation, errors agreed on, the start-up log); they are the job's first ranks, and
// `job_size` counts them with the dedicated parameter servers, which only the updater talks to.
// Steps per epoch of each of `trainers` training ranks on `data` (every rank's shard has the same rows;
// train.max_steps_per_epoch caps it), and of the whole run (train.epochs of them).
int64_t steps_per_epoch(const Config& config, const io::DatasetInfo& data, int trainers);
int64_t planned_steps(const Config& config, const io::DatasetInfo& data, int trainers);

class TrainingRun {
 public:
  // `stop_signal` spans the ranks of `comm`. `watchdog` is told each phase and beaten at every step and
  // evaluation batch; with `exchange_has_deadlines` (the parameter server's protocol, which names the rank it
  // waits for) it is paused wherever that protocol waits. Throws UserError (the same on every rank) for
  // problems found before the first step.
  TrainingRun(const Config& config, const Topology& topology, int job_size, comm::HostGroup& comm,
              StopAgreement& stop_signal, std::string backend_reason,
              std::unique_ptr<models::Replica> replica, std::unique_ptr<Updater> updater,
              const io::DatasetInfo& data, ProgressWatchdog& watchdog, bool exchange_has_deadlines,
              EpochWritten epoch_written);
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

// What a run keeps of its epochs. After each epoch: the replicas' parameters checked equal, the metrics line
// on rank 0's stdout (with a warning once the loss is no longer a number), its record in metrics.jsonl, the
// application's hook (the learning curves), last.h5 and, for the best epoch so far, best.h5. In the middle of
// an epoch (a stop, checkpoint.every_steps): last.h5 alone. Every method is collective over the training
// ranks; rank 0 writes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/base/process_age.h"
#include "engine/checkpoint.h"
#include "engine/gpu_monitor.h"
#include "engine/metrics.h"
#include "engine/run_directory.h"
#include "engine/training_setup.h"
#include "engine/updater.h"
#include "models/replica.h"

namespace ddp::engine {

// Called on rank 0 after each epoch's line is in the run directory's metrics.jsonl, before its checkpoint
// (the application redraws the learning curves there). A UserError it throws ends the job.
using EpochWritten = std::function<void(const RunFiles& files)>;

class EpochRecorder {
 public:
  // `record` and `config_ini` (rank 0's, from start_run) go into every checkpoint; `gpu_monitor` may be null
  // (a CPU rank, no NVML).
  EpochRecorder(const TrainingRanks& ranks, RunFiles files, RunRecord record, std::string config_ini,
                models::Replica& replica, Updater& updater, std::unique_ptr<GpuMonitor> gpu_monitor,
                EpochWritten epoch_written);

  // After a run of steps: data parallelism keeps every replica's parameters equal bit for bit
  // (Updater::end_steps). A rank whose parameters differ from rank 0's (a reduction that is not the same on
  // every rank, a faulty device or memory) ends the job here, naming it, instead of training on as a
  // silently different model; the checkpoints of earlier epochs stay. Rank 0 keeps the checksum every rank
  // agreed on for the epoch's metrics.
  void check_parameters_agree(int64_t epoch);
  // What the record knows of the epoch `m`: the agreed checksum, the ranks, the backend, the device, the
  // start-up's length (the process's first epoch), and the GPU's utilization and memory since the last epoch
  // (the mean over the ranks that have a reading).
  void add_run_facts(EpochMetrics& m);
  // A step begins: the process's first step marks its start-up's end (start_to_first_step_s, in the
  // first epoch's metrics).
  void step_begins() {
    if (start_to_first_step_s_ < 0) start_to_first_step_s_ = seconds_since_process_start();
  }
  // The epoch's training loss and accuracy: this rank's `local` stats summed over the ranks, with the sums
  // an interrupted run had carried over to this epoch (`progress`, rank 0's).
  void add_training_stats(EpochMetrics& m, const models::BatchStats& local, const TrainingProgress& progress);
  // The finished epoch `m`: its line, metrics.jsonl, the hook, last.h5 with `progress`, and best.h5 if
  // `best`.
  void record_epoch(const EpochMetrics& m, const TrainingProgress& progress, bool best);
  // last.h5 in the middle of an epoch: `progress` with this rank's running sums (`local`) added up.
  void record_mid_epoch(const models::BatchStats& local, const TrainingProgress& progress);

  const std::string& run_id() const { return record_.run_id; }

 private:
  // Rank 0 writes last.h5 (`progress`), the optimizer state gathered one buffer at a time, then every
  // replica's random state; `before` runs on rank 0 first.
  void write_last_checkpoint(const TrainingProgress& progress, const std::function<void()>& before,
                             bool best);
  // Collective: the loss scaling of the ranks that scale (fp16 on a GPU), none where no rank does.
  std::optional<models::LossScale::State> loss_scaling_of_the_ranks();
  void print_and_append(const EpochMetrics& m);
  // Collective: `local` summed over the ranks, plus `progress`' sums: loss, correct and count.
  std::vector<double> sums_over_ranks(const models::BatchStats& local, const TrainingProgress& progress);

  TrainingRanks ranks_;
  RunFiles files_;
  RunRecord record_;        // rank 0: what its checkpoints say about the run
  std::string config_ini_;  // rank 0: the effective configuration the checkpoints record
  models::Replica& replica_;
  Updater& updater_;
  std::unique_ptr<GpuMonitor> gpu_monitor_;
  EpochWritten epoch_written_;
  std::vector<float> host_params_;  // the parameters' host copy, for the checksum and the checkpoints
  std::string checksum_;            // rank 0: the last one the ranks agreed on
  bool warned_diverged_ = false;
  double start_to_first_step_s_ = -1;  // from the process's start to its first step, once it began
  bool first_step_reported_ = false;   // in the process's first epoch's metrics
};

}  // namespace ddp::engine

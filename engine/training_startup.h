// A training rank's start-up, everything before the first step: the device prepared for the run's batch
// shapes (and a GPU's self-check), the run started afresh or resumed (run_start.h), every replica given the
// starting parameters and optimizer state (and, resumed, its random state back), the start log, the resume
// recorded in metrics.jsonl, the training rows' class balance, and the GPU monitor started.
#pragma once

#include <memory>
#include <string>

#include "engine/checkpoint.h"
#include "engine/gpu_monitor.h"
#include "engine/run_directory.h"
#include "engine/training_setup.h"

namespace ddp::engine {

// Where the run starts, the same on every training rank but for rank 0's own parts.
struct StartedRun {
  TrainingProgress progress;
  bool resumed = false;             // continues last.h5 (decided by rank 0)
  bool finished = false;            // the resumed run had already trained every epoch
  bool test_score_missing = false;  // ... or had stopped early, but had not scored its test split
  RunRecord record;                 // rank 0: what its checkpoints say about the run
  std::string config_ini;           // rank 0: the effective configuration the checkpoints record
  std::shared_ptr<RunDirectoryLock> directory_lock;  // rank 0: to be held while the run lasts
  std::unique_ptr<GpuMonitor> gpu_monitor;           // null on a CPU rank or without NVML
};

// Collective over the training ranks (the updater's distribution over the whole job). `backend_reason`: the
// start log's backend line. Throws UserError, the same on every rank, for problems found before the first
// step.
StartedRun start_training(const TrainingSetup& setup, const std::string& backend_reason);

}  // namespace ddp::engine

// The start log's facts, gathered from the training ranks for start_log.h to word: where each rank runs and
// on what, the backend, the data, the model, the optimizer, and where the run starts.
#pragma once

#include <string>

#include "engine/checkpoint.h"
#include "engine/start_log.h"
#include "engine/training_setup.h"

namespace ddp::engine {

// Collective over the training ranks: every rank's line, then the dedicated servers', then the run's, on
// rank 0's stdout. `self_check_summary`: this rank's GPU self-check ("" without one); `start`, `progress` and
// `run_id` (rank 0's): where the run starts, how far a resumed run had come, which run it is.
void log_start(const TrainingSetup& setup, const std::string& backend_reason,
               const std::string& self_check_summary, RunStartFacts::Start start,
               const TrainingProgress& progress, const std::string& run_id);

}  // namespace ddp::engine

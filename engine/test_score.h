// The test split's score: once at the end of a run, on the model in best.h5 (the one validation chose), as
// the last line of the run's output and metrics.jsonl.
#pragma once

#include <cstdint>
#include <string>

#include "engine/evaluation.h"
#include "engine/run_directory.h"
#include "engine/training_setup.h"
#include "io/data_plan.h"
#include "models/replica.h"

namespace ddp::engine {

// Collective over the training ranks: whether run `run_id` (rank 0's) has no test score in its metrics.jsonl
// yet, the same answer on every rank. A run stopped while it scored its test split (the last thing it does,
// after its last epoch or its early stop) scores it on resuming.
bool test_score_missing(const TrainingRanks& ranks, const RunFiles& files, const std::string& run_id);

// Collective over the training ranks: best.h5's parameters (read by rank 0) in every replica, the `test` rows
// evaluated; rank 0 prints the test line and appends it to metrics.jsonl for run `run_id`.
void score_best_on_test(const TrainingRanks& ranks, const RunFiles& files, const std::string& run_id,
                        models::Replica& replica, Evaluator& evaluator, const io::RowSet& test,
                        int64_t global_step);

}  // namespace ddp::engine

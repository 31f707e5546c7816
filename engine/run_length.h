// How long a run trains: the steps of an epoch and of the whole run, and when it stops early.
#pragma once

#include <cstdint>
#include <string>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "io/dataset.h"

namespace ddp::engine {

// Steps per epoch of each of `trainers` training ranks on `data` (every rank's shard has the same rows;
// train.max_steps_per_epoch caps it), and of the whole run (train.epochs of them).
int64_t steps_per_epoch(const Config& config, const io::DatasetInfo& data, int trainers);
int64_t planned_steps(const Config& config, const io::DatasetInfo& data, int trainers);

// Whether train.stop_after_steps is reached at `progress`: the run stops there, with last.h5 written.
bool stop_after_steps_reached(const Config& config, const TrainingProgress& progress);
// What a run that reached train.stop_after_steps says, `trained_now` (some of the steps) or not (a resumed
// run that was already there: without the line its exit 0 would look like a finished run's).
std::string stop_after_steps_line(const Config& config, const TrainingProgress& progress, bool trained_now);

// Whether train.early_stopping_patience epochs have passed without a lower held-out loss by `progress`: the
// run stops early (the same answer on every rank, whose progress is the same).
bool patience_spent(const Config& config, const TrainingProgress& progress);
// What the early stop says: `held_out` ("val" or "test") has not improved since the epoch best.h5 holds.
std::string early_stop_line(const Config& config, const TrainingProgress& progress,
                            const std::string& held_out);

}  // namespace ddp::engine

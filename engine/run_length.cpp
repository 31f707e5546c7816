#include "engine/run_length.h"

#include <fmt/format.h>

#include <algorithm>

#include "engine/run_directory.h"
#include "io/batch_reader.h"
#include "io/data_plan.h"

namespace ddp::engine {

int64_t steps_per_epoch(const Config& config, const io::DatasetInfo& data, int trainers) {
  const io::DataPlan plan =
      io::plan_data(data, config.data.validation, config.data.validation_split, 0, trainers);
  const int64_t per_epoch =
      io::BatchReader::batches_per_epoch(plan.train.size(), config.train.batch_size, /*drop_last=*/true);
  return config.train.max_steps_per_epoch > 0 ? std::min(per_epoch, config.train.max_steps_per_epoch)
                                              : per_epoch;
}

int64_t planned_steps(const Config& config, const io::DatasetInfo& data, int trainers) {
  return steps_per_epoch(config, data, trainers) * config.train.epochs;
}

bool stop_after_steps_reached(const Config& config, const TrainingProgress& progress) {
  return config.train.stop_after_steps > 0 && progress.global_step >= config.train.stop_after_steps;
}

std::string stop_after_steps_line(const Config& config, const TrainingProgress& progress, bool trained_now) {
  return fmt::format(
      "{} {} steps (train.stop_after_steps {}): {} holds them; --resume with a larger "
      "train.stop_after_steps, or 0, continues",
      trained_now ? "stopped after" : "already at", progress.global_step, config.train.stop_after_steps,
      RunFiles{config.checkpoint.dir}.last());
}

bool patience_spent(const Config& config, const TrainingProgress& progress) {
  const int patience = config.train.early_stopping_patience;
  return patience > 0 && progress.epoch > 0 && progress.epoch - progress.best_epoch >= patience;
}

std::string early_stop_line(const Config& config, const TrainingProgress& progress,
                            const std::string& held_out) {
  return fmt::format(
      "early stopping: {}_loss has not improved for {} epoch(s) since epoch {} "
      "(train.early_stopping_patience = {}); best.h5 holds epoch {}",
      held_out, progress.epoch - progress.best_epoch, progress.best_epoch,
      config.train.early_stopping_patience, progress.best_epoch);
}

}  // namespace ddp::engine

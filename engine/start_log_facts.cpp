#include "engine/start_log_facts.h"

#include <fmt/format.h>

#include <cstdio>
#include <utility>
#include <vector>

namespace ddp::engine {
namespace {

RankStartFacts this_rank(const TrainingSetup& setup, const std::string& self_check_summary) {
  const Topology& topology = setup.ranks.topology;
  RankStartFacts rank;
  rank.rank = setup.ranks.comm.rank();  // the training ranks are the job's first
  rank.ranks = setup.ranks.job_size;
  rank.local_rank = topology.local_rank;
  rank.local_ranks = topology.local_size;
  rank.host = topology.host;
  rank.device = topology.gpu >= 0
                    ? topology.device + " " + topology.gpu_name + " (PCI " + topology.gpu_bus_id + ")"
                    : topology.device;
  if (const std::string kernels = setup.replica.recurrent_kernels(); !kernels.empty())
    rank.device += ", " + kernels;
  if (const std::string step = setup.updater.step_note(); !step.empty()) rank.device += ", " + step;
  if (!self_check_summary.empty()) rank.device += ", " + self_check_summary;
  rank.device_reason = topology.device_reason;
  rank.train_rows = setup.plan.train;
  return rank;
}

// What the model is beyond its layers, where it differs from the Keras model.
std::string model_extras(const Config& config, const models::ModelShape& shape) {
  std::string extras;
  if (config.model.mask_padding) extras += ", masked";
  if (config.model.dropout > 0) {
    // PyTorch warns alike: dropout acts between stacked layers, so one layer leaves it idle.
    extras += shape.layers > 1 ? fmt::format(", dropout {}", config.model.dropout)
                               : fmt::format(
                                     ", dropout {} idle (it acts between stacked layers, "
                                     "and model.layers = 1)",
                                     config.model.dropout);
  }
  if (config.model.embedding_dropout > 0)
    extras += fmt::format(", embedding dropout {}", config.model.embedding_dropout);
  if (shape.classes != 2) extras += fmt::format(", {} classes", shape.classes);
  if (config.model.precision != "fp32") {
    extras += fmt::format(", {} recurrent math on GPU ranks (CPU ranks compute in float32)",
                          config.model.precision);
  }
  return extras;
}

// The backend, the data, the model and the optimizer.
RunStartFacts what_trains(const TrainingSetup& setup, const std::string& backend_reason) {
  const Config& config = setup.config;
  const models::ModelShape& shape = setup.replica.layout().shape();
  RunStartFacts run;
  run.backend_reason = backend_reason;
  run.data_path = setup.data.path;
  run.vocab_size = setup.data.vocab_size;
  run.maxlen = setup.data.maxlen;
  run.data_plan = setup.plan.describe() + setup.plan.notes();
  run.embedding_dim = shape.embedding_dim;
  run.layers = shape.layers;
  run.rnn = (shape.bidirectional ? "bidirectional " : "") +
            std::string(shape.cell == models::Cell::kGru ? "GRU" : "LSTM");
  run.model_extras = model_extras(config, shape);
  run.hidden = shape.hidden;
  run.parameters = setup.replica.layout().total_size();
  run.optimizer = setup.updater.optimizer_name();
  if (config.train.optimizer != "sgd" && config.train.momentum > 0)
    run.optimizer += fmt::format(" (train.momentum = {} idle: it is sgd's)", config.train.momentum);
  run.learning_rate = config.train.learning_rate;
  run.batch_size = config.train.batch_size;
  run.trainers = setup.ranks.comm.size();
  run.trainers_name = setup.ranks.name();
  run.steps_per_epoch = setup.steps_per_epoch;
  return run;
}

}  // namespace

void log_start(const TrainingSetup& setup, const std::string& backend_reason,
               const std::string& self_check_summary, RunStartFacts::Start start,
               const TrainingProgress& progress, const std::string& run_id) {
  std::vector<std::string> rank_lines =
      setup.ranks.comm.gather(rank_start_line(this_rank(setup, self_check_summary)), 0);
  if (!setup.ranks.is_root()) return;
  for (std::string& line : setup.updater.server_lines()) rank_lines.push_back(std::move(line));

  RunStartFacts run = what_trains(setup, backend_reason);
  const RunFiles files{setup.config.checkpoint.dir};
  run.start = start;
  run.run_id = run_id;
  run.run_dir = files.dir.string();
  run.checkpoint = files.last();
  run.epochs_done = progress.epoch;
  run.steps_done = progress.checkpoint_step_in_epoch;  // the resumed checkpoint's, in its own steps
  run.epochs = setup.config.train.epochs;
  for (const std::string& line : start_log_lines(run, rank_lines)) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

}  // namespace ddp::engine

#include "engine/run_start.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "engine/metrics.h"
#include "io/dataset_fingerprint.h"
#include "io/tokenizer.h"
#include "models/initializers.h"

namespace ddp::engine {
namespace {

void write_effective_config(const RunFiles& files, const std::string& config_ini) {
  errno = 0;
  std::ofstream out(files.config());
  out << config_ini;
  out.flush();
  if (!out) {
    throw UserError(files.config() + ": cannot write the effective config (" + write_error_reason() + ")");
  }
}

// Rank 0: makes the directory, locks it and claims it for this run; writes the effective config. Returns
// whether the run continues last.h5.
bool claim_directory(const Config& config, const RunFiles& files, std::shared_ptr<RunDirectoryLock>& lock) {
  lock = RunDirectoryLock::hold(files);
  const bool resumed = claim_run_directory(files, config.resume, config.checkpoint.overwrite);
  write_effective_config(files, config.to_ini());
  return resumed;
}

RunRecord describe_run(const io::DatasetInfo& data, const io::DataPlan& plan) {
  RunRecord record;
  record.run_id = new_run_id();
  record.data_path = data.path;
  record.data_fingerprint = io::dataset_fingerprint(data);
  record.data_plan = plan.describe();
  record.maxlen = data.maxlen;
  if (data.has_vocab) record.vocabulary = io::read_vocabulary(data.path).words();
  record.class_names = data.class_names;
  record.tokenizer = data.tokenizer;
  return record;
}

// Fine-tuning on data whose vocabulary gives some ids other words: each such id's embedding row keeps what
// it learned for its old word. Said with the count and the first one (ids 0-2 are reserved).
void warn_of_moved_words(const RunFiles& files, const Checkpoint& c, const RunRecord& now) {
  if (!c.has_vocabulary || now.vocabulary.empty()) return;
  const std::vector<std::string> before = io::read_vocabulary(files.last()).words();
  const std::size_t shared = std::min(before.size(), now.vocabulary.size());
  const auto first_word = static_cast<std::size_t>(io::kFirstWordId);
  std::size_t moved = 0;
  std::size_t first = 0;
  for (std::size_t id = first_word; id < shared; ++id) {
    if (before[id] == now.vocabulary[id]) continue;
    if (moved++ == 0) first = id;
  }
  if (moved == 0) return;
  std::printf(
      "warning: %zu of the %zu word ids name other words in %s than in the checkpoint's vocabulary (id %zu: "
      "\"%s\", now \"%s\"): their embedding rows start from what they learned for the old words\n",
      moved, shared - first_word, now.data_path.c_str(), first, one_line(before[first]).c_str(),
      one_line(now.vocabulary[first]).c_str());
}

// The checkpoint must continue on the data it was trained on, unless checkpoint.allow_data_change. True when
// the data changed (and that was allowed).
bool check_resumed_data(const Config& config, const RunFiles& files, const Checkpoint& c,
                        const RunRecord& now) {
  if (c.run.data_fingerprint.empty() || c.run.data_fingerprint == now.data_fingerprint) return false;
  const std::string what = files.last() + " was trained on " + c.run.data_path + " (" +
                           c.run.data_fingerprint + ") but data.path " + now.data_path + " is (" +
                           now.data_fingerprint + ")";
  if (!config.checkpoint.allow_data_change) {
    throw UserError("--resume: " + what +
                    ": resume on the same data, or set checkpoint.allow_data_change = true to continue "
                    "training on this data");
  }
  std::printf("note: %s; continuing on the new data (checkpoint.allow_data_change)\n", what.c_str());
  warn_of_moved_words(files, c, now);
  return true;
}

// Another data.validation or data.validation_split changes which rows train: said, not refused. True when
// they changed.
bool note_changed_data_plan(const RunFiles& files, const Checkpoint& c, const RunRecord& now) {
  if (c.run.data_plan.empty() || c.run.data_plan == now.data_plan) return false;
  std::printf(
      "warning: %s was trained on rows \"%s\"; this run's are \"%s\": the rows it trains on change from here "
      "on\n",
      files.last().c_str(), c.run.data_plan.c_str(), now.data_plan.c_str());
  return true;
}

// A val_loss measured on other rows says nothing of the model on these: the best epoch is chosen afresh
// among the epochs judged on this run's data (the first of them replaces best.h5), and early stopping's
// patience counts from here.
void choose_best_afresh(const RunFiles& files, TrainingProgress& p) {
  if (p.epoch < 1) return;
  std::printf(
      "note: %s (epoch %lld, val_loss %.4f) was judged on other rows: the next epoch replaces it, and the "
      "best epoch and early stopping count from there\n",
      files.best().c_str(), static_cast<long long>(p.best_epoch), p.best_val_loss);
  p.best_val_loss = std::numeric_limits<double>::infinity();
  p.best_epoch = p.epoch;
}

// best.h5 lost or stale after it was chosen: the job killed while copying last.h5 to it leaves no best.h5 (a
// first one) or the earlier best epoch's (the copy goes through best.h5.tmp). Where last.h5 was written at
// the end of the best epoch it holds that epoch's model and is copied over; otherwise the next epoch takes
// the place of the lost one, so the run still ends with its best model to score on its test split, never an
// older one.
void restore_best(const RunFiles& files, TrainingProgress& p) {
  std::error_code ec;
  if (p.epoch < 1) return;
  std::string state = "is missing";
  if (std::filesystem::exists(std::filesystem::symlink_status(files.best(), ec))) {
    int64_t held = -1;
    try {
      held = read_checkpoint(files.best(), CheckpointParts::kModel).progress.epoch;
    } catch (const UserError&) {
      // Unreadable: replaced as a missing one is.
    }
    if (held == p.best_epoch) return;
    state = held < 0 ? "cannot be read" : fmt::format("holds epoch {}, not the best one", held);
    // A damaged best.h5 is kept aside, not overwritten: what it held may still be recovered by hand.
    const std::string aside = files.best() + ".damaged";
    if (held < 0 && (std::filesystem::rename(files.best(), aside, ec), !ec)) state += ", kept as " + aside;
  }
  if (p.best_epoch == p.epoch && p.step_in_epoch == 0) {
    copy_checkpoint(files.last(), files.best());
    std::printf("note: %s %s; restored from %s, which holds the best epoch %lld\n", files.best().c_str(),
                state.c_str(), files.last().c_str(), static_cast<long long>(p.epoch));
    return;
  }
  p.best_val_loss = std::numeric_limits<double>::infinity();
  std::printf(
      "warning: %s %s (the best epoch %lld was lost) and %s holds a later model: the next epoch becomes "
      "best.h5, and the better epochs after it replace it as usual\n",
      files.best().c_str(), state.c_str(), static_cast<long long>(p.best_epoch), files.last().c_str());
}

// best.h5 written by another run (a file copied in by hand) would be scored as this run's best and replaced
// by its next better epoch: refused while it can still be moved away. One that cannot be read as a
// checkpoint is left to be replaced, as before.
void refuse_another_runs_best(const RunFiles& files, const std::string& run_id) {
  std::error_code ec;
  if (run_id.empty() || !std::filesystem::is_regular_file(files.best(), ec)) return;
  std::string best_run;
  try {
    best_run = read_checkpoint_run_id(files.best());
  } catch (const UserError&) {
    return;
  }
  if (!best_run.empty() && best_run != run_id) {
    throw UserError(files.best() + " was written by run " + best_run + ", not by run " + run_id + " that " +
                    files.last() +
                    " continues: move it out of the directory (the run then "
                    "chooses its best epoch afresh)");
  }
}

// Rank 0: last.h5's parameters, optimizer state and progress, checked against the run.
void resume_from_checkpoint(const Config& config, const RunFiles& files, const models::ParamLayout& layout,
                            const optim::OptimizerSettings& optimizer, int trainers, int64_t steps_per_epoch,
                            RunStart& start, std::vector<std::string>& rng_states) {
  Checkpoint c = read_checkpoint(files.last());
  if (!c.run.run_id.empty()) start.record.run_id = c.run.run_id;  // a resumed run keeps its id
  if (!(c.shape == layout.shape())) {
    // describe() names the layers and classes where they are not the defaults.
    auto text = [](const models::ModelShape& s) {
      return models::describe(s) + ", vocab " + std::to_string(s.vocab_size) + ", embedding " +
             std::to_string(s.embedding_dim) + ", hidden " + std::to_string(s.hidden);
    };
    throw UserError(files.last() + ": the checkpoint's model (" + text(c.shape) +
                    ") differs from the config's and the dataset's (" + text(layout.shape()) + ")");
  }
  // Masking changes what the same weights compute, as the cell does.
  if (c.run.mask_padding != config.model.mask_padding) {
    throw UserError(files.last() + ": the checkpoint's model was trained with model.mask_padding = " +
                    (c.run.mask_padding ? "true" : "false") + ", the config asks for " +
                    (config.model.mask_padding ? "true" : "false"));
  }
  if (c.optimizer_name != optimizer.name) {
    throw UserError(files.last() + ": checkpoint was trained with " + c.optimizer_name +
                    ", the config asks for train.optimizer = " + optimizer.name);
  }
  optim::check_optimizer_state(optimizer, layout.total_size(), c.optimizer, files.last());
  // The notes on changed data come after the refusals above, so that a refused resume says one line.
  const bool data_changed = check_resumed_data(config, files, c, start.record);
  const bool rows_changed = note_changed_data_plan(files, c, start.record);
  start.params = std::move(c.params);
  start.optimizer = std::move(c.optimizer);
  rng_states = std::move(c.replica_rng_states);
  start.progress = c.progress;
  TrainingProgress& p = start.progress;
  p.checkpoint_step_in_epoch = p.step_in_epoch;
  if (const std::vector<std::string> changed = changed_training_settings(c.config_ini, config);
      !changed.empty()) {
    std::string list;
    for (const std::string& setting : changed) list += (list.empty() ? "" : ", ") + setting;
    std::printf("note: %s was trained with other settings; from here on the run trains with %s\n",
                files.last().c_str(), list.c_str());
  }
  if (p.seed != config.train.seed) {
    std::printf("note: %s was trained with train.seed = %llu; its data order continues with that seed\n",
                files.last().c_str(), static_cast<unsigned long long>(p.seed));
    Config effective = config;
    effective.train.seed = p.seed;
    start.config_ini = effective.to_ini();
    write_effective_config(files, start.config_ini);
  }
  if (p.world_size != trainers || p.batch_size != config.train.batch_size) {
    std::printf(
        "warning: %s was written by %lld training ranks x batch %lld; resuming with %d x %d changes the data "
        "order from here on\n",
        files.last().c_str(), static_cast<long long>(p.world_size), static_cast<long long>(p.batch_size),
        trainers, config.train.batch_size);
    // The interrupted epoch's samples, counted in this run's steps, so that the epoch still trains on about
    // one pass of the data (its steps counted in the old ones would train more or less than that).
    if (p.step_in_epoch > 0 && p.batch_size > 0) {
      const int64_t samples = p.step_in_epoch * p.world_size * p.batch_size;
      const int64_t steps = samples / (int64_t{trainers} * config.train.batch_size);
      const auto steps_text = [](int64_t count, int64_t samples_each) {
        return fmt::format("{} step{} of {}", count, count == 1 ? "" : "s", samples_each);
      };
      std::printf("note: the interrupted epoch's %lld samples (%s) count as %s now\n",
                  static_cast<long long>(samples),
                  steps_text(p.step_in_epoch, p.world_size * p.batch_size).c_str(),
                  steps_text(steps, int64_t{trainers} * config.train.batch_size).c_str());
      p.step_in_epoch = steps;
    }
  }
  if (!rng_states.empty() && rng_states.size() != static_cast<std::size_t>(trainers)) {
    std::printf(
        "note: %s holds the dropout random states of %zu training ranks, not %d: the masks between "
        "layers are drawn afresh from here on\n",
        files.last().c_str(), rng_states.size(), trainers);
    rng_states.clear();
  }
  refuse_another_runs_best(files, c.run.run_id);
  if (const std::string other = other_run_in_metrics(files.metrics(), c.run.run_id);
      !c.run.run_id.empty() && !other.empty()) {
    throw UserError(files.metrics() + " holds the lines of run " + other + ", not of run " + c.run.run_id +
                    " that " + files.last() +
                    " continues: move it out of the directory (the run then starts " + "a new one)");
  }
  restore_best(files, p);
  if (data_changed || rows_changed) choose_best_afresh(files, p);
  // A smaller train.max_steps_per_epoch (or a larger batch) than the interrupted epoch's steps: that epoch
  // has had its steps, so it ends after one more, its metrics over all it trained.
  if (p.step_in_epoch >= steps_per_epoch) {
    std::printf(
        "note: the interrupted epoch had trained %lld steps, as many as or more than the %lld an epoch "
        "has now: it ends after one more\n",
        static_cast<long long>(p.step_in_epoch), static_cast<long long>(steps_per_epoch));
    p.steps_beyond = p.step_in_epoch - (steps_per_epoch - 1);
    p.step_in_epoch = steps_per_epoch - 1;
  }
}

// Rank 0's progress to every training rank, as doubles (the group's broadcast): integers below
// 2^53 are exact, and the 64-bit seed goes in two 32-bit halves.
void broadcast_progress(comm::HostGroup& trainers, TrainingProgress& p, bool& resumed) {
  std::vector<double> values{static_cast<double>(p.epoch),
                             static_cast<double>(p.step_in_epoch),
                             static_cast<double>(p.global_step),
                             p.best_val_loss,
                             resumed ? 1.0 : 0.0,
                             static_cast<double>(p.seed >> 32),
                             static_cast<double>(p.seed & 0xFFFFFFFFu),
                             static_cast<double>(p.best_epoch),
                             static_cast<double>(p.steps_beyond),
                             p.loss_scaling ? 1.0 : 0.0,
                             p.loss_scaling ? p.loss_scaling->scale : 0.0,
                             p.loss_scaling ? static_cast<double>(p.loss_scaling->clean_steps) : 0.0,
                             p.loss_scaling ? static_cast<double>(p.loss_scaling->skipped) : 0.0};
  trainers.broadcast(std::span<double>(values), 0);
  p.epoch = static_cast<int64_t>(values[0]);
  p.step_in_epoch = static_cast<int64_t>(values[1]);
  p.global_step = static_cast<int64_t>(values[2]);
  p.best_val_loss = values[3];
  resumed = values[4] != 0.0;
  p.seed = (static_cast<uint64_t>(values[5]) << 32) | static_cast<uint64_t>(values[6]);
  p.best_epoch = static_cast<int64_t>(values[7]);
  p.steps_beyond = static_cast<int64_t>(values[8]);
  p.loss_scaling.reset();
  if (values[9] != 0.0) {
    p.loss_scaling = models::LossScale::State{
        static_cast<float>(values[10]), static_cast<int64_t>(values[11]), static_cast<int64_t>(values[12])};
  }
}

}  // namespace

InitialParameters::InitialParameters(const models::ParamLayout& layout, uint64_t seed,
                                     ProgressWatchdog& watchdog, int parallel)
    : size_(layout.total_size()), watchdog_(watchdog) {
  draw_ = std::async(std::launch::async, [this, &layout, seed, &watchdog, parallel] {
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> params(size_);
    models::initialize_keras(
        layout, params, seed,
        [this, &watchdog] {
          if (dropped_.load(std::memory_order_relaxed)) throw Dropped{};
          watchdog.proceed();
        },
        parallel);
    draw_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return params;
  });
}

InitialParameters::~InitialParameters() {
  drop();
  if (draw_.valid()) draw_.wait();
}

void InitialParameters::drop() {
  dropped_.store(true, std::memory_order_relaxed);
}

std::vector<float> InitialParameters::take() {
  std::vector<float> params = draw_.get();
  watchdog_.allow_silence(std::chrono::duration<double>(2 * draw_seconds_),
                          "the other ranks' draws of the same initial parameters");
  return params;
}

RunStart start_run(const Config& config, const RunFiles& files, const io::DatasetInfo& data,
                   const io::DataPlan& plan, const models::ParamLayout& layout,
                   const optim::OptimizerSettings& optimizer, int64_t steps_per_epoch,
                   comm::HostGroup& trainers, ProgressWatchdog& watchdog, InitialParameters& initial) {
  RunStart start;
  start.params.resize(layout.total_size());
  const bool root = trainers.rank() == 0;
  watchdog.enter("preparing checkpoint.dir " + files.dir.string());
  comm::agree_on_errors(trainers, [&] {
    if (root) start.resumed = claim_directory(config, files, start.directory_lock);
  });
  // Every rank learns whether the run starts afresh: then each waits for its own draw (InitialParameters),
  // so that none waits silently for rank 0's.
  std::vector<double> fresh{start.resumed ? 0.0 : 1.0};
  trainers.broadcast(std::span<double>(fresh), 0);
  if (fresh[0] == 0.0) initial.drop();
  watchdog.enter(
      "reading the checkpoint to resume, or drawing the initial parameters from the seed, and broadcasting "
      "them");
  // Rank 0 reads the parameters and at most two optimizer buffers of their size; the others wait for it.
  if (fresh[0] == 0.0)
    expect_file_work(watchdog, "the checkpoint's read", 3 * layout.total_size() * sizeof(float));
  std::vector<std::string> rng_states;  // rank 0 of a resumed run: every training rank's, if saved
  comm::agree_on_errors(trainers, [&] {
    if (!root) {
      if (fresh[0] != 0.0) initial.take();  // rank 0's are distributed
      return;
    }
    start.record = describe_run(data, plan);
    start.record.mask_padding = config.model.mask_padding;
    start.config_ini = config.to_ini();
    if (start.resumed) {
      resume_from_checkpoint(config, files, layout, optimizer, trainers.size(), steps_per_epoch, start,
                             rng_states);
    } else {
      start.params = initial.take();
      start.progress.seed = config.train.seed;
    }
  });
  broadcast_progress(trainers, start.progress, start.resumed);
  if (start.resumed) {
    if (root) rng_states.resize(static_cast<std::size_t>(trainers.size()));  // none saved: all empty
    start.replica_rng_state = trainers.scatter(rng_states, 0);
  }
  if (!root) start.progress.loss_sum = start.progress.correct = start.progress.count = 0;
  start.progress.world_size = trainers.size();  // the training ranks, over which the data is sharded
  start.progress.batch_size = config.train.batch_size;
  start.finished = start.resumed && start.progress.epoch >= config.train.epochs;
  return start;
}

}  // namespace ddp::engine

#include "engine/trainer.h"

#include <chrono>
#include <cstdio>
#include <exception>
#include <optional>
#include <thread>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "engine/evaluation.h"
#include "engine/run_length.h"
#include "engine/test_score.h"
#include "engine/training_startup.h"
#include "io/batch_source.h"
#include "io/data_plan.h"
#include "models/dropout.h"

namespace ddp::engine {

class TrainingRun::Loop {
 public:
  Loop(const Config& config, const TrainingRanks& ranks, const io::DatasetInfo& data,
       std::unique_ptr<models::Replica> replica, std::unique_ptr<Updater> updater, std::string backend_reason,
       EpochWritten epoch_written)
      : config_(config),
        ranks_(ranks),
        data_(data),
        plan_(io::plan_data(data, config.data.validation, config.data.validation_split, ranks.comm.rank(),
                            ranks.comm.size())),
        steps_per_epoch_(steps_per_epoch(config, data, ranks.comm.size())),
        replica_(std::move(replica)),
        updater_(std::move(updater)),
        batches_(config, data, *replica_, ranks.topology.gpu),
        evaluator_(batches_, *replica_, ranks),
        backend_reason_(std::move(backend_reason)),
        epoch_written_(std::move(epoch_written)) {
    if (steps_per_epoch_ < 1) {
      throw UserError(data.path + ": /train has " + std::to_string(plan_.train_rows) +
                      " samples to train on, fewer than " + std::to_string(ranks.comm.size()) + " " +
                      ranks.name() + " x train.batch_size " + std::to_string(config.train.batch_size));
    }
  }

  TrainResult run() {
    StartedRun start = start_training(setup(), backend_reason_);
    progress_ = start.progress;
    test_score_missing_ = start.test_score_missing;
    directory_lock_ = std::move(start.directory_lock);
    record_.emplace(ranks_, RunFiles{config_.checkpoint.dir}, std::move(start.record),
                    std::move(start.config_ini), *replica_, *updater_, std::move(start.gpu_monitor),
                    std::move(epoch_written_));
    // Leaving on an error, the steps' CUDA graphs go first: NCCL's abort on the way out
    // (comm::AbortOnUnwind) waits until no graph holds its collectives.
    struct ReleaseGraphsOnUnwind {
      Updater& updater;
      int exceptions = std::uncaught_exceptions();
      ~ReleaseGraphsOnUnwind() {
        if (std::uncaught_exceptions() > exceptions) updater.release_step_graphs();
      }
    } release_graphs_on_unwind{*updater_};
    try {
      return train_and_test();
    } catch (const models::BatchValueOutOfRange& e) {
      // Seen by this rank alone, mid-run: main() ends the job with it.
      throw UserError("data.path " + data_.path + ": " + e.what() +
                      (config_.data.validate ? ""
                                             : " (data.validate = false skipped the start-up check that "
                                               "names the row)"));
    }
  }

 private:
  TrainingSetup setup() const {
    return {config_, ranks_, data_, plan_, steps_per_epoch_, *replica_, *updater_};
  }

  TrainResult train_and_test() {
    TrainResult result;
    ranks_.enter_training();
    bool stopped_early = false;
    const int64_t first_step = progress_.global_step;
    for (int64_t epoch = progress_.epoch; epoch < config_.train.epochs && !stop_requested(); ++epoch) {
      if (ranks_.stop_signal.now())
        break;  // signalled between epochs: last.h5 already holds the finished ones
      if ((stopped_early = early_stop())) break;
      std::optional<EpochMetrics> metrics = train_epoch(epoch);
      if (!metrics) break;  // stopped in the middle of the epoch, last.h5 written
      result.history.push_back(*metrics);
    }
    if (stop_requested() && progress_.epoch < config_.train.epochs)
      say(stop_after_steps_line(config_, progress_, progress_.global_step > first_step));
    setup().pause_watchdog_where_the_exchange_has_deadlines();
    result.params.resize(replica_->layout().total_size());
    updater_->finish(result.params);
    // Only a run that trained its last epoch just now, or stopped early after training now, or a finished run
    // resumed without its test score (the same answer on every training rank).
    if (plan_.test && (!result.history.empty() || test_score_missing_) &&
        (progress_.epoch >= config_.train.epochs || stopped_early)) {
      score_best_on_test(ranks_, RunFiles{config_.checkpoint.dir}, record_->run_id(), *replica_, evaluator_,
                         *plan_.test, progress_.global_step);
    }
    result.stopped_by_signal = ranks_.stop_signal.stopped();
    result.stop_signal = ranks_.stop_signal.signal_number();
    result.run_id = record_->run_id();
    result.epochs_done = progress_.epoch;
    result.steps_done_in_epoch = progress_.step_in_epoch;
    return result;
  }

  // The epoch's metrics, or nothing if the run stopped before the epoch's end.
  std::optional<EpochMetrics> train_epoch(int64_t epoch) {
    const auto epoch_start = Clock::now();
    const int64_t first = progress_.step_in_epoch;
    std::unique_ptr<io::BatchSource> source = first == 0 && next_epoch_source_.epoch == epoch
                                                  ? std::move(next_epoch_source_.source)
                                                  : training_batches(epoch, first);
    next_epoch_source_ = {};
    models::BatchStats local;
    if (!train_steps(epoch, *source, local)) return std::nullopt;
    const double train_time = seconds_since(epoch_start);
    record_->check_parameters_agree(epoch + 1);
    // The next epoch's batches start coming now, while this one is evaluated and saved: their first reads
    // and, on a GPU, the pinned buffers, device ring and first copies are off the next epoch's clock.
    if (epoch + 1 < config_.train.epochs && !stop_requested()) {
      next_epoch_source_ = {epoch + 1, training_batches(epoch + 1, 0)};
    }

    EpochMetrics m;
    record_->add_training_stats(m, local, progress_);
    progress_.loss_sum = progress_.correct = progress_.count = 0;  // the interrupted run's, now counted
    evaluator_.add_held_out(m, plan_.validation, progress_.global_step);
    m.epoch = epoch + 1;
    m.epochs = config_.train.epochs;
    m.steps = steps_per_epoch_ + progress_.steps_beyond;
    m.train_time_s = train_time;
    m.epoch_time_s = seconds_since(epoch_start);
    const int64_t steps_run = steps_per_epoch_ - first;
    m.steps_run = steps_run;
    m.step_time_ms = steps_run > 0 ? 1000.0 * train_time / static_cast<double>(steps_run) : 0.0;
    m.samples_per_s =
        static_cast<double>(steps_run) * config_.train.batch_size * ranks_.comm.size() / train_time;
    m.data_wait_s = source->input_wait_seconds();
    record_->add_run_facts(m);

    progress_.epoch = epoch + 1;
    progress_.step_in_epoch = 0;
    progress_.steps_beyond = 0;
    const bool best = progress_.epoch == 1 || m.val_loss < progress_.best_val_loss;
    if (best) {
      progress_.best_val_loss = m.val_loss;
      progress_.best_epoch = progress_.epoch;
    }
    record_->record_epoch(m, progress_, best);
    return m;
  }

  // The epoch's steps from its step progress_.step_in_epoch on, this rank's loss and accuracy summed into
  // `local`. False where the run stopped in the middle of the epoch (last.h5 written).
  bool train_steps(int64_t epoch, io::BatchSource& source, models::BatchStats& local) {
    std::optional<Progress> progress;
    if (ranks_.is_root())
      progress.emplace(live_progress(config_.log.progress), config_.log.interval, epoch + 1,
                       config_.train.epochs, steps_per_epoch_);
    int64_t step = progress_.step_in_epoch;
    begin_steps();
    while (const std::optional<BatchView> batch = next_batch(source)) {
      record_->step_begins();
      {
        timeline::Span span("step", progress_.global_step);
        replica_->set_dropout_key(
            models::dropout_step_key(progress_.seed, ranks_.comm.rank(), progress_.global_step));
        updater_->step(*batch);
      }
      straggle();
      ranks_.stop_signal.relay(updater_->servers_stop_signal());
      const bool signalled = ranks_.stop_signal.poll();  // every step on every rank, so the calls pair up
      ++step;
      ++progress_.global_step;
      ranks_.watchdog.beat(progress_.global_step);
      progress_.step_in_epoch = step;
      if (progress && progress->due(step)) {
        local += replica_->take_stats();  // a host sync on a GPU: only when progress is shown
        progress->update(step, local.loss_sum / static_cast<double>(local.count),
                         static_cast<double>(local.correct) / static_cast<double>(local.count));
      }
      // At the epoch's last step a stop waits for the epoch's end (and its last.h5): the next epoch's
      // stop_signal.now() sees it.
      if (step == steps_per_epoch_) continue;
      if (stop_requested() || signalled) {
        if (progress) progress->finish();
        save_mid_epoch(local);
        return false;
      }
      if (config_.checkpoint.every_steps > 0 && step % config_.checkpoint.every_steps == 0) {
        save_mid_epoch(local);
        begin_steps();
      }
    }
    end_steps();
    if (progress) progress->finish();
    local += replica_->take_stats();
    return true;
  }

  // A run of steps. Where the exchange has deadlines of its own (the parameter server's protocol, which names
  // the rank it waits for) the watchdog pauses for the run; outside it (the epoch's sums, the evaluation, a
  // checkpoint) it judges every collective, which has no deadline of its own: a rank that stops there must
  // end the job too.
  void begin_steps() {
    updater_->begin_steps();
    ranks_.enter_training();  // every rank, so that a stall names the phase its ranks are in
    setup().pause_watchdog_where_the_exchange_has_deadlines();
  }
  void end_steps() {
    updater_->finish_pushes();
    // Watched again past the exchange's own deadlines (the parameter server's last pushes): the collectives
    // that follow have none, and a rank stopped at the epoch's end would otherwise hold the others forever.
    ranks_.watchdog.enter("ending the run of steps (the parameters gathered on every rank)");
    updater_->end_steps();
    ranks_.watchdog.enter("between runs of steps (the epoch's sums, evaluation or checkpoint)");
  }

  // The run of steps ends inside the epoch, and last.h5 holds where it stands.
  void save_mid_epoch(models::BatchStats& local) {
    local += replica_->take_stats();
    end_steps();
    record_->record_mid_epoch(local, progress_);
  }

  // train.early_stopping_patience epochs without a lower held-out loss (val_loss, or test_loss where
  // data.validation = test): the same decision on every rank (the losses are summed over them), said once,
  // and the run goes on to its test score on best.h5.
  bool early_stop() {
    if (!patience_spent(config_, progress_)) return false;
    say(early_stop_line(config_, progress_, plan_.validation.name));
    return true;
  }

  bool stop_requested() const { return stop_after_steps_reached(config_, progress_); }

  // A line of the run's output, on rank 0's stdout.
  void say(const std::string& line) const {
    if (!ranks_.is_root()) return;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  // The training shard's batches of `epoch` from its batch `first` on, shuffled with the run's seed (a
  // resumed run's is its checkpoint's, so that the data order continues).
  std::unique_ptr<io::BatchSource> training_batches(int64_t epoch, int64_t first) const {
    return batches_.training(plan_.train, progress_.seed, epoch, first, steps_per_epoch_ - first);
  }

  using Clock = std::chrono::steady_clock;
  static double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  static std::optional<BatchView> next_batch(io::BatchSource& source) {
    timeline::Span span("data wait");
    return source.next();
  }

  // The testing knob train.straggle_ms: the last training rank lags behind the others.
  void straggle() const {
    if (config_.train.straggle_ms > 0 && ranks_.comm.rank() == ranks_.comm.size() - 1) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.train.straggle_ms));
    }
  }

  const Config& config_;
  const TrainingRanks ranks_;
  const io::DatasetInfo& data_;
  const io::DataPlan plan_;  // this rank's training, validation and test rows
  const int64_t steps_per_epoch_;
  std::unique_ptr<models::Replica> replica_;
  std::unique_ptr<Updater> updater_;  // refers to *replica_, declared after it
  ReplicaBatches batches_;            // into *replica_
  Evaluator evaluator_;
  std::string backend_reason_;  // for the start log
  EpochWritten epoch_written_;  // handed to the epoch's record once the run has started

  // Set by the start-up.
  TrainingProgress progress_;
  bool test_score_missing_ = false;                   // a finished run resumed without its test score
  std::shared_ptr<RunDirectoryLock> directory_lock_;  // rank 0: held while the run lasts
  std::optional<EpochRecorder> record_;
  // The next epoch's training batches, opened at the end of the one before. Declared after replica_, so
  // that it goes first: a GPU source orders its copies after the replica's stream.
  struct OpenedSource {
    int64_t epoch = -1;
    std::unique_ptr<io::BatchSource> source;
  } next_epoch_source_;
};

TrainingRun::TrainingRun(const Config& config, const TrainingRanks& ranks, const io::DatasetInfo& data,
                         std::unique_ptr<models::Replica> replica, std::unique_ptr<Updater> updater,
                         std::string backend_reason, EpochWritten epoch_written)
    : loop_(std::make_unique<Loop>(config, ranks, data, std::move(replica), std::move(updater),
                                   std::move(backend_reason), std::move(epoch_written))) {}

TrainingRun::~TrainingRun() = default;

TrainResult TrainingRun::run() {
  return loop_->run();
}

}  // namespace ddp::engine

#include "engine/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <thread>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "engine/checkpoint.h"
#include "engine/classification_report.h"
#include "engine/device_preparation.h"
#include "engine/gpu_monitor.h"
#include "engine/optimizer.h"
#include "engine/preemption.h"
#include "engine/run_directory.h"
#include "engine/run_start.h"
#include "engine/self_check.h"
#include "engine/start_log.h"
#include "engine/updater.h"
#include "engine/watchdog.h"
#include "io/batch_reader.h"
#include "io/batch_source.h"
#include "io/data_plan.h"
#include "models/cuda_replica.h"
#include "models/dropout.h"
#include "models/replica.h"

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
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

class TrainingRun::Loop {
 public:
  Loop(const Config& config, const Topology& topology, int job_size, comm::HostGroup& comm,
       StopAgreement& stop_signal, std::string backend_reason, std::unique_ptr<models::Replica> replica,
       std::unique_ptr<Updater> updater, const io::DatasetInfo& data, ProgressWatchdog& watchdog,
       bool exchange_has_deadlines, EpochWritten epoch_written)
      : config_(config),
        topology_(topology),
        job_size_(job_size),
        comm_(comm),
        backend_reason_(std::move(backend_reason)),
        data_(data),
        files_{config.checkpoint.dir},
        shape_(replica->layout().shape()),
        replica_(std::move(replica)),
        updater_(std::move(updater)),
        plan_(io::plan_data(data, config.data.validation, config.data.validation_split, comm_.rank(),
                            comm_.size())),
        host_params_(replica_->layout().total_size()),
        stop_signal_(stop_signal),
        watchdog_(watchdog),
        exchange_has_deadlines_(exchange_has_deadlines),
        epoch_written_(std::move(epoch_written)) {
    steps_per_epoch_ = steps_per_epoch(config, data, comm_.size());
    if (steps_per_epoch_ < 1) {
      throw UserError(data.path + ": /train has " + std::to_string(plan_.train_rows) +
                      " samples to train on, fewer than " + std::to_string(comm_.size()) + " " + trainers() +
                      " x train.batch_size " + std::to_string(config.train.batch_size));
    }
  }

  TrainResult run() {
    // Drawn meanwhile; rank 0's up to four matrices at once (its draw is the one distributed).
    InitialParameters initial(replica_->layout(), config_.train.seed, watchdog_, is_root() ? 4 : 1);
    prepare_device();
    RunStart start = start_run(config_, files_, data_, plan_, replica_->layout(), optimizer_settings(config_),
                               steps_per_epoch_, comm_, watchdog_, initial);
    resumed_ = start.resumed;
    finished_at_start_ = start.finished;
    directory_lock_ = start.directory_lock;
    progress_ = start.progress;
    if ((finished_at_start_ || (resumed_ && patience_spent())) && plan_.test) {
      // A run stopped while it scored its test split (the last thing it does, after its last epoch or its
      // early stop) scores it on resuming.
      std::vector<double> tested{is_root() && holds_test_score(files_.metrics(), start.record.run_id) ? 1.0
                                                                                                      : 0.0};
      comm_.broadcast(std::span<double>(tested), 0);
      test_score_missing_ = tested[0] == 0.0;
    }
    run_record_ = std::move(start.record);
    config_ini_ = std::move(start.config_ini);
    host_params_ = std::move(start.params);
    pause_where_the_exchange_has_deadlines();
    updater_->distribute_start(host_params_, start.optimizer ? &*start.optimizer : nullptr);
    start.optimizer.reset();  // rank 0 of a resumed run: the whole state, now handed out
    if (resumed_) restore_replica_rng(start.replica_rng_state);
    watchdog_.enter("gathering the start-up log");
    log_start();
    if (resumed_ && !finished_at_start_ && is_root()) {
      watchdog_.enter("writing to checkpoint.dir " + files_.dir.string());
      append_line(files_.metrics(), to_json(ResumeEvent{run_record_.run_id, utc_timestamp(), progress_.epoch,
                                                        steps_done_in_epoch()}));
    }
    if (!finished_at_start_) log_class_balance(comm_, data_, plan_.train);  // the same on every rank
    start_gpu_monitor();

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
  TrainResult train_and_test() {
    TrainResult result;
    enter_training();
    bool stopped_early = false;
    const int64_t first_step = progress_.global_step;
    for (int64_t epoch = progress_.epoch; epoch < config_.train.epochs && !stop_requested(); ++epoch) {
      if (stop_signal_.now()) break;  // signalled between epochs: last.h5 already holds the finished ones
      if ((stopped_early = early_stop())) break;
      std::optional<EpochMetrics> metrics = train_epoch(epoch);
      if (!metrics) break;  // stopped in the middle of the epoch, last.h5 written
      result.history.push_back(*metrics);
    }
    if (stop_requested() && progress_.epoch < config_.train.epochs && comm_.rank() == 0) {
      // A resumed run that is already there trains nothing: say so, or the exit 0 looks like a finished run.
      const char* what = progress_.global_step > first_step ? "stopped after" : "already at";
      std::printf(
          "%s %lld steps (train.stop_after_steps %lld): %s holds them; --resume with a larger "
          "train.stop_after_steps, or 0, continues\n",
          what, static_cast<long long>(progress_.global_step),
          static_cast<long long>(config_.train.stop_after_steps), files_.last().c_str());
      std::fflush(stdout);
    }
    pause_where_the_exchange_has_deadlines();
    result.params.resize(replica_->layout().total_size());
    updater_->finish(result.params);
    // Only a run that trained its last epoch just now, or stopped early after training now, or a finished run
    // resumed without its test score (the same answer on every training rank).
    if (plan_.test && (!result.history.empty() || test_score_missing_) &&
        (progress_.epoch >= config_.train.epochs || stopped_early)) {
      watchdog_.enter("scoring best.h5 on the test split");
      score_best_on_test(*plan_.test);
    }
    result.stopped_by_signal = stop_signal_.stopped();
    result.stop_signal = stop_signal_.signal_number();
    result.run_id = run_record_.run_id;
    result.epochs_done = progress_.epoch;
    result.steps_done_in_epoch = progress_.step_in_epoch;
    return result;
  }

  bool is_root() const { return comm_.rank() == 0; }
  // What the training ranks are called in messages.
  std::string trainers() const {
    return std::string(job_size_ == comm_.size() ? "rank" : "worker") + (comm_.size() == 1 ? "" : "s");
  }

  // Before the replica's first batch (device_preparation.h).
  void prepare_device() {
    const bool self_check = replica_->device() == models::DeviceKind::kCuda && config_.comm.selfcheck;
    watchdog_.enter(std::string("preparing the batch shapes") +
                    (self_check ? " and the GPU self-check" : ""));
    const int64_t test_rows = plan_.test ? plan_.test->shard.size() : -1;
    self_check_summary_ = engine::prepare_device(
        *replica_,
        every_ranks_batch_shapes(comm_, config_.train.batch_size, data_.maxlen, plan_.validation.shard.size(),
                                 test_rows),
        config_, topology_, comm_, updater_->gradient_reducer(), [this] { watchdog_.proceed(); });
  }

  // From here every step and evaluation batch beats the watchdog.
  void enter_training() { watchdog_.enter("training"); }

  // A run of steps. Where the exchange has deadlines of its own (the parameter server's protocol, which names
  // the rank it waits for) the watchdog pauses for the run; outside it (the epoch's sums, the evaluation, a
  // checkpoint) it judges every collective, which has no deadline of its own: a rank that stops there must
  // end the job too.
  void begin_steps() {
    updater_->begin_steps();
    enter_training();  // every rank, so that a stall names the phase its ranks are in
    pause_where_the_exchange_has_deadlines();
  }
  void end_steps() {
    updater_->finish_pushes();
    // Watched again past the exchange's own deadlines (the parameter server's last pushes): the collectives
    // that follow have none, and a rank stopped at the epoch's end would otherwise hold the others forever.
    watchdog_.enter("ending the run of steps (the parameters gathered on every rank)");
    updater_->end_steps();
    watchdog_.enter("between runs of steps (the epoch's sums, evaluation or checkpoint)");
  }

  void pause_where_the_exchange_has_deadlines() {
    if (exchange_has_deadlines_) watchdog_.pause();
  }

  // Collective over the job: every rank's line, then the run's, on rank 0's stdout (start_log.h).
  void log_start() {
    RankStartFacts rank;
    rank.rank = comm_.rank();  // the training ranks are the job's first
    rank.ranks = job_size_;
    rank.local_rank = topology_.local_rank;
    rank.local_ranks = topology_.local_size;
    rank.host = topology_.host;
    rank.device = topology_.gpu >= 0
                      ? topology_.device + " " + topology_.gpu_name + " (PCI " + topology_.gpu_bus_id + ")"
                      : topology_.device;
    if (const std::string kernels = replica_->lstm_kernels(); !kernels.empty()) rank.device += ", " + kernels;
    if (!self_check_summary_.empty()) rank.device += ", " + self_check_summary_;
    rank.device_reason = topology_.device_reason;
    rank.train_rows = plan_.train;
    std::vector<std::string> rank_lines = comm_.gather(rank_start_line(rank), 0);
    if (!is_root()) return;
    for (std::string& line : updater_->server_lines()) rank_lines.push_back(std::move(line));

    RunStartFacts run;
    run.backend_reason = backend_reason_;
    run.data_path = data_.path;
    run.vocab_size = data_.vocab_size;
    run.maxlen = data_.maxlen;
    run.data_plan = plan_.describe() + plan_.notes();
    run.embedding_dim = shape_.embedding_dim;
    run.layers = shape_.layers;
    run.rnn = (shape_.bidirectional ? "bidirectional " : "") +
              std::string(shape_.cell == models::Cell::kGru ? "GRU" : "LSTM");
    if (config_.model.mask_padding) run.model_extras += ", masked";
    if (config_.model.dropout > 0) {
      // PyTorch warns alike: dropout acts between stacked layers, so one layer leaves it idle.
      run.model_extras += shape_.layers > 1 ? fmt::format(", dropout {}", config_.model.dropout)
                                            : fmt::format(
                                                  ", dropout {} idle (it acts between stacked layers, "
                                                  "and model.layers = 1)",
                                                  config_.model.dropout);
    }
    if (config_.model.embedding_dropout > 0)
      run.model_extras += fmt::format(", embedding dropout {}", config_.model.embedding_dropout);
    if (shape_.classes != 2) run.model_extras += fmt::format(", {} classes", shape_.classes);
    run.hidden = shape_.hidden;
    run.parameters = replica_->layout().total_size();
    run.optimizer = updater_->optimizer_name();
    if (config_.train.optimizer != "sgd" && config_.train.momentum > 0)
      run.optimizer += fmt::format(" (train.momentum = {} idle: it is sgd's)", config_.train.momentum);
    run.learning_rate = config_.train.learning_rate;
    run.batch_size = config_.train.batch_size;
    run.trainers = comm_.size();
    run.trainers_name = trainers();
    run.steps_per_epoch = steps_per_epoch_;
    run.start = finished_at_start_ ? RunStartFacts::Start::kAlreadyFinished
                : resumed_         ? RunStartFacts::Start::kResumed
                                   : RunStartFacts::Start::kFresh;
    run.run_id = run_record_.run_id;
    run.run_dir = files_.dir.string();
    run.checkpoint = files_.last();
    run.epochs_done = progress_.epoch;
    run.steps_done = steps_done_in_epoch();
    run.epochs = config_.train.epochs;
    for (const std::string& line : start_log_lines(run, rank_lines)) std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  // Batches in the replica's memory: a GPU replica gets them through the copy-stream pipeline.
  std::unique_ptr<io::BatchSource> make_source(const io::BatchReaderOptions& options) {
    if (replica_->device() == models::DeviceKind::kCuda) {
      return io::make_device_batch_source(options, topology_.gpu, replica_->stream(),
                                          std::max(2, options.prefetch));
    }
    return io::make_host_batch_source(options);
  }

  bool live_progress() const {
    if (config_.log.progress == "bar") return true;
    if (config_.log.progress == "lines") return false;
    return stdout_is_terminal();
  }

  bool stop_requested() const {
    return config_.train.stop_after_steps > 0 && progress_.global_step >= config_.train.stop_after_steps;
  }

  // The testing knob train.straggle_ms: the last training rank lags behind the others.
  void straggle() const {
    if (config_.train.straggle_ms > 0 && comm_.rank() == comm_.size() - 1) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.train.straggle_ms));
    }
  }

  // The epoch's metrics, or nothing if the run stopped before the epoch's end.
  std::optional<EpochMetrics> train_epoch(int64_t epoch) {
    const auto epoch_start = Clock::now();
    const int64_t first = progress_.step_in_epoch;
    std::unique_ptr<io::BatchSource> source = first == 0 && next_epoch_source_.epoch == epoch
                                                  ? std::move(next_epoch_source_.source)
                                                  : make_source(training_batches(epoch, first));
    next_epoch_source_ = {};

    std::optional<Progress> progress;
    if (is_root())
      progress.emplace(live_progress(), config_.log.interval, epoch + 1, config_.train.epochs,
                       steps_per_epoch_);
    models::BatchStats local;
    int64_t step = first;
    begin_steps();
    while (const std::optional<BatchView> batch = next_batch(*source)) {
      {
        timeline::Span span("step", progress_.global_step);
        replica_->set_dropout_key(
            models::dropout_step_key(progress_.seed, comm_.rank(), progress_.global_step));
        updater_->step(*batch);
      }
      straggle();
      stop_signal_.relay(updater_->servers_stop_signal());
      const bool signalled = stop_signal_.poll();  // every step on every rank, so the calls pair up
      ++step;
      ++progress_.global_step;
      beat();
      progress_.step_in_epoch = step;
      if (progress && progress->due(step)) {
        local += replica_->take_stats();  // a host sync on a GPU: only when progress is shown
        progress->update(step, local.loss_sum / static_cast<double>(local.count),
                         static_cast<double>(local.correct) / static_cast<double>(local.count));
      }
      // At the epoch's last step a stop waits for the epoch's end (and its last.h5): the next epoch's
      // stop_signal_.now() sees it.
      if (step == steps_per_epoch_) continue;
      if (stop_requested() || signalled) {
        if (progress) progress->finish();
        local += replica_->take_stats();
        end_steps();
        save_mid_epoch(local);
        return std::nullopt;
      }
      if (config_.checkpoint.every_steps > 0 && step % config_.checkpoint.every_steps == 0) {
        local += replica_->take_stats();
        end_steps();
        save_mid_epoch(local);
        begin_steps();
      }
    }
    end_steps();
    if (progress) progress->finish();
    local += replica_->take_stats();
    const double train_time = seconds_since(epoch_start);
    const std::string checksum = parameters_agree(epoch + 1);
    // The next epoch's batches start coming now, while this one is evaluated and saved: their first reads
    // and, on a GPU, the pinned buffers, device ring and first copies are off the next epoch's clock.
    if (epoch + 1 < config_.train.epochs && !stop_requested()) {
      next_epoch_source_ = {epoch + 1, make_source(training_batches(epoch + 1, 0))};
    }

    // Training sums over all ranks (plus what an interrupted run had already summed, held by rank 0).
    std::vector<double> sums{local.loss_sum + progress_.loss_sum,
                             static_cast<double>(local.correct) + progress_.correct,
                             static_cast<double>(local.count) + progress_.count};
    comm_.sum(sums);
    progress_.loss_sum = progress_.correct = progress_.count = 0;

    const auto eval_start = Clock::now();
    const models::BatchStats val = evaluate(plan_.validation);
    const double eval_time = seconds_since(eval_start);

    EpochMetrics m;
    m.epoch = epoch + 1;
    m.epochs = config_.train.epochs;
    m.steps = steps_per_epoch_ + progress_.steps_beyond;
    m.loss = sums[0] / sums[2];
    m.acc = sums[1] / sums[2];
    m.val_loss = val.loss_sum / static_cast<double>(val.count);
    m.val_acc = static_cast<double>(val.correct) / static_cast<double>(val.count);
    m.val_macro_f1 = macro_f1(val);
    m.train_time_s = train_time;
    m.eval_time_s = eval_time;
    m.epoch_time_s = seconds_since(epoch_start);
    const int64_t steps_run = steps_per_epoch_ - first;
    m.steps_run = steps_run;
    m.held_out = plan_.validation.name;
    m.step_time_ms = steps_run > 0 ? 1000.0 * train_time / static_cast<double>(steps_run) : 0.0;
    m.samples_per_s = static_cast<double>(steps_run) * config_.train.batch_size * comm_.size() / train_time;
    m.data_wait_s = source->input_wait_seconds();
    m.world_size = job_size_;
    m.workers = comm_.size();
    m.parameters_checksum = checksum;
    m.backend = updater_->backend();
    m.device = topology_.device;
    add_gpu_sample(m);

    progress_.epoch = epoch + 1;
    progress_.step_in_epoch = 0;
    progress_.steps_beyond = 0;
    const bool best = progress_.epoch == 1 || m.val_loss < progress_.best_val_loss;
    if (best) {
      progress_.best_val_loss = m.val_loss;
      progress_.best_epoch = progress_.epoch;
    }
    finish_epoch_on_root(m, best);
    return m;
  }

  void beat() { watchdog_.beat(progress_.global_step); }

  // Collective over the training ranks, after a run of steps: data parallelism keeps every replica's
  // parameters equal bit for bit (Updater::end_steps). A rank whose parameters differ from rank 0's (a
  // reduction that is not the same on every rank, a faulty device or memory) ends the job here, naming it,
  // instead of training on as a silently different model; the checkpoints of earlier epochs stay. Returns
  // the checksum every rank agreed on, for metrics.jsonl.
  std::string parameters_agree(int64_t epoch) {
    timeline::Span span("parameter checksum");
    replica_->copy_params_to_host(host_params_);
    const std::vector<std::string> checksums = comm_.gather(parameters_checksum(host_params_), 0);
    if (!is_root()) return "";
    if (const std::optional<std::size_t> rank = first_other_checksum(checksums)) {
      DDP_FATAL(fmt::format(
          "after epoch {} the parameters of {} {} differ from rank 0's (checksum {} against {}): the "
          "replicas "
          "diverged, which data parallelism must not let happen (a reduction that is not the same on every "
          "rank, or a faulty device or memory on that rank's node)",
          epoch, trainers() == "workers" ? "worker" : "rank", *rank, checksums[*rank], checksums[0]));
    }
    return checksums[0];
  }

  // What the checkpoint a run resumed from had done of its epoch (rank 0), in its own steps.
  int64_t steps_done_in_epoch() const { return progress_.checkpoint_step_in_epoch; }

  // train.early_stopping_patience epochs without a lower held-out loss (val_loss, or test_loss where
  // data.validation = test): the same decision on every rank (the losses are summed over them), said once,
  // and the run goes on to its test score on best.h5.
  bool early_stop() {
    if (!patience_spent()) return false;
    const int patience = config_.train.early_stopping_patience;
    if (is_root()) {
      std::printf(
          "early stopping: %s_loss has not improved for %lld epoch(s) since epoch %lld "
          "(train.early_stopping_patience = %d); best.h5 holds epoch %lld\n",
          plan_.validation.name.c_str(), static_cast<long long>(progress_.epoch - progress_.best_epoch),
          static_cast<long long>(progress_.best_epoch), patience,
          static_cast<long long>(progress_.best_epoch));
      std::fflush(stdout);
    }
    return true;
  }

  // Whether train.early_stopping_patience epochs have passed without a lower val_loss.
  bool patience_spent() const {
    const int patience = config_.train.early_stopping_patience;
    return patience > 0 && progress_.epoch > 0 && progress_.epoch - progress_.best_epoch >= patience;
  }

  // The training shard's batches of `epoch` from its batch `first` on, in the epoch's shuffled order.
  io::BatchReaderOptions training_batches(int64_t epoch, int64_t first) const {
    io::BatchReaderOptions options;
    options.path = data_.path;
    options.split = "train";
    options.shard = plan_.train;
    options.batch_size = config_.train.batch_size;
    options.shuffle = true;
    options.seed = progress_.seed;  // the resumed run's seed, so the data order continues
    options.epoch = epoch;
    options.drop_last = true;
    options.first_batch = first;
    options.max_batches = steps_per_epoch_ - first;
    options.prefetch = config_.data.prefetch;
    options.timeline_track = "prefetch (training)";
    options.expected_stamp = data_.stamp;
    return options;
  }

  static std::optional<BatchView> next_batch(io::BatchSource& source) {
    timeline::Span span("data wait");
    return source.next();
  }

  // NVML's view of this rank's GPU, where the driver provides it; the log says why not otherwise.
  void start_gpu_monitor() {
    if (topology_.gpu < 0) return;
    std::string why_not;
    gpu_monitor_ = GpuMonitor::start(topology_.gpu_bus_id, &why_not);
    if (!gpu_monitor_)
      std::printf("rank %d: no GPU utilization in metrics: %s\n", comm_.rank(), why_not.c_str());
  }

  // Collective over the training ranks: the mean over those that have a reading.
  void add_gpu_sample(EpochMetrics& m) {
    GpuSample sample;
    if (gpu_monitor_) sample = gpu_monitor_->take();
    const bool have = sample.readings > 0;
    std::vector<double> sums{have ? sample.utilization_percent : 0.0, have ? sample.memory_used_mib : 0.0,
                             have ? 1.0 : 0.0};
    comm_.sum(sums);
    if (sums[2] == 0) return;
    m.gpu_util = sums[0] / sums[2];
    m.gpu_mem_mib = sums[1] / sums[2];
  }

  // Collective over the training ranks: the loss and accuracy over every row of `rows`.
  models::BatchStats evaluate(const io::RowSet& rows) {
    timeline::Span span("evaluation");
    io::BatchReaderOptions options;
    options.path = data_.path;
    options.split = rows.split;
    options.shard = rows.shard;
    options.batch_size = config_.train.batch_size;
    options.shuffle = false;
    options.drop_last = false;
    options.prefetch = config_.data.prefetch;
    options.timeline_track = "prefetch (evaluation)";
    options.expected_stamp = data_.stamp;
    if (rows.shard.size() > 0) {
      std::unique_ptr<io::BatchSource> source = make_source(options);
      while (const std::optional<BatchView> batch = source->next()) {
        replica_->evaluate(*batch);
        beat();
      }
    }
    const models::BatchStats local = replica_->take_stats();
    // The confusion counts travel with the sums, classes x classes on every rank (zeros where a replica
    // keeps none, a GPU's); they count only when they cover every row.
    const auto classes = static_cast<std::size_t>(shape_.classes);
    std::vector<double> sums{local.loss_sum, static_cast<double>(local.correct),
                             static_cast<double>(local.count)};
    sums.resize(3 + classes * classes, 0.0);
    for (std::size_t i = 0; i < local.confusion.size() && i < classes * classes; ++i)
      sums[3 + i] = static_cast<double>(local.confusion[i]);
    comm_.sum(sums);
    models::BatchStats total{sums[0], static_cast<int64_t>(sums[1]), static_cast<int64_t>(sums[2]), {}};
    std::vector<int64_t> confusion(classes * classes);
    int64_t counted = 0;
    for (std::size_t i = 0; i < confusion.size(); ++i)
      counted += confusion[i] = static_cast<int64_t>(sums[3 + i]);
    if (counted == total.count && total.count > 0) total.confusion = std::move(confusion);
    return total;
  }

  // Macro-F1 of evaluated stats, for more than two classes; -1 otherwise or where they were not counted.
  double macro_f1(const models::BatchStats& stats) const {
    if (shape_.classes == 2 || stats.confusion.empty()) return -1;
    return classification_report(stats.confusion, shape_.classes).macro_f1;
  }

  // The test split, scored once at the end of the run on the model in best.h5, the one validation chose.
  void score_best_on_test(const io::RowSet& test) {
    std::vector<double> best_epoch{0.0};
    on_root_or_abort([&] {
      const Checkpoint best = read_checkpoint(files_.best(), CheckpointParts::kModel);
      host_params_ = best.params;
      best_epoch[0] = static_cast<double>(best.progress.epoch);
    });
    comm_.broadcast(std::span<float>(host_params_), 0);
    comm_.broadcast(std::span<double>(best_epoch), 0);
    replica_->copy_params_from_host(host_params_);
    const models::BatchStats scores = evaluate(test);
    on_root_or_abort([&] {
      TestMetrics m;
      m.run_id = run_record_.run_id;
      m.time = utc_timestamp();
      m.best_epoch = static_cast<int64_t>(best_epoch[0]);
      m.test_loss = scores.loss_sum / static_cast<double>(scores.count);
      m.test_acc = static_cast<double>(scores.correct) / static_cast<double>(scores.count);
      m.test_macro_f1 = macro_f1(scores);
      m.samples = scores.count;
      std::printf("%s\n", format_test_line(m).c_str());
      std::fflush(stdout);
      append_line(files_.metrics(), to_json(m));
    });
  }

  // Problems writing the run directory after training started end the job (exit 2) rather than leave the
  // other ranks waiting in the next collective; a job of one rank leaves through main() as any user error
  // does. A write that hangs (a frozen file system) ends it through the watchdog, which then names the write.
  template <typename Work>
  void on_root_or_abort(Work&& work) {
    if (!is_root()) return;
    watchdog_.enter("writing to checkpoint.dir " + files_.dir.string());
    try {
      work();
    } catch (const UserError& e) {
      if (job_size_ == 1) throw;
      end_job_with_user_error(e.what());
    } catch (const std::filesystem::filesystem_error& e) {
      if (job_size_ == 1) throw UserError(e.what());
      end_job_with_user_error(e.what());
    }
    enter_training();
  }

  // Collective over the training ranks: each rank's replica takes the random state it saved, where it can;
  // rank 0 says how many could not (a CPU replica, another GPU model or cuDNN version: their masks are drawn
  // afresh).
  void restore_replica_rng(const std::string& saved) {
    std::vector<double> counts{saved.empty() ? 0.0 : 1.0,
                               !saved.empty() && replica_->restore_rng_state(saved) ? 1.0 : 0.0};
    comm_.sum(counts);
    if (is_root() && counts[1] < counts[0]) {
      std::printf(
          "note: %.0f of the %.0f dropout random states in %s do not fit this run's replicas (saved on "
          "another "
          "kind of device, GPU model or cuDNN version): those ranks draw their masks between layers afresh "
          "from here on\n",
          counts[0] - counts[1], counts[0], files_.last().c_str());
    }
  }

  // Collective over the training ranks: rank 0 writes last.h5 (`progress`), the optimizer state gathered one
  // buffer at a time, then every replica's random state; `before` runs on rank 0 first.
  template <typename Before>
  void write_last_checkpoint(const TrainingProgress& progress, Before&& before, bool best) {
    std::unique_ptr<CheckpointWriter> writer;
    std::optional<timeline::Span> span;  // rank 0's, over the whole write, the state's gather included
    if (is_root()) span.emplace("checkpoint");
    const std::vector<std::string> rng_states = comm_.gather(replica_->rng_state(), 0);
    on_root_or_abort([&] {
      before();
      replica_->copy_params_to_host(host_params_);
      writer = std::make_unique<CheckpointWriter>(
          files_.last(), shape_, host_params_, updater_->optimizer_name(), updater_->optimizer_iterations(),
          progress, config_ini_, run_record_);
    });
    updater_->visit_optimizer_state([&](const std::string& name, std::span<const float> values) {
      on_root_or_abort([&] { writer->add_optimizer_buffer(name, values); });
    });
    on_root_or_abort([&] {
      writer->add_replica_rng_states(rng_states);
      writer->commit();
      if (best) copy_checkpoint(files_.last(), files_.best());
    });
  }

  void finish_epoch_on_root(const EpochMetrics& m, bool best) {
    write_last_checkpoint(
        progress_,
        [&] {
          std::printf("%s\n", format_epoch_line(m).c_str());
          if ((!std::isfinite(m.loss) || !std::isfinite(m.val_loss)) && !warned_diverged_) {
            // Every later step trains on weights that are no longer numbers: say so once, with the usual
            // cure.
            warned_diverged_ = true;
            const double bad = std::isfinite(m.loss) ? m.val_loss : m.loss;
            std::fputs(
                fmt::format(
                    "warning: the {} loss is {} in epoch {}: the run diverged (lower train.learning_rate, "
                    "or set train.clip_norm)\n",
                    std::isfinite(m.loss) ? "held-out" : "training", std::isnan(bad) ? "NaN" : "infinite",
                    m.epoch)
                    .c_str(),
                stdout);
          }
          std::fflush(stdout);
          EpochMetrics stamped = m;
          stamped.run_id = run_record_.run_id;
          stamped.time = utc_timestamp();
          append_line(files_.metrics(), to_json(stamped));
          if (epoch_written_) epoch_written_(files_);
        },
        best);
  }

  void save_mid_epoch(const models::BatchStats& local) {
    std::vector<double> sums{local.loss_sum, static_cast<double>(local.correct),
                             static_cast<double>(local.count)};
    comm_.sum(sums);
    TrainingProgress snapshot = progress_;
    snapshot.loss_sum += sums[0];
    snapshot.correct += sums[1];
    snapshot.count += sums[2];
    write_last_checkpoint(
        snapshot, [] {}, /*best=*/false);
  }

  bool warned_diverged_ = false;
  const Config& config_;
  std::string config_ini_;  // rank 0: the effective configuration the checkpoints record (RunStart)
  const Topology& topology_;
  const int job_size_;  // the training ranks and the dedicated parameter servers
  comm::HostGroup& comm_;
  std::string backend_reason_;
  const io::DatasetInfo& data_;
  RunFiles files_;
  std::shared_ptr<RunDirectoryLock> directory_lock_;  // rank 0: held while the run lasts
  models::ModelShape shape_;
  std::unique_ptr<models::Replica> replica_;
  std::unique_ptr<Updater> updater_;  // refers to *replica_, declared after it
  io::DataPlan plan_;                 // this rank's training, validation and test rows
  int64_t steps_per_epoch_ = 0;
  TrainingProgress progress_;
  bool resumed_ = false;             // continues last.h5 (decided by rank 0, known to every training rank)
  bool finished_at_start_ = false;   // the resumed run had already trained every epoch
  bool test_score_missing_ = false;  // ... or had stopped early, but had not scored its test split
  RunRecord run_record_;             // rank 0: what its checkpoints say about the run
  std::string self_check_summary_;   // a GPU rank's self-check, for its line of the start log
  std::vector<float> host_params_;   // host copy of the parameters: initialization, broadcast, checkpoints,
                                     // the epoch's checksum
  StopAgreement& stop_signal_;
  ProgressWatchdog& watchdog_;
  const bool exchange_has_deadlines_;
  EpochWritten epoch_written_;
  std::unique_ptr<GpuMonitor> gpu_monitor_;  // null on a CPU rank or without NVML
  // The next epoch's training batches, opened at the end of the one before. Declared after replica_, so
  // that it goes first: a GPU source orders its copies after the replica's stream.
  struct OpenedSource {
    int64_t epoch = -1;
    std::unique_ptr<io::BatchSource> source;
  } next_epoch_source_;
};

TrainingRun::TrainingRun(const Config& config, const Topology& topology, int job_size, comm::HostGroup& comm,
                         StopAgreement& stop_signal, std::string backend_reason,
                         std::unique_ptr<models::Replica> replica, std::unique_ptr<Updater> updater,
                         const io::DatasetInfo& data, ProgressWatchdog& watchdog, bool exchange_has_deadlines,
                         EpochWritten epoch_written)
    : loop_(std::make_unique<Loop>(config, topology, job_size, comm, stop_signal, std::move(backend_reason),
                                   std::move(replica), std::move(updater), data, watchdog,
                                   exchange_has_deadlines, std::move(epoch_written))) {}

TrainingRun::~TrainingRun() = default;

TrainResult TrainingRun::run() {
  return loop_->run();
}

}  // namespace ddp::engine

#include "engine/training_startup.h"

#include <cstdio>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "engine/device_preparation.h"
#include "engine/metrics.h"
#include "engine/run_length.h"
#include "engine/run_start.h"
#include "engine/start_log.h"
#include "engine/start_log_facts.h"
#include "engine/test_score.h"

namespace ddp::engine {
namespace {

// Before the replica's first batch (device_preparation.h). Returns the GPU self-check's summary ("" without).
std::string prepare_device_for_the_run(const TrainingSetup& setup) {
  const TrainingRanks& ranks = setup.ranks;
  const bool self_check = setup.replica.device() == models::DeviceKind::kCuda && setup.config.comm.selfcheck;
  ranks.watchdog.enter(std::string("preparing the batch shapes") +
                       (self_check ? " and the GPU self-check" : ""));
  const int64_t test_rows = setup.plan.test ? setup.plan.test->shard.size() : -1;
  return prepare_device(setup.replica,
                        every_ranks_batch_shapes(ranks.comm, setup.config.train.batch_size, setup.data.maxlen,
                                                 setup.plan.validation.shard.size(), test_rows),
                        setup.config, ranks.topology, ranks.comm, setup.updater.gradient_reducer(),
                        setup.updater.steps_from_graphs(), [&ranks] { ranks.watchdog.proceed(); });
}

// Collective over the training ranks: each rank's replica takes the random state it saved, where it can;
// rank 0 says how many could not (a CPU replica, another GPU model or cuDNN version: their masks are drawn
// afresh).
void restore_replica_rng(const TrainingSetup& setup, const RunFiles& files, const std::string& saved) {
  std::vector<double> counts{saved.empty() ? 0.0 : 1.0,
                             !saved.empty() && setup.replica.restore_rng_state(saved) ? 1.0 : 0.0};
  setup.ranks.comm.sum(counts);
  if (setup.ranks.is_root() && counts[1] < counts[0]) {
    std::printf(
        "note: %.0f of the %.0f dropout random states in %s do not fit this run's replicas (saved on "
        "another "
        "kind of device, GPU model or cuDNN version): those ranks draw their masks between layers afresh "
        "from here on\n",
        counts[0] - counts[1], counts[0], files.last().c_str());
  }
}

// Collective over the training ranks: the replicas that scale the loss (fp16 on a GPU) take the scaling a
// resumed run saved, so that it skips and grows as the uninterrupted run would; then every such rank takes
// the smallest scale among them (the start-up self-check's overflowing steps may have lowered one GPU model's
// and not another's), so that all hold the same state from the first step on.
void start_loss_scaling(const TrainingSetup& setup, const std::optional<models::LossScale::State>& saved) {
  models::Replica& replica = setup.replica;
  if (saved) replica.restore_loss_scale(*saved);
  const std::optional<models::LossScale::State> mine = replica.loss_scaling();
  // The smallest scale as the largest negated one; scales are powers of two up to 2^24, exact in int64.
  std::vector<int64_t> negated{mine ? -static_cast<int64_t>(mine->scale)
                                    : std::numeric_limits<int64_t>::min()};
  setup.ranks.comm.max(negated);
  if (mine) replica.restore_loss_scale({static_cast<float>(-negated[0]), mine->clean_steps, mine->skipped});
}

// NVML's view of this rank's GPU, where the driver provides it; the log says why not otherwise.
std::unique_ptr<GpuMonitor> start_gpu_monitor(const TrainingRanks& ranks) {
  if (ranks.topology.gpu < 0) return nullptr;
  std::string why_not;
  std::unique_ptr<GpuMonitor> monitor = GpuMonitor::start(ranks.topology.gpu_bus_id, &why_not);
  if (!monitor)
    std::printf("rank %d: no GPU utilization in metrics: %s\n", ranks.comm.rank(), why_not.c_str());
  return monitor;
}

}  // namespace

StartedRun start_training(const TrainingSetup& setup, const std::string& backend_reason) {
  const Config& config = setup.config;
  const TrainingRanks& ranks = setup.ranks;
  const RunFiles files{config.checkpoint.dir};
  // Drawn meanwhile; rank 0's up to four matrices at once (its draw is the one distributed).
  InitialParameters initial(setup.replica.layout(), config.train.seed, ranks.watchdog,
                            ranks.is_root() ? 4 : 1);
  const std::string self_check_summary = prepare_device_for_the_run(setup);
  RunStart start =
      start_run(config, files, setup.data, setup.plan, setup.replica.layout(), optimizer_settings(config),
                setup.steps_per_epoch, ranks.comm, ranks.watchdog, initial);
  StartedRun started;
  started.resumed = start.resumed;
  started.finished = start.finished;
  started.directory_lock = start.directory_lock;
  started.progress = start.progress;
  if ((started.finished || (started.resumed && patience_spent(config, started.progress))) &&
      setup.plan.test) {
    // A run stopped while it scored its test split (the last thing it does, after its last epoch or its
    // early stop) scores it on resuming.
    started.test_score_missing = test_score_missing(ranks, files, start.record.run_id);
  }
  started.record = std::move(start.record);
  started.config_ini = std::move(start.config_ini);
  std::vector<float> params = std::move(start.params);
  setup.pause_watchdog_where_the_exchange_has_deadlines();
  setup.updater.distribute_start(params, start.optimizer ? &*start.optimizer : nullptr);
  start.optimizer.reset();  // rank 0 of a resumed run: the whole state, now handed out
  if (started.resumed) restore_replica_rng(setup, files, start.replica_rng_state);
  start_loss_scaling(setup, started.progress.loss_scaling);
  ranks.watchdog.enter("gathering the start-up log");
  log_start(setup, backend_reason, self_check_summary,
            started.finished  ? RunStartFacts::Start::kAlreadyFinished
            : started.resumed ? RunStartFacts::Start::kResumed
                              : RunStartFacts::Start::kFresh,
            started.progress, started.record.run_id);
  if (started.resumed && !started.finished && ranks.is_root()) {
    ranks.watchdog.enter("writing to checkpoint.dir " + files.dir.string());
    append_line(files.metrics(),
                to_json(ResumeEvent{started.record.run_id, utc_timestamp(), started.progress.epoch,
                                    started.progress.checkpoint_step_in_epoch}));
  }
  if (!started.finished)
    log_class_balance(ranks.comm, setup.data, setup.plan.train);  // the same on every rank
  started.gpu_monitor = start_gpu_monitor(ranks);
  return started;
}

}  // namespace ddp::engine

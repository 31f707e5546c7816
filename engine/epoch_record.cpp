#include "engine/epoch_record.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::engine {

EpochRecorder::EpochRecorder(const TrainingRanks& ranks, RunFiles files, RunRecord record,
                             std::string config_ini, models::Replica& replica, Updater& updater,
                             std::unique_ptr<GpuMonitor> gpu_monitor, EpochWritten epoch_written)
    : ranks_(ranks),
      files_(std::move(files)),
      record_(std::move(record)),
      config_ini_(std::move(config_ini)),
      replica_(replica),
      updater_(updater),
      gpu_monitor_(std::move(gpu_monitor)),
      epoch_written_(std::move(epoch_written)),
      host_params_(replica.layout().total_size()) {}

void EpochRecorder::check_parameters_agree(int64_t epoch) {
  timeline::Span span("parameter checksum");
  replica_.copy_params_to_host(host_params_);
  const std::vector<std::string> checksums = ranks_.comm.gather(parameters_checksum(host_params_), 0);
  if (!ranks_.is_root()) return;
  if (const std::optional<std::size_t> rank = first_other_checksum(checksums)) {
    DDP_FATAL(fmt::format(
        "after epoch {} the parameters of {} {} differ from rank 0's (checksum {} against {}): the "
        "replicas "
        "diverged, which data parallelism must not let happen (a reduction that is not the same on every "
        "rank, or a faulty device or memory on that rank's node)",
        epoch, ranks_.name() == "workers" ? "worker" : "rank", *rank, checksums[*rank], checksums[0]));
  }
  checksum_ = checksums[0];
}

void EpochRecorder::add_run_facts(EpochMetrics& m) {
  m.world_size = ranks_.job_size;
  m.workers = ranks_.comm.size();
  m.parameters_checksum = checksum_;
  m.backend = updater_.backend();
  m.device = ranks_.topology.device;
  if (!first_step_reported_) m.start_to_first_step_s = start_to_first_step_s_;
  first_step_reported_ = true;
  if (const std::optional<models::LossScale::State> scaling = loss_scaling_of_the_ranks()) {
    m.loss_scale = scaling->scale;
    m.skipped_steps = scaling->skipped;
  }
  GpuSample sample;
  if (gpu_monitor_) sample = gpu_monitor_->take();
  const bool have = sample.readings > 0;
  std::vector<double> sums{have ? sample.utilization_percent : 0.0, have ? sample.memory_used_mib : 0.0,
                           have ? 1.0 : 0.0};
  ranks_.comm.sum(sums);
  if (sums[2] == 0) return;
  m.gpu_util = sums[0] / sums[2];
  m.gpu_mem_mib = sums[1] / sums[2];
}

std::optional<models::LossScale::State> EpochRecorder::loss_scaling_of_the_ranks() {
  const std::optional<models::LossScale::State> mine = replica_.loss_scaling();
  // Every rank that scales holds the same state (start_loss_scaling), so their mean is it: exact in doubles,
  // a sum of equal powers of two and of equal integers below 2^53.
  std::vector<double> sums{mine ? 1.0 : 0.0, mine ? mine->scale : 0.0,
                           mine ? static_cast<double>(mine->clean_steps) : 0.0,
                           mine ? static_cast<double>(mine->skipped) : 0.0};
  ranks_.comm.sum(sums);
  if (sums[0] == 0) return std::nullopt;
  return models::LossScale::State{static_cast<float>(sums[1] / sums[0]),
                                  static_cast<int64_t>(sums[2] / sums[0]),
                                  static_cast<int64_t>(sums[3] / sums[0])};
}

void EpochRecorder::record_epoch(const EpochMetrics& m, const TrainingProgress& progress, bool best) {
  write_last_checkpoint(
      progress, [&] { print_and_append(m); }, best);
}

void EpochRecorder::add_training_stats(EpochMetrics& m, const models::BatchStats& local,
                                       const TrainingProgress& progress) {
  const std::vector<double> sums = sums_over_ranks(local, progress);
  m.loss = sums[0] / sums[2];
  m.acc = sums[1] / sums[2];
}

void EpochRecorder::record_mid_epoch(const models::BatchStats& local, const TrainingProgress& progress) {
  const std::vector<double> sums = sums_over_ranks(local, TrainingProgress{});
  TrainingProgress snapshot = progress;
  snapshot.loss_sum += sums[0];
  snapshot.correct += sums[1];
  snapshot.count += sums[2];
  write_last_checkpoint(
      snapshot, [] {}, /*best=*/false);
}

std::vector<double> EpochRecorder::sums_over_ranks(const models::BatchStats& local,
                                                   const TrainingProgress& progress) {
  std::vector<double> sums{local.loss_sum + progress.loss_sum,
                           static_cast<double>(local.correct) + progress.correct,
                           static_cast<double>(local.count) + progress.count};
  ranks_.comm.sum(sums);
  return sums;
}

void EpochRecorder::print_and_append(const EpochMetrics& m) {
  std::printf("%s\n", format_epoch_line(m).c_str());
  if ((!std::isfinite(m.loss) || !std::isfinite(m.val_loss)) && !warned_diverged_) {
    // Every later step trains on weights that are no longer numbers: say so once, with the usual cure.
    warned_diverged_ = true;
    const double bad = std::isfinite(m.loss) ? m.val_loss : m.loss;
    std::fputs(fmt::format("warning: the {} loss is {} in epoch {}: the run diverged (lower "
                           "train.learning_rate, or set train.clip_norm)\n",
                           std::isfinite(m.loss) ? "held-out" : "training",
                           std::isnan(bad) ? "NaN" : "infinite", m.epoch)
                   .c_str(),
               stdout);
  }
  std::fflush(stdout);
  EpochMetrics stamped = m;
  stamped.run_id = record_.run_id;
  stamped.time = utc_timestamp();
  append_line(files_.metrics(), to_json(stamped));
  if (epoch_written_) epoch_written_(files_);
}

void EpochRecorder::write_last_checkpoint(const TrainingProgress& progress,
                                          const std::function<void()>& before, bool best) {
  std::unique_ptr<CheckpointWriter> writer;
  std::optional<timeline::Span> span;  // rank 0's, over the whole write, the state's gather included
  if (ranks_.is_root()) span.emplace("checkpoint");
  // last.h5 holds the parameters and at most two buffers of their size (Adam's moments); best.h5 is its copy.
  const std::size_t params_bytes = replica_.layout().total_size() * sizeof(float);
  const std::size_t file_bytes = 3 * params_bytes;
  ranks_.wait_for_root_files(std::string("writing last.h5") + (best ? " and best.h5" : ""),
                             best ? 2 * file_bytes : file_bytes);
  const std::vector<std::string> rng_states = ranks_.comm.gather(replica_.rng_state(), 0);
  TrainingProgress saved = progress;
  saved.loss_scaling = loss_scaling_of_the_ranks();
  ranks_.on_root_or_abort(
      files_,
      [&] {
        before();
        replica_.copy_params_to_host(host_params_);
        writer = std::make_unique<CheckpointWriter>(
            files_.last(), replica_.layout().shape(), host_params_, updater_.optimizer_name(),
            updater_.optimizer_iterations(), saved, config_ini_, record_);
      },
      params_bytes);
  updater_.visit_optimizer_state([&](const std::string& name, std::span<const float> values) {
    ranks_.on_root_or_abort(
        files_, [&] { writer->add_optimizer_buffer(name, values); }, values.size() * sizeof(float));
  });
  ranks_.on_root_or_abort(
      files_,
      [&] {
        writer->add_replica_rng_states(rng_states);
        writer->commit();
        if (best) copy_checkpoint(files_.last(), files_.best());
      },
      best ? 2 * file_bytes : file_bytes);  // the file flushed to storage, and its copy
  // The other ranks wait here, under their patience for the write, not in whatever comes next.
  ranks_.comm.barrier();
}

}  // namespace ddp::engine

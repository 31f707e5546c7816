// `ddptrain [train]`: the training command on every rank, from the config read before MPI_Init to the exit
// code: the config and topology agreed on, the data checked (each rank its share of the rows), one job on
// every rank, the run directory claimed and the timeline started, then training (training_job.h), and at the
// end the stop, if any, said once with how to continue.
#include <array>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/host_group.h"
#include "engine/app/commands.h"
#include "engine/app/learning_curves.h"
#include "engine/base/build_info.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/device.h"
#include "engine/job_agreement.h"
#include "engine/preemption.h"
#include "engine/run_directory.h"
#include "engine/topology.h"
#include "engine/training_job.h"
#include "engine/watchdog.h"
#include "io/dataset.h"
#include "io/dataset_fingerprint.h"
#include "models/blas_threads.h"
#include "models/cpu_threads.h"
#include "models/fma_rate.h"
#include "models/replica.h"

namespace ddp::engine {
namespace {

// The splits a run reads, in the order their counts travel: name and rows.
std::array<std::pair<const char*, int64_t>, 3> splits_of(const ddp::io::DatasetInfo& data) {
  return {{{"train", data.train_size}, {"test", data.test_size}, {"val", data.val_size}}};
}

// Where a stopped run stands and how to continue it, for the stop message.
std::string stop_summary(int64_t epochs_done, int64_t steps_in_epoch, const std::string& dir) {
  const std::string last = dir + "/last.h5";
  std::string where;
  if (steps_in_epoch > 0) {
    where = (epochs_done > 0 ? "after epoch " + std::to_string(epochs_done) + ", " : std::string("at ")) +
            "step " + std::to_string(steps_in_epoch) + " of epoch " + std::to_string(epochs_done + 1);
  } else if (epochs_done > 0) {
    where = "after epoch " + std::to_string(epochs_done);
  } else if (!std::filesystem::exists(last)) {
    return "before its first step: no checkpoint yet";
  } else {
    where = "before its first step";
  }
  return where + ": " + last + " holds the progress; run again with --resume auto to continue";
}

// `ddptrain` alone: the first lines of --help (how to call it) instead of complaining about a missing key.
int usage_command(int rank) {
  if (rank != 0) return kExitUserError;
  const std::string help = engine::parse_config({"--help"}).help;
  std::fprintf(stderr, "%s\nddptrain --help lists every key, its default and meaning\n",
               help.substr(0, help.find("\n\n") + 1).c_str());
  return kExitUserError;
}

// model.cpu_kernels = auto picks kernels by measuring the core's FMA units (models/fma_rate.h), which another
// process's load can disturb on one rank: the ranks that measure vote, the majority's answer holds on every
// rank, and the job runs one kind of kernels. A resumed run takes the answer its checkpoint recorded instead,
// so that it runs the kernels of the run it continues, and equals it, whatever load its start meets.
// Collective over `world`.
void agree_on_fma_units(const engine::Config& config, comm::HostGroup& world) {
  const int rank = world.rank();
  const bool votes = config.model.cpu_kernels == "auto" && models::widest_fma() == models::FmaWidth::kAvx512;
  std::vector<int64_t> recorded{-1};  // rank 0's checkpoint's answer: 0, 1, or -1 for none
  if (rank == 0 && votes && config.resume != "no") {
    const engine::RunFiles files{config.checkpoint.dir};
    if (const std::optional<bool> wide = engine::read_checkpoint_fma_verdict(files.last()))
      recorded[0] = *wide ? 1 : 0;
  }
  world.broadcast(std::span<int64_t>(recorded), 0);
  if (recorded[0] >= 0) {
    if (votes) models::settle_avx512_fma_outpaces_avx2(recorded[0] == 1);
    return;
  }
  int64_t ballot[2] = {votes && models::avx512_fma_outpaces_avx2() ? 1 : 0, votes ? 1 : 0};  // yes, voters
  world.sum(std::span<int64_t>(ballot));
  if (votes) models::settle_avx512_fma_outpaces_avx2(2 * ballot[0] > ballot[1]);
}

}  // namespace

int train_command(const std::vector<std::string>& args, ConfigReadEarly early,
                  engine::ProgressWatchdog& watchdog, comm::HostGroup& boot) {
  if (args.empty()) return usage_command(boot.rank());
  watchdog.enter("reading the config");
  engine::ParsedConfig parsed;
  comm::agree_on_errors(boot, [&] {
    if (early.error) std::rethrow_exception(early.error);
    parsed = std::move(early.parsed);
  });
  if (parsed.action == engine::ConfigAction::kHelp) {
    if (boot.rank() != 0) return kExitOk;
    std::cout << parsed.help;
    return check_stdout_written(kExitOk);
  }
  if (parsed.action == engine::ConfigAction::kVersion) {
    if (boot.rank() != 0) return kExitOk;
    std::printf("ddptrain %s (commit %s)\nGPU path: %s\n", DDPTRAIN_VERSION, build_commit(),
                gpu_build_line().c_str());
    return check_stdout_written(kExitOk);
  }
  const engine::Config& config = parsed.config;

  watchdog.enter("discovering the topology");
  engine::Topology topology;
  comm::agree_on_errors(boot, [&] { topology = engine::discover_topology(boot, config.device); });
  agree_on_fma_units(config, boot);
  const int compute_threads = engine::compute_threads_for(topology, config.train.threads);
  const models::CpuThreadPlan threads = models::plan_cpu_threads(
      compute_threads, models::parse_cpu_kernels(config.model.cpu_kernels, {}, {}, compute_threads));

  io::DatasetInfo data;
  watchdog.enter("reading data.path " + config.data.path);
  std::vector<double> rows_without_tokens(3, 0.0);  // train, test, val
  comm::agree_on_errors(boot, [&] {
    data = io::inspect_dataset(config.data.path);
    if (!config.data.validate) return;
    // Each rank checks the rows it will read, so the file is scanned once in all.
    const auto splits = splits_of(data);
    for (std::size_t i = 0; i < 3; ++i) {
      if (splits[i].second == 0) continue;  // an empty or absent split
      const io::Shard rows = io::shard_of(splits[i].second, boot.rank(), boot.size(), /*cover_all=*/true);
      rows_without_tokens[i] = static_cast<double>(io::validate_rows(
          data, splits[i].first, rows.begin, rows.end, [&watchdog] { watchdog.proceed(); }));
    }
  });
  boot.sum(rows_without_tokens);

  watchdog.enter("checking that every rank was given one job (ddptrain, settings and data)");
  engine::JobDescription job;
  comm::agree_on_errors(
      boot, [&] { job = engine::describe_job(config, topology.host, io::dataset_fingerprint(data)); });
  engine::require_one_job(boot, job);

  if (boot.rank() == 0) {
    std::printf("ddptrain %s: %d rank(s)\n", DDPTRAIN_VERSION, boot.size());
    std::printf("compute threads: %d per rank, one pool: %s%s\n", threads.threads, threads.pool.c_str(),
                threads.blas_told ? "" : " (the BLAS's threads set by its own environment variable)");
    if (const std::string hint = engine::idle_cores_hint(topology, config.train.threads); !hint.empty())
      std::printf("hint (rank 0): %s\n", hint.c_str());
    if (const std::string hint = models::blas_kernels_hint(); !hint.empty() && topology.gpu < 0)
      std::printf("hint (rank 0): %s\n", hint.c_str());
    const auto splits = splits_of(data);
    for (std::size_t i = 0; i < 3; ++i) {
      if (rows_without_tokens[i] == 0) continue;
      std::printf("%s\n",
                  io::rows_without_tokens_note(data, splits[i].first,
                                               static_cast<int64_t>(rows_without_tokens[i]), splits[i].second)
                      .c_str());
    }
    std::fflush(stdout);
  }
  const std::string timeline_path = engine::inside_run_directory(config.checkpoint.dir, config.log.timeline);
  // The run directory is this run's before anything is written into it (the timeline's part files): a second
  // run started there must not touch the first one's files (engine/run_directory.h).
  std::shared_ptr<engine::RunDirectoryLock> directory_lock;
  watchdog.enter("preparing checkpoint.dir " + config.checkpoint.dir);
  comm::agree_on_errors(boot, [&] {
    if (boot.rank() != 0) return;
    engine::refuse_resume_of_missing_directory({config.checkpoint.dir}, config.resume);
    directory_lock = engine::RunDirectoryLock::hold({config.checkpoint.dir});
  });
  if (!timeline_path.empty()) {
    watchdog.enter("starting the timeline");
    comm::agree_on_errors(boot, [&] {
      boot.barrier();                              // the ranks' time origins meet within the barrier's skew
      if (timeline_path != config.log.timeline) {  // inside the run directory, made on rank 0 only
        std::error_code ignored;                   // if it cannot be made, timeline::start says so
        std::filesystem::create_directories(config.checkpoint.dir, ignored);
      }
      timeline::start(
          timeline_path, boot.rank(),
          "rank " + std::to_string(boot.rank()) + " (" + topology.host + ", " + topology.device + ")");
    });
  }
  const engine::TrainResult result = engine::train(
      config, topology, data, boot, watchdog,
      [](const engine::RunFiles& files) { engine::write_learning_curves(files.metrics(), files.curves()); });
  watchdog.enter("finishing");
  if (!timeline_path.empty()) {
    // Every rank's events go to rank 0, so the trace needs no shared file system.
    const std::vector<std::string> events = boot.gather(timeline::finish(), 0);
    if (boot.rank() == 0) {
      // A resumed run's trace covers its own part; the earlier part's stays beside it. A replaced run's goes.
      const std::string kept = config.checkpoint.overwrite ? "" : timeline::keep_earlier_trace(timeline_path);
      // The replaced run's earlier traces went with its checkpoints (inside the run directory only: a trace
      // path elsewhere may sit beside other runs' traces).
      if (config.checkpoint.overwrite && timeline_path != config.log.timeline)
        timeline::remove_earlier_traces(timeline_path);
      timeline::write_trace(timeline_path, events);
      if (kept.empty()) {
        std::printf("timeline: %s\n", timeline_path.c_str());
      } else {
        std::printf("timeline: %s (the earlier trace there is now %s)\n", timeline_path.c_str(),
                    kept.c_str());
      }
    }
  }
  // Parameter servers do not see the workers' stop: the training ranks' values (the same on each) win over
  // the servers' zeros, so every rank exits alike and rank 0 can say where the run stopped and why.
  // The last is a signal any rank received after the training ranks last agreed on one: during the last
  // evaluation or the test score, after the last step, where nothing is left to stop.
  int64_t stop[5] = {result.stopped_by_signal ? 1 : 0, result.epochs_done, result.steps_done_in_epoch,
                     result.stop_signal, engine::stop_signal_number_received()};
  boot.max(std::span<int64_t>(stop));
  // After a SIGPIPE stdout leads nowhere: the last word goes to stderr.
  std::FILE* const said_on = stop[3] == SIGPIPE || stop[4] == SIGPIPE ? stderr : stdout;
  if (stop[0] == 0) {
    if (stop[4] != 0 && boot.rank() == 0) {
      std::fprintf(said_on, "%s came after the last step: the run had finished (nothing to stop or resume)\n",
                   engine::stop_signal_name(static_cast<int>(stop[4])).c_str());
    }
    return kExitOk;
  }
  const std::string by = engine::stop_signal_name(static_cast<int>(stop[3]));
  // A signal at the last epoch's last step waits for the epoch's end: then there is nothing left to resume.
  if (stop[1] >= config.train.epochs) {
    if (boot.rank() == 0)
      std::fprintf(said_on, "%s came as the run ended: all epochs are done\n", by.c_str());
    return kExitOk;
  }
  if (boot.rank() == 0) {
    std::fprintf(said_on, "stopped by %s %s (exit code %d)\n", by.c_str(),
                 stop_summary(stop[1], stop[2], config.checkpoint.dir).c_str(), kExitPreempted);
    std::fflush(said_on);
  }
  return kExitPreempted;
}

}  // namespace ddp::engine

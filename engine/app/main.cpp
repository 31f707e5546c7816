// ddptrain's entry point: picks the subcommand (commands.h lists them) and maps errors to exit codes:
// 0 success, 1 internal error, 2 bad input (config, command line, data or checkpoint file); check-env and a
// preempted run have their own codes (errors.h).
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm/host_group.h"
#include "comm/mpi_session.h"
#include "comm/stall_census.h"
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
#include "io/damaged_file_guard.h"
#include "io/dataset.h"
#include "io/dataset_fingerprint.h"
#include "io/hdf5_util.h"
#include "models/blas_threads.h"
#include "models/cpu_threads.h"
#include "models/fma_rate.h"
#include "models/onednn_lstm.h"

namespace ddp {
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

// After a command's output: a full disk or a closed stdout must not pass for success (the predictions, the
// evaluation report would be lost without a word).
int check_stdout_written(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return status;
  const std::string why = write_error_reason();
  std::fprintf(stderr, "ddptrain: error: cannot write the output to stdout (%s): it is incomplete\n",
               why.c_str());
  return status != kExitOk ? status : kExitUserError;
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

// The training config as this rank read it before MPI started, or the error reading it gave (reported after
// MPI_Init by every rank together).
struct ConfigReadEarly {
  engine::ParsedConfig parsed;
  std::exception_ptr error;

  // The watchdog's timeout: the config's, else the default (the error ends the run soon anyway).
  double timeout_s() const { return error ? engine::Config{}.comm.timeout_s : parsed.config.comm.timeout_s; }
};

ConfigReadEarly read_config_early(const std::vector<std::string>& args) {
  ConfigReadEarly early;
  try {
    early.parsed = engine::parse_config(args);
  } catch (...) {
    early.error = std::current_exception();
  }
  return early;
}

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
                engine::gpu_build_line().c_str());
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

}  // namespace
}  // namespace ddp

namespace {

// An allocation the node refused: inputs past what fits (a size read from a file is checked before it is
// allocated, but not every buffer can be foreseen).
constexpr const char* kOutOfMemory =
    "out of memory (an allocation failed): a smaller model, train.batch_size or data.prefetch, fewer ranks "
    "on this node, or smaller inputs need less";

// An error this rank met alone (a batch or a cuDNN shape after start-up, an allocation): the others may be
// waiting for it in a collective, so with more than one rank it ends the job.
int rank_alone_error(const ddp::comm::HostGroup& boot, ddp::comm::StallCensus& census, const char* what) {
  if (boot.size() > 1) {
    // Ranks that meet the same bad input at once print one line: the lowest of them; the others wait for
    // its MPI_Abort, and speak only if it never comes.
    if (!census.first_to_speak(std::chrono::milliseconds(500)))
      std::this_thread::sleep_for(std::chrono::seconds(15));
    ddp::end_job_with_user_error(what);
  }
  std::fprintf(stderr, "ddptrain: error: %s\n", what);
  return ddp::kExitUserError;
}

// The subcommands that run as one plain process, without MPI. Started by a launcher as several processes
// (the train command's mpirun prefix pasted), the first does the work and the others nothing, rather than
// every one writing the same file or printing the same lines.
int run_without_mpi(const std::string& command, const std::vector<std::string>& args) {
  const int launched = ddp::launcher_world_size();
  if (launched > 1) {
    if (ddp::launcher_rank() != "0") return ddp::kExitOk;
    const std::string others =
        launched == 2 ? "rank 1 does" : "ranks 1-" + std::to_string(launched - 1) + " do";
    std::fprintf(stderr,
                 "note: ddptrain %s runs as one process; the launcher started %d, and %s nothing (run it "
                 "without mpirun)\n",
                 command.c_str(), launched, others.c_str());
  }
  try {
    if (command == "prepare") return ddp::check_stdout_written(ddp::engine::prepare_command(args));
    if (command == "predict") return ddp::check_stdout_written(ddp::engine::predict_command(args));
    return ddp::check_stdout_written(ddp::engine::evaluate_command(args));
  } catch (const ddp::UserError& e) {
    std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
    return ddp::kExitUserError;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ddptrain: error: %s\n", kOutOfMemory);
    return ddp::kExitUserError;
  } catch (const std::exception& e) {
    // Caught, not left to terminate: the stack unwinds, and a partly written output file is removed.
    std::fprintf(stderr, "ddptrain: fatal: unexpected error: %s\n", e.what());
    return ddp::kExitInternalError;
  }
}

// MPI_Finalize waits for every rank (Open MPI ends with a fence), with no deadline either, and MPI_Abort
// cannot end a job that is finalizing: a rank that is still waiting after the timeout leaves without MPI, and
// the launcher, seeing a rank end without finalizing, ends the job, the hung rank included. This rank's work
// is done and saved by then; its exit status says the job did not end cleanly.
void finalize_mpi_watched(std::unique_ptr<ddp::engine::ProgressWatchdog>& watchdog, int status) {
  const double timeout_s = watchdog->timeout_s();
  const std::string setting = watchdog->timeout_setting();
  watchdog.reset();
  const int exit_code = status != ddp::kExitOk ? status : ddp::kExitInternalError;
  watchdog = std::make_unique<ddp::engine::ProgressWatchdog>(
      timeout_s, [exit_code](const std::string& reason) { ddp::leave_without_finalizing(reason, exit_code); },
      ddp::engine::ProgressWatchdog::HealthCheck{}, setting);
  watchdog->enter("finalizing MPI (MPI_Finalize waits for every rank)");
  ddp::comm::finalize_mpi();
  watchdog.reset();
}

}  // namespace

int main(int argc, char** argv) {
  ddp::io::skip_hdf5_cleanup_at_exit();
  // A file-size limit (ulimit -f) must fail the write (EFBIG), which every writer reports with the file it
  // was writing and leaves the last checkpoint in place, not kill the process without a word.
  std::signal(SIGXFSZ, SIG_IGN);
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string command = args.empty() ? "" : args[0];
  if (command == "prepare" || command == "predict" || command == "evaluate") {
    return run_without_mpi(command, {args.begin() + 1, args.end()});
  }
  // The configuration reference (launch/CONFIG.md's generated part), from the key table: no MPI, no rank.
  if (command == "config-reference") {
    if (args.size() > 1) {
      std::fprintf(stderr, "ddptrain: error: config-reference takes no options\n");
      return ddp::kExitUserError;
    }
    std::fputs(ddp::engine::config_reference_markdown().c_str(), stdout);
    return ddp::check_stdout_written(ddp::kExitOk);
  }
  const bool check_env = command == "check-env";
  if (command == "train" || check_env) args.erase(args.begin());

  // Every collective waits for every rank, MPI_Init's own exchange included, with no deadline: a rank that
  // hangs must end the job, not freeze it, so the watchdog starts before MPI does, with the config's
  // comm.timeout_s (read first, on each rank alone). Ended by the watchdog before MPI_Init returns, a rank
  // exits without MPI, and the launcher ends the job.
  ddp::ConfigReadEarly early = check_env ? ddp::ConfigReadEarly{} : ddp::read_config_early(args);
  auto watchdog = check_env ? ddp::engine::check_env_watchdog(ddp::engine::check_env_timeout_early(args))
                            : std::make_unique<ddp::engine::ProgressWatchdog>(early.timeout_s());
  // Before MPI_Init, whose exchange grows with the job: a preemption signal during start-up is kept for the
  // first step boundary (a checkpoint and exit 75, which the batch scripts requeue) rather than killing the
  // rank.
  if (!check_env) ddp::engine::install_stop_signal_handlers();
  watchdog->enter("starting MPI (MPI_Init)");
  ddp::comm::set_mpi_transport_defaults();
  ddp::comm::start_mpi(argc, argv);
  // From here a stall's message names the ranks the others wait for (comm/stall_census.h). The ranks listen
  // for each other a fifth of the timeout (1 to 10 s): their watchdogs fire that far apart at most, checking
  // ten times per timeout, where they all wait in the same collective.
  auto census = std::make_shared<ddp::comm::StallCensus>(MPI_COMM_WORLD);
  const auto listen = std::chrono::milliseconds(
      static_cast<int64_t>(1000 * std::clamp(watchdog->timeout_s() / 5, 1.0, 10.0)));
  watchdog->set_stall_survey([census, listen](const std::string& phase, int64_t steps_done) {
    return census->survey(phase, steps_done, listen);
  });
  watchdog->set_stall_detail([] { return ddp::io::guarded_reads_note(std::chrono::steady_clock::now()); });
  int status = ddp::kExitOk;
  {
    auto boot = ddp::comm::HostGroup::world();
    try {
      status = check_env ? ddp::engine::check_env_command(args, watchdog)
                         : ddp::train_command(args, std::move(early), *watchdog, boot);
    } catch (const ddp::AgreedUserError& e) {
      // Every rank has it: one line, and all ranks leave together.
      if (boot.rank() == 0) std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
      status = ddp::kExitUserError;
    } catch (const ddp::UserError& e) {
      status = rank_alone_error(boot, *census, e.what());
    } catch (const std::bad_alloc&) {
      status = rank_alone_error(boot, *census, kOutOfMemory);
    } catch (const std::exception& e) {
      ddp::fatal(std::string("unexpected error: ") + e.what(), __FILE__, __LINE__);
    }
  }
  finalize_mpi_watched(watchdog, status);
  return status;
}

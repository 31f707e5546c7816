// ddptrain's entry point: picks the subcommand (commands.h lists them) and maps errors to exit codes:
// 0 success, 1 internal error, 2 bad input (config, command line, data or checkpoint file); check-env and a
// preempted run have their own codes (errors.h).
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "comm/host_group.h"
#include "comm/mpi_session.h"
#include "comm/stall_census.h"
#include "engine/app/commands.h"
#include "engine/base/errors.h"
#include "engine/config.h"
#include "engine/preemption.h"
#include "engine/watchdog.h"
#include "io/damaged_file_guard.h"
#include "io/hdf5_util.h"

namespace ddp::engine {

int check_stdout_written(int status) {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && !std::ferror(stdout)) return status;
  const std::string why = write_error_reason();
  std::fprintf(stderr, "ddptrain: error: cannot write the output to stdout (%s): it is incomplete\n",
               why.c_str());
  return status != kExitOk ? status : kExitUserError;
}

ConfigReadEarly read_config_early(const std::vector<std::string>& args) {
  ConfigReadEarly early;
  try {
    early.parsed = engine::parse_config(args);
  } catch (...) {
    early.error = std::current_exception();
  }
  return early;
}

}  // namespace ddp::engine

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
    if (command == "prepare") return ddp::engine::check_stdout_written(ddp::engine::prepare_command(args));
    if (command == "predict") return ddp::engine::check_stdout_written(ddp::engine::predict_command(args));
    return ddp::engine::check_stdout_written(ddp::engine::evaluate_command(args));
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
    return ddp::engine::check_stdout_written(ddp::kExitOk);
  }
  const bool check_env = command == "check-env";
  if (command == "train" || check_env) args.erase(args.begin());

  // Every collective waits for every rank, MPI_Init's own exchange included, with no deadline: a rank that
  // hangs must end the job, not freeze it, so the watchdog starts before MPI does, with the config's
  // comm.timeout_s (read first, on each rank alone). Ended by the watchdog before MPI_Init returns, a rank
  // exits without MPI, and the launcher ends the job.
  ddp::engine::ConfigReadEarly early =
      check_env ? ddp::engine::ConfigReadEarly{} : ddp::engine::read_config_early(args);
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
  // ten times per timeout, where they all wait in the same collective, and a rank alive answers within a
  // check's period (a tenth of the timeout, at most 1 s).
  auto census = std::make_shared<ddp::comm::StallCensus>(MPI_COMM_WORLD);
  const auto listen = std::chrono::milliseconds(
      static_cast<int64_t>(1000 * std::clamp(watchdog->timeout_s() / 5, 1.0, 10.0)));
  watchdog->set_stall_survey([census, listen](const std::string& phase, int64_t steps_done) {
    return census->survey(phase, steps_done, listen);
  });
  watchdog->set_stall_answer([census](const std::string& phase, int64_t steps_done, double silent_s) {
    census->answer(phase, steps_done, silent_s);
  });
  watchdog->set_stall_detail([] { return ddp::io::guarded_reads_note(std::chrono::steady_clock::now()); });
  int status = ddp::kExitOk;
  {
    auto boot = ddp::comm::HostGroup::world();
    try {
      status = check_env ? ddp::engine::check_env_command(args, watchdog)
                         : ddp::engine::train_command(args, std::move(early), *watchdog, boot);
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

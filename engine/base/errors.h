// Error handling shared by every room of the engine.
//
// Two kinds of failure, two paths:
//  - UserError: the user's input is wrong (a config key or value, a data file). It carries one line that
//  names
//    the file, key or value; the command prints it and exits with kExitUserError. Ranks agree on it through
//    the communicator before exiting, so no rank is left waiting in a collective.
//  - fatal(): something that should never fail did (an MPI, HDF5 or CUDA call). It prints the expression,
//    file:line, host and rank, then calls MPI_Abort so that a dead rank ends the job instead of hanging it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp {

constexpr int kExitOk = 0;
constexpr int kExitInternalError = 1;
constexpr int kExitUserError = 2;
// `ddptrain check-env` found a problem on this node (the report says what and what to do).
constexpr int kExitEnvironmentProblem = 3;
// Training stopped on SIGINT, SIGTERM or SIGUSR1 (Ctrl-C, preemption, a time limit) after every rank wrote or
// agreed on last.h5; run again with --resume auto to continue. 75 is EX_TEMPFAIL: "try again later".
constexpr int kExitPreempted = 75;

// `text` with its control characters written as escapes (a newline as \n, others as \xNN), so that a message
// quoting what the user typed or a file held stays one line; past 2000 bytes cut, saying its whole length.
std::string one_line(std::string_view text);

// Why the last write through a stream failed: strerror(errno) ("No space left on device"), or "a write
// failed" where the library left errno unset. Set errno to 0 before the write.
std::string write_error_reason();

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& what) : std::runtime_error(one_line(what)) {}
  explicit UserError(const char* what) : UserError(std::string(what)) {}
};

// A UserError that every rank threw alike (comm::agree_on_errors): one rank prints it and all exit together.
// Any other UserError that reaches main() was seen by this rank alone, while the others may wait for it in a
// collective: main() prints it with the rank and host and ends the whole job (end_job_with_user_error).
class AgreedUserError : public UserError {
 public:
  using UserError::UserError;
};

// Prints "ddptrain: error: <what> (rank R on host H)" and ends the whole MPI job with kExitUserError, so the
// other ranks stop instead of waiting for this one until the watchdog fires.
[[noreturn]] void end_job_with_user_error(const std::string& what);

// Prints "ddptrain: fatal: <what> (<file>:<line>, host H, rank R)" and aborts the whole MPI job with
// `exit_code`; while a ThrowFatalErrors is alive on this thread, throws FatalError instead.
[[noreturn]] void fatal(const std::string& what, const char* file, int line,
                        int exit_code = kExitInternalError);

// For a rank stuck in MPI_Finalize, which MPI_Abort cannot end: prints "ddptrain: error: <what>; leaving
// without MPI, so that the launcher ends the job (host H, rank R)" and exits the process with `exit_code`.
// The launcher sees a rank end without finalizing and ends the others, the stuck one included.
[[noreturn]] void leave_without_finalizing(const std::string& what, int exit_code);

// What fatal() throws under ThrowFatalErrors: "<what> (<file>:<line>)".
class FatalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// For code whose job is to report failures rather than die of them (check-env's smoke test: a cuDNN that
// does not match the driver must show in the node's report). Only where no other rank can be left waiting:
// a rank that throws out of a collective would hang the job. Scopes nest.
class ThrowFatalErrors {
 public:
  ThrowFatalErrors();
  ~ThrowFatalErrors();
  ThrowFatalErrors(const ThrowFatalErrors&) = delete;
  ThrowFatalErrors& operator=(const ThrowFatalErrors&) = delete;

 private:
  bool previous_;
};

// The short host name of this process, for log lines.
std::string host_name();

// This process's rank as its launcher numbered it (mpirun, srun, a PMIx launcher), for a message written
// where MPI cannot be asked (before MPI_Init, during MPI_Finalize, in a signal handler); "?" if none says.
std::string launcher_rank();
// How many processes the launcher started (mpirun: OMPI_COMM_WORLD_SIZE; MPICH's PMI_SIZE); 1 if none says.
int launcher_world_size();

}  // namespace ddp

#define DDP_FATAL(what) ::ddp::fatal((what), __FILE__, __LINE__)

// Internal invariant; on failure the job ends through fatal().
#define DDP_CHECK(cond)                             \
  do {                                              \
    if (!(cond)) DDP_FATAL("check failed: " #cond); \
  } while (0)

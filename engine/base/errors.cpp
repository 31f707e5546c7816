#include "engine/base/errors.h"

#include <mpi.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ddp {
namespace {

thread_local bool throw_fatal_errors = false;

}  // namespace

ThrowFatalErrors::ThrowFatalErrors() : previous_(throw_fatal_errors) {
  throw_fatal_errors = true;
}

ThrowFatalErrors::~ThrowFatalErrors() {
  throw_fatal_errors = previous_;
}

std::string write_error_reason() {
  return errno != 0 ? std::strerror(errno) : "a write failed";
}

std::string one_line(std::string_view text) {
  // A message quotes what it was given (a config value, a file's bytes); past a screenful it says how long.
  constexpr std::size_t kMostBytes = 2000;
  const std::size_t whole = text.size();
  if (whole > kMostBytes) text = text.substr(0, kMostBytes);
  std::string line;
  line.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (byte < 0x20 || byte == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      line += {'\\', 'x', kHex[byte >> 4], kHex[byte & 15]};
    } else {
      line += c;
    }
  }
  if (whole > kMostBytes) line += "... (" + std::to_string(whole) + " bytes in all)";
  return line;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown-host";
  std::string host(name);
  return host.substr(0, host.find('.'));
}

std::string launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return value;
  }
  return "?";
}

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    char* end = nullptr;
    const long size = std::strtol(value, &end, 10);
    if (*end == '\0' && size >= 1 && size <= 1 << 24) return static_cast<int>(size);
  }
  return 1;
}

void fatal(const std::string& what, const char* file, int line, int exit_code) {
  if (throw_fatal_errors) throw FatalError(what + " (" + file + ":" + std::to_string(line) + ")");
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  std::string rank = launcher_rank();
  if (initialized && !finalized) {
    int mpi_rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
    rank = std::to_string(mpi_rank);
  }
  std::fprintf(stderr, "ddptrain: fatal: %s (%s:%d, host %s, rank %s)\n", what.c_str(), file, line,
               host_name().c_str(), rank.c_str());
  std::fflush(stderr);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void leave_without_finalizing(const std::string& what, int exit_code) {
  std::fflush(stdout);  // what the run printed last (its result) must not be lost with the process
  // The launcher's number: MPI's own calls are not to be made while MPI_Finalize runs.
  std::fprintf(
      stderr,
      "ddptrain: error: %s; leaving without MPI, so that the launcher ends the job (host %s, rank %s)\n",
      what.c_str(), host_name().c_str(), launcher_rank().c_str());
  std::fflush(stderr);
  std::_Exit(exit_code);
}

void end_job_with_user_error(const std::string& what) {
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "ddptrain: error: %s (rank %d on host %s)\n", what.c_str(), rank, host_name().c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, kExitUserError);
  std::_Exit(kExitUserError);
}

}  // namespace ddp

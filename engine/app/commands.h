// ddptrain's subcommands. main.cpp picks one from the first argument; each parses its own options with
// Boost.Program_options and returns the process's exit code (errors.h), throwing UserError for bad input.
//
//   ddptrain [train] --config FILE [--section.key VALUE ...]   data-parallel training (under mpirun/srun)
//   ddptrain prepare synthetic|imdb-npz|text ...               make a dataset file (dataset.h's schema)
//   ddptrain predict --checkpoint F --data F (--text T | --input FILE)
//   ddptrain evaluate --checkpoint F --data F                  loss and accuracy on the test split
//   ddptrain check-env                                         what this node has (also under mpirun)
//   ddptrain config-reference                                  every config key (launch/CONFIG.md)
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "engine/config.h"

namespace ddp::comm {
class HostGroup;
}

namespace ddp::engine {

class ProgressWatchdog;

// After a command's output: a full disk or a closed stdout must not pass for success (the predictions, the
// evaluation report would be lost without a word). Returns `status`, or an error where the output was lost.
int check_stdout_written(int status);

// Without MPI: one process.
int prepare_command(const std::vector<std::string>& args);
int predict_command(const std::vector<std::string>& args);
int evaluate_command(const std::vector<std::string>& args);

// The training config as this rank read it before MPI started, or the error reading it gave (reported after
// MPI_Init by every rank together).
struct ConfigReadEarly {
  ParsedConfig parsed;
  std::exception_ptr error;

  // The watchdog's timeout: the config's, else the default (the error ends the run soon anyway).
  double timeout_s() const { return error ? Config{}.comm.timeout_s : parsed.config.comm.timeout_s; }
};
ConfigReadEarly read_config_early(const std::vector<std::string>& args);

// After MPI_Init, on every rank of MPI_COMM_WORLD.
// train (train_command.cpp): the config read early agreed on, the topology, the data checked, the run
// directory and timeline prepared, the training job (training_job.h), and the exit code a stop calls for.
int train_command(const std::vector<std::string>& args, ConfigReadEarly early, ProgressWatchdog& watchdog,
                  comm::HostGroup& boot);
// check-env watches its own collectives: it replaces `watchdog` with one on its --timeout.
int check_env_command(const std::vector<std::string>& args, std::unique_ptr<ProgressWatchdog>& watchdog);
// check-env's watchdog: on a stall it ends the job with kExitEnvironmentProblem, naming --timeout.
std::unique_ptr<ProgressWatchdog> check_env_watchdog(double timeout_s);
// check-env's --timeout as given on the command line (at least 1 s), read before MPI starts so that a rank
// that never joins MPI_Init is waited for that long; the default where it is absent or no number (the full
// parse after MPI_Init reports it).
double check_env_timeout_early(const std::vector<std::string>& args);

}  // namespace ddp::engine

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

#include <memory>
#include <string>
#include <vector>

namespace ddp::engine {

class ProgressWatchdog;

// Without MPI: one process.
int prepare_command(const std::vector<std::string>& args);
int predict_command(const std::vector<std::string>& args);
int evaluate_command(const std::vector<std::string>& args);

// After MPI_Init, on every rank of MPI_COMM_WORLD (training itself is main.cpp's train_command).
// check-env watches its own collectives: it replaces `watchdog` with one on its --timeout.
int check_env_command(const std::vector<std::string>& args, std::unique_ptr<ProgressWatchdog>& watchdog);
// check-env's watchdog: on a stall it ends the job with kExitEnvironmentProblem, naming --timeout.
std::unique_ptr<ProgressWatchdog> check_env_watchdog(double timeout_s);
// check-env's --timeout as given on the command line (at least 1 s), read before MPI starts so that a rank
// that never joins MPI_Init is waited for that long; the default where it is absent or no number (the full
// parse after MPI_Init reports it).
double check_env_timeout_early(const std::vector<std::string>& args);

}  // namespace ddp::engine

// Training with dedicated parameter servers (comm.backend = ps with K >= 1 servers; the colocated layout,
// where every rank serves, is colocated_updater.h): the trainer's side of comm/parameter_server.h.
//
// Roles. The last K = comm.ps_servers ranks of the job serve, the first W = size - K ranks are workers.
// Workers train as the ranks of the all-reduce backends do (the same loop in trainer.cpp, data sharded over
// the W workers, metrics and evaluation summed over the workers only), but their step pushes the gradients
// and pulls the updated parameters (ParameterClient::push_pull) instead of all-reduce + a local optimizer.
// Server j owns the contiguous shard [PsRoles::shard_begin(j), shard_end(j)) of the flat parameter vector and
// an engine::Optimizer over that shard, the same optimizer code the workers would run, applied as the
// ShardUpdate of comm::run_parameter_server. With comm.sparse_embedding a CPU worker pushes the embedding's
// gradient row-sparse (the rows its batch touched, PsOptions::sparse_exchange_rows); parameters come back
// dense.
//
// Runs of steps. The servers serve one run of steps at a time: an epoch, or its part up to a mid-epoch
// checkpoint (checkpoint.every_steps) or a stop (train.stop_after_steps). At its end every worker says done,
// the servers return from run_parameter_server, rank 0 (the first worker) gathers the parameter and
// optimizer-state shards and broadcasts the parameters to the workers, which then evaluate exactly what the
// servers hold; rank 0 writes it in the all-reduce backends' checkpoint format (full parameters, full
// optimizer buffers, iterations), so a checkpoint resumes under any backend. At the start rank 0 scatters
// the seed's or the checkpoint's parameters and optimizer state to the servers.
//
// Modes. sync (comm.ps_mode): the servers average the W gradients of a step and apply one update, so the
// parameters follow the all-reduce backends on W ranks (same seed, same data shards) up to float rounding,
// and Adam counts one iteration per step. async: every gradient is applied as it arrives, a worker at most
// comm.max_staleness pushes ahead of the slowest, and Adam counts one iteration per applied gradient (W per
// step of each worker).
//
// The world-level sequence. A server takes part in these calls only, in this order; on the workers the
// trainer (TrainingRun with the updater from make_ps_worker_updater) makes the same calls:
//   0. agree_on_errors over `world`: the workers' batch shapes and GPU self-checks
//   1. agree_on_errors over `world`: the run directory (rank 0 makes it)
//   2. agree_on_errors over `world`: the starting point (rank 0 reads the checkpoint or seeds)
//   3. Updater::distribute_start: rank 0 scatters the parameter and optimizer-state shards to the servers
//   4. gather over `world`: one start-up log line per rank
//   5. per run of steps: Updater::begin_steps (rank 0 broadcasts "another run"), the protocol of
//      parameter_server.h, Updater::end_steps (rank 0 gathers the shards)
//   6. Updater::finish: rank 0 broadcasts "no more", then the final parameters.
// The waits of 3, 5 and 6 poll with short sleeps (a waiting server leaves the cores to the workers) against
// comm.timeout_s, after which the job ends naming the rank waited for; so does the protocol (a worker
// silent for timeout_s while a server waits for it). timeout_s must therefore exceed the longest silence of
// a healthy rank: a step, an evaluation, writing a checkpoint.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/parameter_server.h"
#include "engine/config.h"
#include "engine/topology.h"
#include "engine/trainer.h"
#include "engine/updater.h"
#include "engine/watchdog.h"
#include "models/param_layout.h"

namespace ddp::engine {

// The job's split into workers and servers. Construction is collective over `world` (it duplicates it for
// the orchestration and splits off the workers); throws UserError (the same on every rank) before any
// collective if the split is impossible.
class PsJob {
 public:
  // Gradients in `layout`'s embedding may be pushed row-sparse (PsOptions::sparse_exchange_rows).
  PsJob(MPI_Comm world, const Config& config, int servers, const models::ParamLayout& layout);
  ~PsJob();
  PsJob(const PsJob&) = delete;
  PsJob& operator=(const PsJob&) = delete;

  const comm::PsRoles& roles() const { return roles_; }
  const comm::PsOptions& options() const { return options_; }
  int rank() const { return rank_; }
  bool serves() const { return roles_.is_server(rank_); }
  std::size_t total_size() const { return total_size_; }
  // "sync" or "async, ..." with the timeout, for the log.
  std::string describe_mode() const;

  // The duplicate of the world that the parameter server and the orchestration use.
  MPI_Comm world() const { return world_; }
  // The workers (only on a worker rank): for metrics, evaluation and broadcasts among them.
  comm::Communicator& workers();
  MPI_Comm workers_comm() const { return workers_comm_; }

  // MPI_Scatterv / MPI_Gatherv counts and displacements over world(): each server's shard, nothing for a
  // worker.
  const std::vector<int>& shard_counts() const { return counts_; }
  const std::vector<int>& shard_offsets() const { return offsets_; }

  // Completes `requests` by polling with short sleeps; if they are not done within comm.timeout_s, ends the
  // job with "<this rank> waited <timeout> s for <what>: rank lost?".
  void wait(std::vector<MPI_Request>& requests, const std::string& what) const;
  std::string me() const;  // "worker (rank 0)", "parameter server (rank 2)"

 private:
  comm::PsRoles roles_;
  comm::PsOptions options_;
  int rank_ = 0;
  std::size_t total_size_ = 0;
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm workers_comm_ = MPI_COMM_NULL;  // null on a server
  std::unique_ptr<comm::Communicator> workers_;
  std::vector<int> counts_;
  std::vector<int> offsets_;
};

// A worker's updater: push_pull in each step, the exchanges of the sequence above at the boundaries.
std::unique_ptr<Updater> make_ps_worker_updater(PsJob& job, models::Replica& replica,
                                                const OptimizerSettings& settings);

// A server rank's whole run: steps 1-6 above, serving its shard with the optimizer the config asks for.
// Its TrainResult has no history (the workers report the epochs) and the final parameters.
class PsServerRun {
 public:
  // `watchdog` watches the blocking calls of the sequence (1, 2, 4) and is paused where the protocol's own
  // deadlines hold.
  PsServerRun(PsJob& job, comm::Communicator& world, const Config& config, const Topology& topology,
              ProgressWatchdog& watchdog);
  TrainResult run();

 private:
  void receive_start();
  void send_state();
  void log_start();
  void log_traffic() const;

  PsJob& job_;
  comm::Communicator& world_;
  const Topology& topology_;
  ProgressWatchdog& watchdog_;
  int index_ = 0;  // of this server
  std::size_t begin_ = 0;
  std::vector<float> shard_;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t gradients_received_ = 0;  // over every run of steps
  int64_t gradient_bytes_ = 0;
};

}  // namespace ddp::engine

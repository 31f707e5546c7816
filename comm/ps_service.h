// The parameter server (comm.backend = ps) as the trainer sees it: one object per training rank that takes
// the step's gradients and returns the updated parameters, and, in the dedicated layout, the whole life of a
// rank that only serves. Every MPI call of the parameter server is in comm/: this interface, its two
// layouts beside it, the point-to-point protocol of ps_protocol.h and the collectives of
// sharded_exchange.h.
//
// Layouts (PsOptions::servers):
//   colocated (0): every rank trains and serves one contiguous shard of the flat parameter vector with that
//     shard's optimizer state. sync: a step is a reduce-scatter of the gradients (each owner gets its
//     shard's average), the owner's optimizer step, an all-gather of the updated shards. With a row-sparse
//     region (the embedding) its touched rows alone are pushed, and each rank fetches the rows its next
//     batch reads instead of receiving every row.
//   dedicated (K >= 1): the last K ranks only serve; the first W = size - K train, pushing gradients and
//     pulling parameters (ps_protocol.h, sync or async).
// Either way each shard's optimizer state lives on its owner only. Checkpoints take the whole state,
// gathered on the first training rank when asked (gather_state), in the canonical layout, so a checkpoint
// resumes under any backend and layout.
//
// The dedicated servers hear only from this interface: rank 0 (the first training rank) sends each server
// point-to-point control messages (start, another run of steps, no more, abandon) and the state hand-offs;
// no server repeats the trainers' collectives. A server waits for its start up to
// kStartupTimeouts x timeout_s (the trainers' start-up has several phases, each of which their watchdog
// bounds by timeout_s), then for each next message up to timeout_s, after which it ends the job naming rank
// 0. If the training ranks fail on an error they agree on (a bad checkpoint, a refused shape), rank 0's
// service tells the servers to abandon on its way out, and they end with kExitUserError, quietly: rank 0
// prints the reason.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "comm/ps_protocol.h"
#include "engine/base/errors.h"
#include "engine/base/optimizer_state.h"
#include "engine/optimizer/optimizer.h"

namespace ddp::comm {

// How long a dedicated server waits for its start, in units of timeout_s.
constexpr int kStartupTimeouts = 4;

// Makes the optimizer of a shard of `shard_size` floats, which the shard's owner steps (the trainer's
// optimizers, engine/optimizer/optimizer.h: the same updates as under all-reduce).
using ShardOptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::size_t shard_size)>;

// A training rank's side. The methods are collective over the training ranks (and, dedicated, the servers),
// called in the order below.
class ParameterService {
 public:
  virtual ~ParameterService() = default;

  // The training ranks: data shards, metrics, evaluation.
  virtual HostGroup& trainers() = 0;
  // For the backend line: the mode and timeout ("sync, timeout 120 s"; async with its staleness bound).
  virtual std::string describe() const = 0;
  // Whether every wait of exchange() has a deadline that names the rank waited for (the point-to-point
  // protocol); else (collectives) the trainer's watchdog must watch the steps.
  virtual bool exchange_has_deadlines() const = 0;

  // Rank 0's `params` and optimizer state (`whole_state`; null: the optimizer's zero state; ignored
  // elsewhere) become the start of every shard; on return `params` holds rank 0's parameters on every
  // training rank.
  virtual void distribute_start(std::span<float> params, const OptimizerState* whole_state) = 0;
  // Rank 0, after distribute_start: one start-up line per dedicated server (none when colocated).
  virtual std::vector<std::string> server_lines() const = 0;

  // A run of steps: begin_steps, then per step prepare_step and exchange, end_steps.
  virtual void begin_steps() = 0;
  // Before a step's forward pass: `params` receives the current values of the rows of
  // PsOptions::sparse_exchange_rows that the step reads (`tokens`: the batch's row ids, in any order, with
  // repeats). A layout that does not send every row after every update sends them now; the others have
  // nothing to do.
  virtual void prepare_step(std::span<const int32_t> /*tokens*/, std::span<float> /*params*/) {}
  // This step's gradients (the full flat vector, host memory) in; on return `params` (the full vector) holds
  // the updated parameters. `touched_rows` (sorted, unique; null: dense) lists the rows of
  // PsOptions::sparse_exchange_rows outside which the gradients are zero.
  virtual void exchange(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                        std::span<float> params) = 0;
  // The run's last pushes and replies, whose waits have deadlines of their own (the servers done with it).
  // end_steps does it first where it was not called.
  virtual void finish_pushes() = 0;
  // On return `params` holds the parameters the servers hold, the same on every training rank: collectives
  // among the training ranks, which the caller watches (a colocated layout's have no deadline of their own).
  virtual void end_steps(std::span<float> params) = 0;

  // Between runs of steps: the shards' update count (the same on every shard; rank 0's), and each buffer of
  // the whole optimizer state (every shard's) in turn to rank 0's `visit`, gathered one buffer at a time.
  virtual int64_t state_iterations() const = 0;
  virtual void visit_state(const StateBufferVisitor& visit) = 0;
  // No more steps: `params` (rank 0's) become the servers' final parameters.
  virtual void finish(std::span<const float> params) = 0;

  // The highest stop signal a dedicated server has received, as its replies reported (PsHeader), 0 if none:
  // the servers are not among the ranks that agree on a stop, so the training ranks act on it for them.
  virtual int servers_stop_signal() const { return 0; }
};

// A dedicated server rank's whole run.
class DedicatedServer {
 public:
  virtual ~DedicatedServer() = default;
  // Serves until rank 0 says there is no more, then returns the final parameters (the whole vector). Throws
  // ServiceAbandoned when rank 0 abandons the run.
  virtual std::vector<float> serve() = 0;
};

// What a dedicated server throws when the training ranks failed before the end: an error they agreed on,
// which rank 0 prints, so the server leaves quietly with kExitUserError as they do.
class ServiceAbandoned : public AgreedUserError {
 public:
  using AgreedUserError::AgreedUserError;
};

// This rank's part: `service` on a training rank, `server` on a dedicated server's.
struct ParameterServerRank {
  std::unique_ptr<ParameterService> service;
  std::unique_ptr<DedicatedServer> server;
};

// For the backend line: "sync, timeout 120 s", or async with its staleness bound (`trainer` names a training
// rank: "worker" or "rank").
std::string describe_mode(const PsOptions& options, const std::string& trainer);

// Collective over `world` (the layouts work on its communicator). `options.servers` picks the layout; `total`
// floats are served; `make_optimizer` builds each shard's optimizer. `server_line` is this rank's start-up
// line as a dedicated server, to which the server adds what it serves. Throws UserError (the same on every
// rank, before any collective) if the layout is impossible.
ParameterServerRank join_parameter_server(const HostGroup& world, const PsOptions& options, std::size_t total,
                                          const ShardOptimizerFactory& make_optimizer,
                                          const std::string& server_line);

// The two layouts (ps_service_colocated.cpp, ps_service_dedicated.cpp).
std::unique_ptr<ParameterService> make_colocated_service(MPI_Comm world, const PsOptions& options,
                                                         std::size_t total,
                                                         const ShardOptimizerFactory& make_optimizer);
ParameterServerRank join_dedicated_layout(MPI_Comm world, const PsOptions& options, std::size_t total,
                                          const ShardOptimizerFactory& make_optimizer,
                                          const std::string& server_line);

}  // namespace ddp::comm

// How a training rank's parameters change after each step, and where the optimizer state lives:
//   - the all-reduce backends (mpi, nccl): gradients averaged over the ranks, then every rank's own optimizer
//     over the whole flat buffer (AllReduceStep, all_reduce_updater.h);
//   - the parameter server (ps): gradients go to the ranks that serve the parameters' shards and hold their
//     optimizer state, the updated parameters come back (ps_updater.h over comm/ps_service.h).
// The trainer calls every method on every training rank, in the same order.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "engine/config.h"
#include "engine/optimizer/optimizer.h"
#include "models/replica.h"

namespace ddp::engine {

// The optimizer the config asks for (train.optimizer and its hyperparameters); `total_updates`: the updates
// its schedule spans (train.lr_schedule = cosine), 0 where no schedule needs it.
optim::OptimizerSettings optimizer_settings(const Config& config, int64_t total_updates = 0);

class Updater {
 public:
  virtual ~Updater() = default;

  // train.optimizer, for the log.
  virtual std::string optimizer_name() const = 0;

  // Collective: rank 0's parameters (`host_params`, canonical layout) and optimizer state (`whole_state`, a
  // resumed checkpoint's; null: the optimizer's zero state; ignored on the other ranks) become the starting
  // point of every rank; on return `host_params` and the replica hold them on every training rank.
  virtual void distribute_start(std::span<float> host_params, const OptimizerState* whole_state) = 0;

  // A run of steps (an epoch, or its part up to a checkpoint or a stop) begins.
  virtual void begin_steps() = 0;
  // Forward, backward and the update on one batch; its loss and accuracy go to the replica's running stats.
  virtual void step(const BatchView& batch) = 0;
  // The run of steps ends in two parts: first the exchange's last messages, waited for with deadlines of
  // their own where the exchange has them (exchange_has_deadlines(): the watchdog is paused), then
  // collectives that the watchdog watches. Afterwards every training rank's replica holds the same
  // parameters, as a checkpoint written now must hold them.
  virtual void finish_pushes() {}
  virtual void end_steps() = 0;
  // Between runs of steps, the optimizer state a checkpoint written now holds, in the canonical layout: its
  // update count (rank 0's; no communication), and, collective over the training ranks, each buffer of the
  // whole state in turn to rank 0's `visit` (the other ranks' is not called). One buffer at a time, so that
  // a state spread over the ranks is never whole on one.
  virtual int64_t optimizer_iterations() const = 0;
  virtual void visit_optimizer_state(const StateBufferVisitor& visit) = 0;
  // No more steps follow. Collective; after it `host_params` holds the final parameters on every rank (of
  // the job, servers included).
  virtual void finish(std::span<float> host_params) = 0;

  // Whether the exchange waits with deadlines of its own, naming the rank it waits for (the parameter
  // server's protocol): the trainer's watchdog pauses during its runs of steps instead of judging them.
  virtual bool exchange_has_deadlines() const { return false; }

  // For logs and metrics: "mpi", "nccl" or "ps".
  virtual std::string backend() const = 0;
  // A GPU rank's way of running its steps, for its start line (AllReduceStep::graph_note); "" where there
  // is nothing to say.
  virtual std::string step_note() const { return ""; }
  // On the way out of a failed run, before the reducer is aborted: the steps' CUDA graphs go (NCCL's abort
  // waits until no graph holds its collectives). No step may follow.
  virtual void release_step_graphs() noexcept {}
  // Whether the steps are replayed from CUDA graphs (step_graph.h), which the GPU self-check then checks too.
  virtual bool steps_from_graphs() const { return false; }
  // The all-reduce's gradient reducer, for the GPU self-check of its averages; null for the parameter server.
  virtual comm::GradientReducer* gradient_reducer() { return nullptr; }
  // Rank 0, after distribute_start(): the start-up lines of the ranks that serve and do not train.
  virtual std::vector<std::string> server_lines() const { return {}; }
  // The highest stop signal a rank that serves and does not train has received (it is not among the ranks
  // that agree on a stop), 0 if none.
  virtual int servers_stop_signal() const { return 0; }
};

}  // namespace ddp::engine

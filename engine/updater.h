// How a training rank's parameters change after each step, and where the optimizer state lives:
//   - the all-reduce backends (mpi, nccl): gradients averaged over the ranks, then every rank's own optimizer
//     over the whole flat buffer (AllReduceStep, all_reduce_updater.h);
//   - the parameter server (ps): the workers push gradients and pull parameters, the servers hold the
//     optimizer state of their shards (ps_training.h).
// The trainer calls every method on every training rank, in the same order.
#pragma once

#include <span>
#include <string>

#include "engine/config.h"
#include "engine/optimizer.h"
#include "models/replica.h"

namespace ddp::engine {

// The optimizer the config asks for (train.optimizer and its hyperparameters).
OptimizerSettings optimizer_settings(const Config& config);

class Updater {
 public:
  virtual ~Updater() = default;

  // The optimizer whose state checkpoints hold. Rank 0 loads a checkpoint's state into it before
  // distribute_start() and writes it after end_steps(). All-reduce: every rank's own. Parameter server: on
  // rank 0 a full-size optimizer that never steps, holding the state gathered from the servers; on the other
  // workers an empty one (size 0).
  virtual Optimizer& optimizer() = 0;

  // Collective: rank 0's parameters (`host_params`, canonical layout) and optimizer state become the
  // starting point of every rank; on return `host_params` and the replica hold them on every training rank.
  virtual void distribute_start(std::span<float> host_params) = 0;

  // A run of steps (an epoch, or its part up to a checkpoint or a stop) begins.
  virtual void begin_steps() = 0;
  // Forward, backward and the update on one batch; its loss and accuracy go to the replica's running stats.
  virtual void step(const BatchView& batch) = 0;
  // The run of steps ends: afterwards every training rank's replica holds the same parameters, and rank 0's
  // optimizer() the whole optimizer state, as a checkpoint written now must hold them.
  virtual void end_steps() = 0;
  // No more steps follow. Collective; after it `host_params` holds the final parameters on every rank (of
  // the job, servers included).
  virtual void finish(std::span<float> host_params) = 0;

  // For logs and metrics: "mpi", "nccl" or "ps".
  virtual std::string backend() const = 0;
};

}  // namespace ddp::engine

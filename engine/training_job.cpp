#include "engine/training_job.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <utility>

#include "comm/backend_choice.h"
#include "comm/host_group.h"
#include "engine/all_reduce_updater.h"
#include "engine/preemption.h"
#include "engine/ps_updater.h"
#include "engine/run_length.h"
#include "engine/trainer.h"
#include "engine/updater.h"
#include "models/cuda_replica.h"
#include "models/replica.h"

namespace ddp::engine {

optim::OptimizerSettings optimizer_settings(const Config& c, int64_t total_updates) {
  optim::OptimizerSettings s{c.train.optimizer,
                             c.train.learning_rate,
                             c.train.beta1,
                             c.train.beta2,
                             c.train.epsilon,
                             c.train.momentum,
                             c.train.embedding_update == "lazy"};
  s.schedule = c.train.lr_schedule;
  s.warmup_steps = c.train.warmup_steps;
  s.decay_steps = c.train.lr_decay_steps;
  s.decay_rate = c.train.lr_decay_rate;
  s.total_steps = total_updates;
  s.weight_decay = c.train.weight_decay;
  s.clip_norm = c.train.clip_norm;
  return s;
}

namespace {

// The parameter server's options from the config: the layout the backend choice made, the mode, the
// deadline and, with comm.sparse_embedding, the embedding's rows for a row-sparse push.
comm::PsOptions ps_options(const Config& config, const comm::BackendChoice& backend,
                           const models::ParamLayout& layout, int maxlen) {
  comm::PsOptions options;
  options.servers = backend.colocated ? 0 : backend.ps_servers;
  options.async = config.comm.ps_mode == "async";
  options.max_staleness = config.comm.max_staleness;
  options.timeout_s = config.comm.timeout_s;
  options.clip_norm = config.train.clip_norm;
  options.wire = comm::wire_format(config.comm.compression);
  options.hierarchy = config.comm.hierarchy == "auto";
  options.stop_signal = stop_signal_number_received;
  if (config.comm.sparse_embedding) exchange_embedding_rows(options, layout, config.train.batch_size, maxlen);
  return options;
}

}  // namespace

TrainResult train(const Config& config, const Topology& topology, const io::DatasetInfo& data,
                  comm::HostGroup& world, ProgressWatchdog& watchdog, const EpochWritten& epoch_written) {
  // The all-reduce ranks' collectives beside the gradients (agreements, metrics, broadcasts).
  comm::HostGroup boot = world.duplicate();
  const models::ModelShape shape = model_shape(config, data.vocab_size, data.num_classes);
  const models::ModelOptions options = model_options(config);
  std::unique_ptr<models::Replica> replica;
  watchdog.enter("creating the model replica on " + topology.device);
  comm::agree_on_errors(boot, [&] {
    require_model_fits(config, shape, topology.local_size);
    replica =
        topology.gpu >= 0
            ? models::make_cuda_replica(shape, topology.gpu,
                                        models::parse_rnn_algorithm(config.model.cudnn_rnn_algo), options)
            : models::make_cpu_replica(
                  shape,
                  models::parse_cpu_kernels(config.model.cpu_kernels, shape, options,
                                            compute_threads_for(topology, config.train.threads)),
                  options);
  });
  comm::BackendChoice backend;
  // A GPU job's NCCL set-up waits on every node's network: where it hangs, the likeliest cause is an
  // interface the other nodes cannot reach, which these variables name.
  watchdog.enter("setting up the communication backend (comm.backend = " + config.comm.backend + ")" +
                 (topology.gpu >= 0
                      ? "; if NCCL's set-up is what waits: NCCL_SOCKET_IFNAME (the interface the "
                        "nodes share), NCCL_IB_HCA and NCCL_DEBUG=WARN tell it where and why"
                      : ""));
  comm::agree_on_errors(boot, [&] {
    comm::BackendRequest request;
    request.backend = config.comm.backend;
    request.compression = config.comm.compression;
    request.hierarchy = config.comm.hierarchy;
    request.on_gpu = replica->device() == models::DeviceKind::kCuda;
    if (request.on_gpu && !topology.gpu_bus_id.empty())
      request.gpu_board = topology.host + " PCI " + topology.gpu_bus_id;
    request.compute_stream = replica->stream();
    request.ps_servers = config.comm.ps_servers;
    request.ps_async = config.comm.ps_mode == "async";
    request.lazy_update = config.train.embedding_update == "lazy";
    request.delayed_exchange = config.comm.overlap == "delayed";
    request.skips_nonfinite = models::scales_loss(models::parse_precision(config.model.precision));
    backend = comm::choose_backend(request, boot);
  });

  // Ends the job at once on an error NCCL has seen; cleared before the communicator goes.
  struct HealthCheckScope {
    ProgressWatchdog& watchdog;
    ~HealthCheckScope() { watchdog.set_health_check({}); }
  } health_scope{watchdog};
  if (backend.reducer) {
    watchdog.set_health_check([&reducer = *backend.reducer] { return reducer.asynchronous_error(); });
  }

  if (!backend.parameter_server) {
    StopAgreement stop_signal(boot);  // collective: made outside agree_on_errors, which a throw may skip
    std::unique_ptr<TrainingRun> run;
    // After `run`, so that leaving by an exception aborts NCCL before the replica (in `run`) waits for its
    // stream, which may wait on a reduction that a failed peer will never complete.
    const comm::AbortOnUnwind abort_on_unwind(backend.reducer.get());
    comm::agree_on_errors(boot, [&] {
      const int64_t steps = planned_steps(config, data, boot.size());
      std::unique_ptr<Updater> updater = make_all_reduce_updater(
          *replica, topology.gpu, boot, *backend.reducer, optimizer_settings(config, steps),
          config.comm.sparse_embedding && backend.all_on_cpu, config.comm.overlap == "delayed",
          /*gpu_job=*/!backend.all_on_cpu,
          /*skip_nonfinite=*/!backend.all_on_cpu &&
              models::scales_loss(models::parse_precision(config.model.precision)),
          /*cuda_graphs=*/config.train.cuda_graph == "auto");
      run = std::make_unique<TrainingRun>(
          config, TrainingRanks{boot, boot.size(), topology, watchdog, stop_signal}, data, std::move(replica),
          std::move(updater), backend.reason, epoch_written);
    });
    return run->run();
  }

  // The parameter server (ps_updater.h): every rank trains and serves a shard (colocated), or the first ranks
  // train and the last comm.ps_servers ranks serve (dedicated).
  comm::ParameterServerRank ps;
  comm::agree_on_errors(boot, [&] {
    const comm::PsOptions ps_settings = ps_options(config, backend, replica->layout(), data.maxlen);
    const int workers = comm::PsRoles::of(boot.size(), ps_settings.servers).workers();
    // A shard's updates: one per step in sync mode, one per worker's push in async mode.
    const int64_t updates = planned_steps(config, data, workers) * (ps_settings.async ? workers : 1);
    ps = comm::join_parameter_server(
        world, ps_settings, replica->layout().total_size(),
        shard_optimizers(optimizer_settings(config, updates)),
        fmt::format("rank {}/{} on {} (local rank {}/{})", boot.rank(), boot.size(), topology.host,
                    topology.local_rank, topology.local_size));
  });
  if (ps.server) {
    replica.reset();   // a dedicated server holds its shard only
    watchdog.pause();  // its waits have deadlines of their own
    TrainResult result;
    result.params = ps.server->serve();
    return result;
  }
  // `ps` owns the service and outlives `run`: a throw from TrainingRun's constructor on one rank destroys the
  // updater, and the training ranks still agree on it over the service's communicator.
  comm::ParameterService& service = *ps.service;
  // Async workers run up to comm.max_staleness steps apart: the stop question must not hold them closer.
  StopAgreement stop_signal(service.trainers(), config.comm.ps_mode == "async"
                                                    ? std::min(config.comm.max_staleness, INT_MAX - 1) + 1
                                                    : 1);
  std::unique_ptr<TrainingRun> run;
  comm::agree_on_errors(service.trainers(), [&] {
    const std::string mode = service.describe();
    std::unique_ptr<Updater> updater =
        make_ps_updater(*replica, service, optimizer_settings(config), backend.colocated);
    run = std::make_unique<TrainingRun>(
        config, TrainingRanks{service.trainers(), boot.size(), topology, watchdog, stop_signal}, data,
        std::move(replica), std::move(updater), backend.reason + (mode.empty() ? "" : "; " + mode),
        epoch_written);
  });
  return run->run();
}

}  // namespace ddp::engine

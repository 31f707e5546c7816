#include "engine/training_job.h"

#include <memory>
#include <optional>
#include <utility>

#include "comm/communicator.h"
#include "engine/all_reduce_updater.h"
#include "engine/colocated_updater.h"
#include "engine/preemption.h"
#include "engine/ps_training.h"
#include "engine/updater.h"
#include "models/cuda_replica.h"
#include "models/replica.h"

namespace ddp::engine {

OptimizerSettings optimizer_settings(const Config& c) {
  return {c.train.optimizer,
          c.train.learning_rate,
          c.train.beta1,
          c.train.beta2,
          c.train.epsilon,
          c.train.momentum,
          c.train.embedding_update == "lazy"};
}

TrainResult train(const Config& config, const Topology& topology, const io::DatasetInfo& data, MPI_Comm world,
                  ProgressWatchdog& watchdog, const EpochWritten& epoch_written) {
  std::unique_ptr<comm::Communicator> boot = comm::make_mpi_communicator(world);
  const models::ModelShape shape{data.vocab_size, config.model.embedding_dim, config.model.hidden,
                                 config.model.layers};
  std::unique_ptr<models::Replica> replica;
  watchdog.enter("creating the model replica on " + topology.device);
  comm::agree_on_errors(*boot, [&] {
    replica = topology.gpu >= 0
                  ? models::make_cuda_replica(shape, topology.gpu,
                                              models::parse_rnn_algorithm(config.model.cudnn_rnn_algo))
                  : models::make_cpu_replica(shape);
  });
  comm::BackendChoice backend;
  watchdog.enter("setting up the communication backend (comm.backend = " + config.comm.backend + ")");
  comm::agree_on_errors(*boot, [&] {
    comm::BackendRequest request;
    request.backend = config.comm.backend;
    request.compression = config.comm.compression;
    request.on_gpu = replica->device() == models::DeviceKind::kCuda;
    request.compute_stream = replica->stream();
    request.ps_servers = config.comm.ps_servers;
    request.ps_async = config.comm.ps_mode == "async";
    request.lazy_update = config.train.embedding_update == "lazy";
    backend = comm::choose_backend(request, world);
  });

  // Ends the job at once on an error NCCL has seen; cleared before the communicator goes.
  struct HealthCheckScope {
    ProgressWatchdog& watchdog;
    ~HealthCheckScope() { watchdog.set_health_check({}); }
  } health_scope{watchdog};
  if (backend.communicator) {
    watchdog.set_health_check([&comm = *backend.communicator] { return comm.asynchronous_error(); });
  }

  if (!backend.parameter_server) {
    StopAgreement stop_signal(world);  // collective: made outside agree_on_errors, which a throw may skip
    std::unique_ptr<TrainingRun> run;
    // After `run`, so that leaving by an exception aborts NCCL before the replica (in `run`) waits for its
    // stream, which may wait on a reduction that a failed peer will never complete.
    const comm::AbortOnUnwind abort_on_unwind(backend.communicator.get());
    comm::agree_on_errors(*boot, [&] {
      comm::Communicator& comm = *backend.communicator;
      std::unique_ptr<Updater> updater =
          backend.colocated
              ? make_colocated_updater(*replica, world, optimizer_settings(config))
              : make_all_reduce_updater(*replica, topology.gpu, comm, optimizer_settings(config),
                                        config.comm.sparse_embedding && backend.all_on_cpu);
      run = std::make_unique<TrainingRun>(config, topology, *boot, comm, stop_signal, backend.reason,
                                          std::move(replica), std::move(updater), data, watchdog,
                                          /*exchange_has_deadlines=*/false, epoch_written);
    });
    return run->run();
  }

  // The parameter server: the last ranks serve (ps_training.h), the others train.
  std::optional<PsJob> ps_job;
  comm::agree_on_errors(*boot, [&] { ps_job.emplace(world, config, backend.ps_servers, replica->layout()); });
  PsJob& job = *ps_job;
  std::optional<StopAgreement> stop_signal;  // among the workers
  if (!job.serves()) stop_signal.emplace(job.workers_comm());
  std::unique_ptr<TrainingRun> run;
  std::unique_ptr<PsServerRun> server;
  comm::agree_on_errors(*boot, [&] {
    if (job.serves()) {
      replica.reset();  // a server holds its shard only
      server = std::make_unique<PsServerRun>(job, *boot, config, topology, watchdog);
      return;
    }
    std::unique_ptr<Updater> updater = make_ps_worker_updater(job, *replica, optimizer_settings(config));
    run = std::make_unique<TrainingRun>(config, topology, *boot, job.workers(), *stop_signal,
                                        backend.reason + "; " + job.describe_mode(), std::move(replica),
                                        std::move(updater), data, watchdog, /*exchange_has_deadlines=*/true,
                                        epoch_written);
  });
  return server ? server->run() : run->run();
}

}  // namespace ddp::engine

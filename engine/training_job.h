// A training job on this rank, from the replica to the result: builds the replica on the rank's device,
// picks the backend the job's devices call for (comm::choose_backend), and runs the epoch loop
// (trainer.h) with the all-reduce updater on every rank, or the parameter server's (ps_updater.h over
// comm/ps_service.h): colocated, every rank trains and serves a shard; dedicated, the first ranks
// train and the last comm.ps_servers ranks only serve.
#pragma once

#include "comm/host_group.h"
#include "engine/config.h"
#include "engine/topology.h"
#include "engine/trainer.h"
#include "engine/watchdog.h"
#include "io/dataset.h"

namespace ddp::engine {

// Collective over `world`: builds this rank's replica on its device (topology), picks the backend the job's
// devices call for (comm::choose_backend) and trains: with all-reduce, every rank with the optimizer of its
// device; with the parameter server, the first ranks as workers and the last comm.ps_servers ranks as
// servers. Throws UserError for problems found before the first step (every rank throws the same one);
// problems met later end the job through fatal(). It tells `watchdog` each phase and beats it at every step
// and evaluation batch, pausing it where the parameter server's protocol waits with deadlines of its own.
TrainResult train(const Config& config, const Topology& topology, const io::DatasetInfo& data,
                  comm::HostGroup& world, ProgressWatchdog& watchdog, const EpochWritten& epoch_written = {});

}  // namespace ddp::engine

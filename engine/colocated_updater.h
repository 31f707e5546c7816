// The parameter server with no idle ranks (comm.ps_servers = 0, the colocated layout), sync mode: every rank
// trains and serves one shard of the flat parameters with that shard's optimizer state
// (comm/sharded_exchange.h). A step: forward and backward on the replica, the gradients reduce-scattered
// (each rank gets its shard's average), the shard's optimizer step on its owner, the updated shards
// all-gathered into every replica. Each rank steps the optimizer over 1/N of the state. Checkpoints hold the
// whole state, gathered on rank 0 at the end of each run of steps (rank 0 keeps it), in the canonical layout:
// they resume under any backend.
#pragma once

#include <mpi.h>

#include <memory>

#include "engine/optimizer.h"
#include "engine/updater.h"
#include "models/replica.h"

namespace ddp::engine {

// Collective over `trainers` (every rank of the job). `replica` must run on the CPU (its buffers are host
// memory); throws UserError otherwise.
std::unique_ptr<Updater> make_colocated_updater(models::Replica& replica, MPI_Comm trainers,
                                                const OptimizerSettings& settings);

}  // namespace ddp::engine

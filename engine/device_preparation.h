// A training rank's device made ready before the replica's first batch: every batch shape of the run tried
// on every training rank and settled on the same kernels everywhere (one GPU's cuDNN may turn a persistent
// algorithm down for a shape another's takes), and on a GPU the self-check (self_check.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/config.h"
#include "engine/topology.h"
#include "models/replica.h"

namespace ddp::engine {

// The (batch, seq) shapes a rank meets: every training batch (a short last one is dropped), and the last,
// shorter batches of its validation and test shards (`*_rows`: the shard's sizes; -1 where there is none).
// Full evaluation batches have the training batch's shape. Shapes of batch 0 are left out; each once.
std::vector<std::pair<int, int>> batch_shapes(int batch_size, int seq, int64_t validation_rows,
                                              int64_t test_rows);

// Collective over `trainers`: the union of every training rank's batch_shapes, in one order on every rank
// (the training batch, then the short batches by size). The shards of a split differ by a sample, so one
// rank's short last batch may be another's nothing, and prepare_device settles the shapes position by
// position.
std::vector<std::pair<int, int>> every_ranks_batch_shapes(comm::HostGroup& trainers, int batch_size, int seq,
                                                          int64_t validation_rows, int64_t test_rows);

// Collective over `trainers`, the training ranks, of which this is one: tries and settles `shapes` (the same
// list on every rank: every_ranks_batch_shapes) on `replica`, then, on a GPU with comm.selfcheck, runs the
// self-check of the replica and, with NCCL (`reducer`: the all-reduce's, null for the parameter server), of
// the reducer's averages, and where the steps are replayed from CUDA graphs (`steps_from_graphs`:
// Updater::steps_from_graphs), a replayed step. Errors throw the first failing
// rank's line as a UserError on every rank. The self-check overwrites the replica's parameters: call this
// before the starting point is loaded. Returns the self-check's summary for the start log ("" where it did
// not run). `progress` is called as each piece of the work is done (a shape tried or settled, a part of the
// self-check), for the watchdog.
std::string prepare_device(models::Replica& replica, const std::vector<std::pair<int, int>>& shapes,
                           const Config& config, const Topology& topology, comm::HostGroup& trainers,
                           comm::GradientReducer* reducer, bool steps_from_graphs,
                           const std::function<void()>& progress = {});

}  // namespace ddp::engine

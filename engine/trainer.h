// The data-parallel training loop. One Trainer per rank; all ranks run the same steps in the same order:
//
//   batch <- BatchReader (this rank's shard, prefetched)      io/
//   forward + backward on the replica                         models/
//     each finished gradient segment -> start_average()       comm/
//   finish_average(); optimizer step on the flat buffer       engine/optimizer
//   after each epoch: sharded evaluation, summed over ranks; rank 0 prints, appends metrics.jsonl and writes
//   last.h5 / best.h5                                         engine/metrics, engine/checkpoint
//
// Rank 0's initial parameters (or the resumed checkpoint) are broadcast, so every replica starts identical
// and, averaging bit-identical gradients, stays identical.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "engine/config.h"
#include "engine/metrics.h"
#include "engine/topology.h"
#include "io/dataset.h"

namespace ddp::engine {

struct TrainResult {
  std::vector<EpochMetrics> history;  // the epochs this invocation trained
  std::vector<float> params;          // the final parameters (identical on every rank)
};

// Collective over `world`: builds this rank's replica on its device (topology), the optimizer of that device,
// and the communicator the job's devices call for (comm::choose_backend). Throws UserError for problems found
// before the first step (every rank throws the same one); problems met later end the job through fatal().
TrainResult train(const Config& config, const Topology& topology, const io::DatasetInfo& data,
                  MPI_Comm world);

}  // namespace ddp::engine

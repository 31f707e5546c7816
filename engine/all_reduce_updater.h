// The all-reduce backends' updater (updater.h): gradients averaged over every rank by the communicator,
// then every rank's own optimizer over the whole flat buffer (AllReduceStep).
#pragma once

#include <memory>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/optimizer/optimizer.h"
#include "engine/updater.h"
#include "models/replica.h"

namespace ddp::engine {

// `replica` runs on GPU `gpu` (or on the CPU: gpu -1), which picks the optimizer's memory; `reducer` averages
// its gradients over the ranks of `trainers`, which the starting point is broadcast over. With
// `sparse_exchange` only the embedding rows some rank touched travel (comm.sparse_embedding); `delayed`:
// comm.overlap = delayed (all_reduce_step.h), each run of steps ending with the last gradient applied;
// `gpu_job`: some rank of the job runs on a GPU (the reductions' order); `skip_nonfinite`: model.precision =
// fp16 (a step whose average is not finite is skipped, all_reduce_step.h); `cuda_graphs`: train.cuda_graph =
// auto (a GPU replica's steps replayed from CUDA graphs where they can be, step_graph.h).
std::unique_ptr<Updater> make_all_reduce_updater(models::Replica& replica, int gpu, comm::HostGroup& trainers,
                                                 comm::GradientReducer& reducer,
                                                 const optim::OptimizerSettings& settings,
                                                 bool sparse_exchange, bool delayed = false,
                                                 bool gpu_job = false, bool skip_nonfinite = false,
                                                 bool cuda_graphs = false);

}  // namespace ddp::engine

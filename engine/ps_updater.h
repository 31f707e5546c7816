// The parameter server's updater (comm.backend = ps): the step's gradients go to comm::ParameterService,
// which returns the updated parameters; the shards' optimizer state lives with the ranks that serve them
// (comm/ps_service.h has the layouts and the protocol). This file holds only what the training side
// adds: the replica's buffers (in place on a CPU, staged through host memory from a GPU), the embedding's
// touched rows for a row-sparse push, and engine's optimizers as the shards' optimizers.
#pragma once

#include <memory>
#include <string>

#include "comm/ps_service.h"
#include "engine/optimizer/optimizer.h"
#include "engine/updater.h"
#include "models/replica.h"

namespace ddp::engine {

// Each shard's optimizer: `settings`' host optimizer over the shard.
comm::ShardOptimizerFactory shard_optimizers(const optim::OptimizerSettings& settings);

// The embedding's rows as the row-sparse push sends them (`options.sparse_exchange_rows`), with a batch of
// `batch` sequences of `seq` tokens reading at most batch x seq of them a step.
void exchange_embedding_rows(comm::PsOptions& options, const models::ParamLayout& layout, int batch, int seq);

// The updater of a training rank. `sparse_push`: a CPU replica pushes the embedding's gradient row-sparse
// (the service's options name the rows). Throws UserError where the layout cannot serve the replica: the
// colocated layout (`colocated`) serves CPU replicas with dense updates only.
// `service` must outlive the updater: its owner keeps it while the training ranks agree on an error that the
// updater's user (the trainer's constructor) threw on one of them.
std::unique_ptr<Updater> make_ps_updater(models::Replica& replica, comm::ParameterService& service,
                                         const optim::OptimizerSettings& settings, bool colocated);

}  // namespace ddp::engine

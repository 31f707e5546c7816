#include "comm/sharded_exchange.h"

#include <climits>
#include <string>

#include "comm/mpi_check.h"
#include "engine/base/errors.h"

namespace ddp::comm {

ShardedExchange::ShardedExchange(MPI_Comm comm, std::size_t total) {
  DDP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  // MPI counts are ints: the whole vector must fit one.
  if (total > static_cast<std::size_t>(INT_MAX)) {
    throw UserError("the parameter server's colocated layout: " + std::to_string(total) +
                    " parameters are more than one MPI message holds");
  }
  const auto ranks = static_cast<std::size_t>(size_);
  const std::size_t each = total / ranks;
  const std::size_t extra = total % ranks;
  std::size_t offset = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t count = each + (r < extra ? 1 : 0);
    counts_.push_back(static_cast<int>(count));
    offsets_.push_back(static_cast<int>(offset));
    offset += count;
  }
}

ShardedExchange::~ShardedExchange() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::size_t ShardedExchange::begin(int rank) const {
  return static_cast<std::size_t>(offsets_[static_cast<std::size_t>(rank)]);
}

std::size_t ShardedExchange::end(int rank) const {
  return begin(rank) + static_cast<std::size_t>(counts_[static_cast<std::size_t>(rank)]);
}

void ShardedExchange::reduce_scatter_average(std::span<const float> full, std::span<float> shard) {
  DDP_CHECK(shard.size() == shard_size());
  DDP_CHECK_MPI(MPI_Reduce_scatter(full.data(), shard.data(), counts_.data(), MPI_FLOAT, MPI_SUM, comm_));
  const float scale = 1.0f / static_cast<float>(size_);
  for (float& x : shard) x *= scale;
}

void ShardedExchange::all_gather(std::span<float> full) {
  DDP_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, full.data(), counts_.data(), offsets_.data(),
                               MPI_FLOAT, comm_));
}

void ShardedExchange::gather_to_root(std::span<const float> shard, std::span<float> full) {
  DDP_CHECK(shard.size() == shard_size());
  DDP_CHECK_MPI(MPI_Gatherv(shard.data(), counts_[static_cast<std::size_t>(rank_)], MPI_FLOAT, full.data(),
                            counts_.data(), offsets_.data(), MPI_FLOAT, 0, comm_));
}

void ShardedExchange::scatter_from_root(std::span<const float> full, std::span<float> shard) {
  DDP_CHECK(shard.size() == shard_size());
  DDP_CHECK_MPI(MPI_Scatterv(full.data(), counts_.data(), offsets_.data(), MPI_FLOAT, shard.data(),
                             counts_[static_cast<std::size_t>(rank_)], MPI_FLOAT, 0, comm_));
}

void ShardedExchange::broadcast(std::span<float> data) {
  DDP_CHECK_MPI(MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_FLOAT, 0, comm_));
}

int64_t ShardedExchange::broadcast(int64_t value) {
  DDP_CHECK_MPI(MPI_Bcast(&value, 1, MPI_INT64_T, 0, comm_));
  return value;
}

}  // namespace ddp::comm

#include "comm/sharded_exchange.h"

#include <algorithm>
#include <string>

#include "comm/mpi_check.h"
#include "comm/node_layout.h"
#include "engine/base/errors.h"

namespace ddp::comm {

ShardedExchange::ShardedExchange(MPI_Comm comm, std::size_t total, WireFormat wire,
                                 const ExchangeNodes& nodes)
    : total_(total) {
  ShardLevel::check_size(total, wire);  // before any communicator is made
  DDP_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  NodeLayout layout;
  if (nodes.hierarchy && size_ > 1) layout = find_nodes(comm_, nodes.test_node);
  const bool several_per_node = layout.nodes > 1 && layout.largest_node > 1;
  if (several_per_node && layout.smallest_node == layout.largest_node) {
    node_comm_ = layout.node;
    hierarchy_line_ = "hierarchical across " + std::to_string(layout.nodes) + " nodes of " +
                      std::to_string(layout.node_size) +
                      " ranks (each slice summed inside its node, exchanged across the nodes once)";
  } else {
    if (layout.node != MPI_COMM_NULL) DDP_CHECK_MPI(MPI_Comm_free(&layout.node));
    if (several_per_node) {
      hierarchy_line_ = "not hierarchical: its nodes hold " + std::to_string(layout.smallest_node) + " to " +
                        std::to_string(layout.largest_node) +
                        " ranks, and the exchange through the nodes needs the same number on each";
    }
  }

  if (node_comm_ == MPI_COMM_NULL) {
    DDP_CHECK_MPI(MPI_Comm_dup(comm_, &top_comm_));
    top_ = std::make_unique<ShardLevel>(top_comm_, 0, total, wire);
    for (int r = 0; r < size_; ++r) {
      counts_.push_back(static_cast<int>(top_->end(r) - top_->begin(r)));
      offsets_.push_back(static_cast<int>(top_->begin(r)));
    }
    return;
  }
  // Inside the node in float (shared memory); across the nodes, the ranks holding one slice, on the wire.
  node_ = std::make_unique<ShardLevel>(node_comm_, 0, total, WireFormat::kFloat);
  DDP_CHECK_MPI(MPI_Comm_split(comm_, node_->rank(), rank_, &top_comm_));
  top_ = std::make_unique<ShardLevel>(top_comm_, node_->begin(), node_->end(), wire);
  const int mine[2] = {static_cast<int>(top_->begin()), static_cast<int>(top_->shard_size())};
  std::vector<int> every(2 * static_cast<std::size_t>(size_));
  DDP_CHECK_MPI(MPI_Allgather(mine, 2, MPI_INT, every.data(), 2, MPI_INT, comm_));
  for (std::size_t r = 0; r < static_cast<std::size_t>(size_); ++r) {
    offsets_.push_back(every[2 * r]);
    counts_.push_back(every[2 * r + 1]);
  }
  node_sums_.reset(new float[total]);  // left uninitialized: only this rank's slice is written and read
}

ShardedExchange::~ShardedExchange() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&top_comm_, &node_comm_, &comm_}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
}

std::size_t ShardedExchange::begin(int rank) const {
  return static_cast<std::size_t>(offsets_[static_cast<std::size_t>(rank)]);
}

std::size_t ShardedExchange::end(int rank) const {
  return begin(rank) + static_cast<std::size_t>(counts_[static_cast<std::size_t>(rank)]);
}

void ShardedExchange::reduce_scatter_average(std::span<const float> full, std::span<float> shard) {
  const float scale = 1.0f / static_cast<float>(size_);
  if (!node_) {
    top_->reduce_scatter(full, shard, scale);
    return;
  }
  node_->reduce_scatter(full, std::span<float>(node_sums_.get() + slice_begin(), node_->shard_size()), 1.0f);
  top_->reduce_scatter(std::span<const float>(node_sums_.get(), total_), shard, scale);
}

std::span<const GradientPiece> ShardedExchange::reduce_scatter_average_rows(
    std::span<const float> full, const RowRegion& region, std::span<const int32_t> touched_rows) {
  const float scale = 1.0f / static_cast<float>(size_);
  if (!node_) return top_->reduce_scatter_rows(full, region, touched_rows, scale);
  // The node's sum of this slice, where it may be non-zero: the rows some node rank touched, and the rest.
  for (const GradientPiece& piece : node_->reduce_scatter_rows(full, region, touched_rows, 1.0f)) {
    std::copy(piece.values.begin(), piece.values.end(), node_sums_.get() + slice_begin() + piece.offset);
  }
  return top_->reduce_scatter_rows(std::span<const float>(node_sums_.get(), total_), region,
                                   node_->rows_in_sum(), scale);
}

void ShardedExchange::all_gather(std::span<float> full) {
  top_->all_gather(full);
  if (node_) node_->all_gather(full);
}

void ShardedExchange::all_gather_outside(std::span<float> full, const RowRegion& region) {
  top_->all_gather_outside(full, region);
  if (node_) node_->all_gather_outside(full, region);
}

void ShardedExchange::all_gather_update(std::span<float> full, const RowRegion& region,
                                        std::span<const float> before) {
  // Across the nodes, every copy of this slice becomes its owners' (on the wire); inside the node the slices
  // then travel as they are.
  top_->all_gather_update(full, region, before);
  if (!node_) return;
  if (region.empty()) {
    node_->all_gather(full);
  } else {
    node_->all_gather_outside(full, region);
  }
}

void ShardedExchange::fetch_rows(std::span<float> full, const RowRegion& region,
                                 std::span<const int32_t> rows) {
  if (!node_) {
    top_->fetch_rows(full, region, rows);
    return;
  }
  // Each row from the node rank whose slice holds it, which first fetches the node's rows of its slice.
  node_->fetch_rows(full, region, rows,
                    [&](std::span<const int32_t> slice_rows) { top_->fetch_rows(full, region, slice_rows); });
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

// The colocated parameter server's exchange (comm.ps_servers = 0): every rank trains and also owns
// one contiguous shard of the flat parameter vector, with that shard's optimizer state (the ZeRO stage-1
// idea on the parameter server's protocol). In sync mode a step is a reduce-scatter of the gradients (each
// rank receives the average of its shard), the owner's optimizer step, and an all-gather of the updated
// shards. MPI's collectives are that exchange done well: Open MPI's reduce-scatter and all-gather move each
// byte once per link, where the dedicated server's link carries every worker's gradient.
//
// Flat, that is one level of exchange (shard_level.h) over every rank. With several ranks on each of several
// nodes (comm.hierarchy = auto) each rank's gradient would cross the links once per rank of its node: the
// exchange goes in two levels instead, so that each node sends the links one copy. Every node has the same k
// ranks; the vector is cut into k slices, one per node rank j, and each slice into one piece per node. The
// rank j of node m owns piece m of slice j. A reduce-scatter sums slice j inside the node to rank j (float,
// over shared memory), then the ranks j of the nodes reduce-scatter their slice's node sums across the links
// (on the comm.compression wire) and scale by 1 / size of the job; an all-gather goes the other way (across
// the links, then inside the node); fetched rows travel once per node (a rank asks the node rank whose slice
// holds them, which fetches the node's union from across the links). No rank leads: the links carry the
// slices of every node rank at once. Nodes of unequal rank counts take the flat exchange.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/row_sparse.h"
#include "comm/shard_level.h"
#include "comm/wire_payload.h"
#include "engine/base/optimizer_state.h"

namespace ddp::comm {

// Whether the exchange may go through the nodes.
struct ExchangeNodes {
  bool hierarchy = false;  // comm.hierarchy = auto
  int test_node = -1;      // find_nodes' (node_layout.h): pseudo-nodes for tests
};

class ShardedExchange {
 public:
  // Collective over `comm` (duplicated, so that its traffic never mixes with other users of `comm`): shards
  // of `total` floats, rank r owning [begin(r), end(r)). Flat: total / size each in rank order, the first
  // total % size ranks one more. Through the nodes (`nodes`, where it applies): the two levels above. `wire`
  // in 16 bits (comm.compression = bf16 | fp16, wire_payload.h): the reduce-scatters send the gradients
  // across the links in 16 bits (each owner sums them in float, in rank order) and all_gather_update sends
  // the owners' updates so (below); the other collectives send float.
  ShardedExchange(MPI_Comm comm, std::size_t total, WireFormat wire = WireFormat::kFloat,
                  const ExchangeNodes& nodes = {});
  ~ShardedExchange();
  ShardedExchange(const ShardedExchange&) = delete;
  ShardedExchange& operator=(const ShardedExchange&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t total() const { return total_; }
  // For the start-up line: "" (flat), or how the exchange goes through the nodes, or why it does not where
  // the hierarchy was asked for.
  const std::string& hierarchy_line() const { return hierarchy_line_; }
  std::size_t begin(int rank) const;
  std::size_t end(int rank) const;
  // This rank's shard.
  std::size_t begin() const { return begin(rank_); }
  std::size_t end() const { return end(rank_); }
  std::size_t shard_size() const { return end() - begin(); }

  // Collective: `shard` (shard_size() floats) receives the average over the ranks of `full`'s floats in this
  // rank's shard (summed, then one multiplication by 1 / size, as the MPI backend averages).
  void reduce_scatter_average(std::span<const float> full, std::span<float> shard);
  // Collective: every rank's shard of `full` (its own floats already in place) goes to every rank.
  void all_gather(std::span<float> full);
  // Collective: rank 0's `full` receives every rank's `shard` (shard_size() floats) in place; `full` is
  // ignored elsewhere.
  void gather_to_root(std::span<const float> shard, std::span<float> full);
  // Collective: each rank's `shard` receives its floats of rank 0's `full`.
  void scatter_from_root(std::span<const float> full, std::span<float> shard);
  // The row-sparse forms, for a region of rows (the embedding) whose gradient is zero outside the rows a step
  // touched and of which a step reads only its batch's rows. Together they move a few rows per step where
  // the dense forms move the whole region twice.
  //
  // Collective: the average over the ranks of this rank's shard of `full` (as reduce_scatter_average), each
  // rank sending each owner only the `touched_rows` (sorted, unique) that meet its shard, and the shard
  // outside `region` whole. Summed in rank order (through the nodes: each node's ranks in order, then the
  // node sums in node order), then one multiplication by 1 / size. Returned as the
  // pieces of the shard (offsets from its first float) outside which the average is zero: the rows some rank
  // touched and the floats outside the region, held compactly (one dense piece where a rank sent its shard
  // dense). The pieces are this object's, valid until the next call.
  std::span<const GradientPiece> reduce_scatter_average_rows(std::span<const float> full,
                                                             const RowRegion& region,
                                                             std::span<const int32_t> touched_rows);
  // Collective: every rank's shard of `full` outside `region` goes to every rank.
  void all_gather_outside(std::span<float> full, const RowRegion& region);
  // all_gather, and all_gather_outside where `region` is not empty, after each owner's update of its shard;
  // `before` is this rank's shard before the update. On a 16-bit wire, the owner's update (now minus before)
  // rounded to 16 bits replaces it in its shard and goes to every rank, which adds it to its copy: every
  // copy keeps the same bits, as long as every rank's copy of every shard was the owner's before.
  void all_gather_update(std::span<float> full, const RowRegion& region, std::span<const float> before);
  // Collective: `rows` (sorted, unique; ids outside the region are skipped) of `full` receive their owners'
  // floats.
  void fetch_rows(std::span<float> full, const RowRegion& region, std::span<const int32_t> rows);

  // Collective: rank 0's floats or value on every rank.
  void broadcast(std::span<float> data);
  int64_t broadcast(int64_t value);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;  // every rank: the gathers, scatters and broadcasts
  int rank_ = 0;
  int size_ = 1;
  std::size_t total_ = 0;
  std::vector<int> counts_;   // floats per rank
  std::vector<int> offsets_;  // first float of each rank's shard
  std::string hierarchy_line_;

  // Flat: `top` over every rank, `node` absent. Through the nodes: `node` inside this rank's node (the
  // slices), `top` across the nodes among the ranks that hold this rank's slice (its pieces).
  MPI_Comm node_comm_ = MPI_COMM_NULL, top_comm_ = MPI_COMM_NULL;
  std::unique_ptr<ShardLevel> node_, top_;
  std::unique_ptr<float[]> node_sums_;  // the node's sum of this rank's slice, at its absolute positions
  std::size_t slice_begin() const { return node_->begin(); }
};

}  // namespace ddp::comm

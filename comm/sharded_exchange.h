// The colocated parameter server's exchange (comm.ps_servers = 0): every rank trains and also owns
// one contiguous shard of the flat parameter vector, with that shard's optimizer state (the ZeRO stage-1
// idea on the parameter server's protocol). In sync mode a step is a reduce-scatter of the gradients (each
// rank receives the average of its shard), the owner's optimizer step, and an all-gather of the updated
// shards. MPI's collectives are that exchange done well: Open MPI's reduce-scatter and all-gather move each
// byte once per link, where the dedicated server's link carries every worker's gradient.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "comm/row_sparse.h"
#include "comm/wire_payload.h"
#include "engine/base/optimizer_state.h"

namespace ddp::comm {

class ShardedExchange {
 public:
  // Collective over `comm` (duplicated, so that its traffic never mixes with other users of `comm`): shards
  // of `total` floats, rank r owning [begin(r), end(r)): total / size each, the first total % size ranks one
  // more. `wire` in 16 bits (comm.compression = bf16 | fp16, wire_payload.h): the reduce-scatters send the
  // gradients in 16 bits (each owner sums them in float, in rank order) and all_gather_update sends the
  // owners' updates so (below); the other collectives send float.
  ShardedExchange(MPI_Comm comm, std::size_t total, WireFormat wire = WireFormat::kFloat);
  ~ShardedExchange();
  ShardedExchange(const ShardedExchange&) = delete;
  ShardedExchange& operator=(const ShardedExchange&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t begin(int rank) const;
  std::size_t end(int rank) const;
  // This rank's shard.
  std::size_t begin() const { return begin(rank_); }
  std::size_t end() const { return end(rank_); }
  std::size_t shard_size() const { return end() - begin(); }

  // Collective: `shard` (shard_size() floats) receives the average over the ranks of `full`'s floats in this
  // rank's shard (summed by MPI, then one multiplication by 1 / size, as the MPI backend averages).
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
  // outside `region` whole. Summed in rank order, then one multiplication by 1 / size. Returned as the
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
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // The pieces of rank r's shard outside `region` (all of it where the region is empty): each(from, to,
  // packed) for the flat range [from, to) at `packed` in receive_ (outside_counts' layout).
  void outside_pieces(int r, const RowRegion& region,
                      const std::function<void(std::size_t, std::size_t, std::size_t)>& each) const;
  // receive_counts_ and receive_offsets_: each shard's floats outside `region`, packed rank after rank.
  std::size_t outside_counts(const RowRegion& region);
  // The payloads of payloads_ (send_counts_ floats at each owner's offset) to their owners in 16 bits:
  // receive_ gets them widened back to floats (receive_counts_, receive_offsets_). `all_dense`: every payload
  // is its owner's whole shard (reduce_scatter_average), whose sizes every rank knows; otherwise each
  // payload's floats and 32-bit words travel first.
  void exchange_payloads_16_bit(bool all_dense);

  std::vector<int> counts_;   // floats per rank
  std::vector<int> offsets_;  // first float of each rank
  WireFormat wire_ = WireFormat::kFloat;
  std::vector<float> own_update_, updates_;   // all_gather_update's: this owner's update, every owner's
  std::vector<unsigned char> payload_bytes_;  // 16-bit payloads received
  std::vector<int> send_pairs_, receive_pairs_, send_bytes_, send_byte_offsets_, receive_bytes_,
      receive_byte_offsets_;

  // Scratch of the row-sparse forms, kept across steps.
  std::unique_ptr<float[]> payloads_;  // reduce_scatter_average_rows' messages, at each owner's offset
  std::size_t payload_capacity_ = 0;
  std::vector<float> send_, receive_;
  std::vector<int32_t> send_ids_, receive_ids_;
  std::vector<int> send_counts_, send_offsets_, receive_counts_, receive_offsets_;
  std::vector<GradientPiece> average_pieces_;   // reduce_scatter_average_rows' result, over:
  std::vector<float> row_sums_, outside_sums_;  // its compact sums
  std::vector<int32_t> rows_in_average_;        // the rows they hold, sorted
  std::vector<std::size_t> row_sum_at_;         // where each row's floats are in row_sums_
  std::vector<float> dense_average_, decoded_;  // or the dense sum, where a rank sent its shard dense
};

}  // namespace ddp::comm

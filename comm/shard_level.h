// One level of the colocated parameter server's exchange (sharded_exchange.h): the ranks of one communicator
// share a range of the flat parameter vector, each owning a consecutive piece of it in rank order, and move
// that range's floats among themselves. A flat exchange is one level over every rank and the whole vector;
// a hierarchical one is two, inside each node (the vector in one slice per node rank) and across the nodes
// (each slice in one piece per node, among the ranks that hold that slice).
//
// Every method is collective over the level's communicator. Spans named `full` are the whole flat vector,
// indexed by absolute position; a level reads and writes only its range of it.
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

// Called by fetch_rows on a level whose ranks hold their pieces only in part (a node's slices): the rows of
// this rank's piece that anyone of the level reads (sorted, unique), to be made current before it replies.
using RowRefresh = std::function<void(std::span<const int32_t> rows)>;

class ShardLevel {
 public:
  // Over `comm`, which the caller keeps until this goes: the range [first, last) in pieces of
  // (last - first) / size floats, the first (last - first) % size ranks one more. `wire` in 16 bits
  // (comm.compression = bf16 | fp16, wire_payload.h): the reduce-scatters send the gradients in 16 bits
  // (each owner sums them in float, in rank order) and all_gather_update sends the owners' updates so; the
  // other collectives send float.
  ShardLevel(MPI_Comm comm, std::size_t first, std::size_t last, WireFormat wire);
  // Throws UserError unless a vector of `total` floats fits MPI's int counts on `wire` (the constructor
  // checks it too; callers that make communicators first check it before).
  static void check_size(std::size_t total, WireFormat wire);
  ShardLevel(const ShardLevel&) = delete;
  ShardLevel& operator=(const ShardLevel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t begin(int rank) const;
  std::size_t end(int rank) const;
  // This rank's piece.
  std::size_t begin() const { return begin(rank_); }
  std::size_t end() const { return end(rank_); }
  std::size_t shard_size() const { return end() - begin(); }

  // `shard` (shard_size() floats) receives the sum over the ranks of `full`'s floats in this rank's piece,
  // times `scale` (summed by MPI on a float wire, in rank order on a 16-bit one; then one multiplication).
  void reduce_scatter(std::span<const float> full, std::span<float> shard, float scale);
  // The row-sparse form, for a region of rows (the embedding) whose gradient is zero outside the rows a step
  // touched: as reduce_scatter, each rank sending each owner only the `touched_rows` (sorted, unique) that
  // meet its piece, and the piece outside `region` whole. Summed in rank order, then one multiplication by
  // `scale`. Returned as the pieces of the shard (offsets from its first float) outside which the sum is
  // zero: the rows some rank touched and the floats outside the region, held compactly (one dense piece
  // where a rank sent its piece dense). The pieces are this object's, valid until the next call.
  std::span<const GradientPiece> reduce_scatter_rows(std::span<const float> full, const RowRegion& region,
                                                     std::span<const int32_t> touched_rows, float scale);
  // After reduce_scatter_rows: the rows of the region its pieces hold (sorted; every row meeting this rank's
  // piece where the result is dense).
  std::span<const int32_t> rows_in_sum() const { return rows_in_average_; }
  // Every rank's piece of `full` (its own floats already in place) goes to every rank.
  void all_gather(std::span<float> full);
  // Every rank's piece of `full` outside `region` goes to every rank.
  void all_gather_outside(std::span<float> full, const RowRegion& region);
  // all_gather, and all_gather_outside where `region` is not empty, after each owner's update of its piece;
  // `before` is this rank's piece before the update. On a 16-bit wire, the owner's update (now minus before)
  // rounded to 16 bits replaces it in its piece and goes to every rank, which adds it to its copy: every
  // copy keeps the same bits, as long as every rank's copy of every piece was the owner's before.
  void all_gather_update(std::span<float> full, const RowRegion& region, std::span<const float> before);
  // `rows` (sorted, unique; ids outside the region are skipped) of `full` receive their owners' floats.
  // `refresh` (a level whose pieces are held only in part): called once on every rank, between hearing which
  // rows it is asked for and answering.
  void fetch_rows(std::span<float> full, const RowRegion& region, std::span<const int32_t> rows,
                  const RowRefresh& refresh = {});

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  // The pieces of rank r's piece outside `region` (all of it where the region is empty): each(from, to,
  // packed) for the flat range [from, to) at `packed` in receive_ (outside_counts' layout).
  void outside_pieces(int r, const RowRegion& region,
                      const std::function<void(std::size_t, std::size_t, std::size_t)>& each) const;
  // receive_counts_ and receive_offsets_: each piece's floats outside `region`, packed rank after rank.
  std::size_t outside_counts(const RowRegion& region);
  // The payloads of payloads_ (send_counts_ floats at each owner's offset) to their owners in 16 bits:
  // receive_ gets them widened back to floats (receive_counts_, receive_offsets_). `all_dense`: every payload
  // is its owner's whole piece (reduce_scatter), whose sizes every rank knows; otherwise each payload's
  // floats and 32-bit words travel first.
  void exchange_payloads_16_bit(bool all_dense);

  std::vector<int> counts_;   // floats per rank
  std::vector<int> offsets_;  // first float of each rank's piece, absolute
  WireFormat wire_ = WireFormat::kFloat;
  std::vector<float> own_update_, updates_;   // all_gather_update's: this owner's update, every owner's
  std::vector<unsigned char> payload_bytes_;  // 16-bit payloads received
  std::vector<int> send_pairs_, receive_pairs_, send_bytes_, send_byte_offsets_, receive_bytes_,
      receive_byte_offsets_;

  // Scratch of the row-sparse forms, kept across steps.
  std::unique_ptr<float[]> payloads_;  // the messages, at each owner's offset (absolute)
  std::size_t payload_capacity_ = 0;
  std::vector<float> send_, receive_;
  std::vector<int32_t> send_ids_, receive_ids_, refreshed_rows_;
  std::vector<int> send_counts_, send_offsets_, receive_counts_, receive_offsets_;
  std::vector<GradientPiece> average_pieces_;   // reduce_scatter_rows' result, over:
  std::vector<float> row_sums_, outside_sums_;  // its compact sums
  std::vector<int32_t> rows_in_average_;        // the rows they hold, sorted
  std::vector<std::size_t> row_sum_at_;         // where each row's floats are in row_sums_
  std::vector<float> dense_average_, decoded_;  // or the dense sum, where a rank sent its piece dense
};

}  // namespace ddp::comm

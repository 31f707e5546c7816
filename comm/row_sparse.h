// Row-sparse gradient messages of the parameter server (see ps_protocol.h,
// PsOptions::sparse_exchange_rows).
//
// A CPU replica's embedding gradient is zero outside the rows (tokens) its batch touched: a few thousand of
// tens of thousands. A worker then pushes a server only those rows of its shard, and everything of the shard
// outside the embedding as it is. Shards are cut by parameter count, so a shard may hold part of a row:
// a row is sent as its part inside the shard.
//
// Payload (floats after the PsHeader), for shard [begin, end) and its part [rb, re) of the region:
//   n                     the number of rows sent (an int32's bits)
//   row ids, n            sorted, unique, each meeting [rb, re) (int32 bits)
//   row values            for each row in order, its part inside [rb, re)
//   the rest              the shard outside [rb, re), in buffer order
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ddp::comm {

// A matrix of `rows` x `width` floats at `offset` of the flat vector.
struct RowRegion {
  std::size_t offset = 0;
  std::size_t rows = 0;
  std::size_t width = 0;

  std::size_t end() const { return offset + rows * width; }
  bool empty() const { return rows == 0 || width == 0; }
};

// The part of a region inside the shard [begin, end) of the flat vector, and the rows that meet it (a row
// may meet it with only some of its floats).
struct RegionPart {
  std::size_t begin = 0;  // [begin, end) of the flat vector; empty when begin == end
  std::size_t end = 0;
  std::size_t first_row = 0;  // rows [first_row, last_row) meet it
  std::size_t last_row = 0;

  bool empty() const { return begin == end; }
  // Row `row`'s floats inside the part: [first, second) of the flat vector.
  std::pair<std::size_t, std::size_t> row_span(std::size_t row, const RowRegion& region) const;
};
RegionPart region_part(std::size_t begin, std::size_t end, const RowRegion& region);

// Writes the sparse payload of the shard [begin, end) of `grads` (the full flat vector, zero in `region`
// outside `touched_rows`, which are sorted and unique) into `payload`, and returns its size in floats;
// returns 0 and writes nothing when the dense shard would be no larger (or the shard holds none of the
// region), so the caller sends it dense. `payload` must hold end - begin floats.
std::size_t encode_row_sparse(std::span<const float> grads, std::size_t begin, std::size_t end,
                              const RowRegion& region, std::span<const int32_t> touched_rows,
                              std::span<float> payload);

// Expands a sparse payload for the shard [begin, end) into `dense` (end - begin floats): the rows sent, zeros
// in the rest of the region, the rest as sent. Returns an empty string, or what is wrong with the payload
// (a count, row id or size that does not fit the shard): a corrupt message is the caller's fatal error.
std::string decode_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                              const RowRegion& region, std::span<float> dense);

// The rows a sparse payload for the shard [begin, end) sends, appended to `rows`. Returns an empty string,
// or what is wrong with the payload, as decode_row_sparse.
std::string rows_of_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                               const RowRegion& region, std::vector<int32_t>& rows);

// Adds a sparse payload for the shard [begin, end) into a compact sum: each row's floats inside the shard
// into `row_sum(row)` (where that row's floats are summed), the shard's floats outside the region into
// `outside` (packed: those before the region, then those after it). Returns an empty string, or what is
// wrong with the payload, as decode_row_sparse.
std::string add_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                           const RowRegion& region, const std::function<float*(int32_t row)>& row_sum,
                           std::span<float> outside);

}  // namespace ddp::comm

#include "comm/shard_level.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

#include "comm/mpi_check.h"
#include "comm/wire_payload.h"
#include "engine/base/errors.h"

namespace ddp::comm {

void ShardLevel::check_size(std::size_t total, WireFormat wire) {
  // MPI counts and displacements are ints: in floats, and on a 16-bit wire in bytes of a float-spaced buffer.
  const bool sixteen_bits = wire != WireFormat::kFloat;
  if (total > static_cast<std::size_t>(INT_MAX) / (sixteen_bits ? sizeof(float) : 1)) {
    throw UserError("the parameter server's colocated layout: " + std::to_string(total) +
                    " parameters are more than one MPI message holds" +
                    (sixteen_bits ? " (in bytes, as a 16-bit wire sends them)" : ""));
  }
}

ShardLevel::ShardLevel(MPI_Comm comm, std::size_t first, std::size_t last, WireFormat wire)
    : comm_(comm), wire_(wire) {
  check_size(last, wire);
  DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  const auto ranks = static_cast<std::size_t>(size_);
  const std::size_t each = (last - first) / ranks;
  const std::size_t extra = (last - first) % ranks;
  std::size_t offset = first;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t count = each + (r < extra ? 1 : 0);
    counts_.push_back(static_cast<int>(count));
    offsets_.push_back(static_cast<int>(offset));
    offset += count;
  }
}

std::size_t ShardLevel::begin(int rank) const {
  return static_cast<std::size_t>(offsets_[static_cast<std::size_t>(rank)]);
}

std::size_t ShardLevel::end(int rank) const {
  return begin(rank) + static_cast<std::size_t>(counts_[static_cast<std::size_t>(rank)]);
}

void ShardLevel::reduce_scatter(std::span<const float> full, std::span<float> shard, float scale) {
  DDP_CHECK(shard.size() == shard_size());
  if (wire_ == WireFormat::kFloat) {
    DDP_CHECK_MPI(MPI_Reduce_scatter(full.data() + offsets_.front(), shard.data(), counts_.data(), MPI_FLOAT,
                                     MPI_SUM, comm_));
    if (scale != 1.0f)
      for (float& x : shard) x *= scale;
    return;
  }
  // Every owner's part in 16 bits; the owner sums the ranks' parts in float, in rank order.
  const auto ranks = static_cast<std::size_t>(size_);
  if (payload_capacity_ < full.size()) {
    payloads_.reset(new float[full.size()]);
    payload_capacity_ = full.size();
  }
  const auto first = full.begin() + offsets_.front();
  std::copy(first, full.begin() + static_cast<std::ptrdiff_t>(end(size_ - 1)),
            payloads_.get() + offsets_.front());
  send_counts_.assign(counts_.begin(), counts_.end());
  exchange_payloads_16_bit(/*all_dense=*/true);
  std::fill(shard.begin(), shard.end(), 0.0f);
  for (std::size_t r = 0; r < ranks; ++r) {
    const float* part = receive_.data() + receive_offsets_[r];
    for (std::size_t i = 0; i < shard.size(); ++i) shard[i] += part[i];
  }
  if (scale != 1.0f)
    for (float& x : shard) x *= scale;
}

void ShardLevel::all_gather(std::span<float> full) {
  DDP_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, full.data(), counts_.data(), offsets_.data(),
                               MPI_FLOAT, comm_));
}

namespace {

// Offsets of consecutive blocks of `counts`, for MPI's v-collectives; the total must fit an int.
int exclusive_offsets(const std::vector<int>& counts, std::vector<int>& offsets) {
  offsets.resize(counts.size());
  int64_t at = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    offsets[i] = static_cast<int>(at);
    at += counts[i];
    DDP_CHECK(at <= INT_MAX);
  }
  return static_cast<int>(at);
}

}  // namespace

std::span<const GradientPiece> ShardLevel::reduce_scatter_rows(std::span<const float> full,
                                                               const RowRegion& region,
                                                               std::span<const int32_t> touched_rows,
                                                               float scale) {
  const auto ranks = static_cast<std::size_t>(size_);
  // Each owner's payload, at its shard's offset: the shard's touched rows and the rest (row_sparse.h), or
  // the shard dense where that is no larger. The buffer is left uninitialized: sparse payloads write (and
  // make resident) a few pages of it.
  if (payload_capacity_ < full.size()) {
    payloads_.reset(new float[full.size()]);
    payload_capacity_ = full.size();
  }
  send_counts_.assign(ranks, 0);
  for (std::size_t owner = 0; owner < ranks; ++owner) {
    const std::size_t begin = this->begin(static_cast<int>(owner)), end = this->end(static_cast<int>(owner));
    const std::span<float> payload(payloads_.get() + begin, end - begin);
    std::size_t count = encode_row_sparse(full, begin, end, region, touched_rows, payload);
    if (count == 0) {
      std::copy(full.begin() + static_cast<std::ptrdiff_t>(begin),
                full.begin() + static_cast<std::ptrdiff_t>(end), payload.begin());
      count = end - begin;
    }
    send_counts_[owner] = static_cast<int>(count);
  }
  if (wire_ != WireFormat::kFloat) {
    exchange_payloads_16_bit(/*all_dense=*/false);
  } else {
    receive_counts_.resize(ranks);
    DDP_CHECK_MPI(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, receive_counts_.data(), 1, MPI_INT, comm_));
    receive_.resize(static_cast<std::size_t>(exclusive_offsets(receive_counts_, receive_offsets_)));
    DDP_CHECK_MPI(MPI_Alltoallv(payloads_.get(), send_counts_.data(), offsets_.data(), MPI_FLOAT,
                                receive_.data(), receive_counts_.data(), receive_offsets_.data(), MPI_FLOAT,
                                comm_));
  }

  const std::size_t begin = this->begin(), end = this->end();
  const RegionPart part = region_part(begin, end, region);
  auto payload_from = [&](std::size_t rank) {
    return std::span<const float>(receive_).subspan(static_cast<std::size_t>(receive_offsets_[rank]),
                                                    static_cast<std::size_t>(receive_counts_[rank]));
  };
  auto fail = [](std::size_t rank, const std::string& error) {
    throw std::runtime_error("the colocated exchange from rank " + std::to_string(rank) + ": " + error);
  };
  average_pieces_.clear();
  rows_in_average_.clear();

  // A rank that sent its shard dense (most of the shard's rows touched): the average is dense too.
  bool any_dense = part.empty();
  for (std::size_t from = 0; from < ranks; ++from)
    any_dense = any_dense || payload_from(from).size() == end - begin;
  if (any_dense) {
    dense_average_.assign(end - begin, 0.0f);
    decoded_.resize(end - begin);
    for (std::size_t from = 0; from < ranks; ++from) {
      const std::span<const float> payload = payload_from(from);
      if (payload.size() == dense_average_.size()) {
        for (std::size_t i = 0; i < payload.size(); ++i) dense_average_[i] += payload[i];
      } else if (const std::string error = decode_row_sparse(payload, begin, end, region, decoded_);
                 !error.empty()) {
        fail(from, error);
      } else {
        for (std::size_t i = 0; i < decoded_.size(); ++i) dense_average_[i] += decoded_[i];
      }
    }
    for (float& x : dense_average_) x *= scale;
    average_pieces_.push_back({0, dense_average_});
    for (std::size_t row = part.first_row; row < part.last_row; ++row)
      rows_in_average_.push_back(static_cast<int32_t>(row));
    return average_pieces_;
  }

  // Else compact: the floats outside the region, and the rows any rank sent, each summed in rank order from
  // zero (the same bits as a dense sum: adding a zero changes nothing), then scaled.
  for (std::size_t from = 0; from < ranks; ++from) {
    if (const std::string error =
            rows_of_row_sparse(payload_from(from), begin, end, region, rows_in_average_);
        !error.empty())
      fail(from, error);
  }
  std::sort(rows_in_average_.begin(), rows_in_average_.end());
  rows_in_average_.erase(std::unique(rows_in_average_.begin(), rows_in_average_.end()),
                         rows_in_average_.end());
  row_sum_at_.resize(part.last_row - part.first_row);
  std::size_t row_floats = 0;
  for (const int32_t row : rows_in_average_) {
    row_sum_at_[static_cast<std::size_t>(row) - part.first_row] = row_floats;
    const auto [from, to] = part.row_span(static_cast<std::size_t>(row), region);
    row_floats += to - from;
  }
  row_sums_.assign(row_floats, 0.0f);
  outside_sums_.assign((end - begin) - (part.end - part.begin), 0.0f);
  const std::function<float*(int32_t)> row_sum = [&](int32_t row) {
    return row_sums_.data() + row_sum_at_[static_cast<std::size_t>(row) - part.first_row];
  };
  for (std::size_t from = 0; from < ranks; ++from) {
    if (const std::string error =
            add_row_sparse(payload_from(from), begin, end, region, row_sum, outside_sums_);
        !error.empty())
      fail(from, error);
  }
  for (float& x : row_sums_) x *= scale;
  for (float& x : outside_sums_) x *= scale;

  // The pieces, in the shard's order: before the region, the rows, after it.
  const std::size_t before = part.begin - begin;
  const std::span<const float> outside(outside_sums_);
  if (before > 0) average_pieces_.push_back({0, outside.first(before)});
  for (const int32_t row : rows_in_average_) {
    const auto [from, to] = part.row_span(static_cast<std::size_t>(row), region);
    average_pieces_.push_back(
        {from - begin, std::span<const float>(row_sums_).subspan(
                           row_sum_at_[static_cast<std::size_t>(row) - part.first_row], to - from)});
  }
  if (outside.size() > before) average_pieces_.push_back({part.end - begin, outside.subspan(before)});
  return average_pieces_;
}

void ShardLevel::exchange_payloads_16_bit(bool all_dense) {
  const auto ranks = static_cast<std::size_t>(size_);
  // Each owner's payload narrowed in place; its 32-bit words (row count and ids of a row-sparse one) stay.
  // The receivers learn each payload's floats and words first.
  send_pairs_.resize(2 * ranks);
  send_bytes_.resize(ranks);
  send_byte_offsets_.resize(ranks);
  for (std::size_t owner = 0; owner < ranks; ++owner) {
    const auto count = static_cast<std::size_t>(send_counts_[owner]);
    const std::span<float> payload(payloads_.get() + offsets_[owner], count);
    const bool dense = count == static_cast<std::size_t>(counts_[owner]);
    std::string unused;  // our own encoding: the words fit
    const std::size_t words = dense ? 0
                                    : row_sparse_words(reinterpret_cast<const unsigned char*>(payload.data()),
                                                       count * sizeof(float), unused);
    send_pairs_[2 * owner] = static_cast<int>(count);
    send_pairs_[2 * owner + 1] = static_cast<int>(words);
    send_bytes_[owner] = static_cast<int>(narrow_values(payload, words, wire_));
    DDP_CHECK(static_cast<std::size_t>(offsets_[owner]) <= INT_MAX / sizeof(float));
    send_byte_offsets_[owner] = offsets_[owner] * static_cast<int>(sizeof(float));
  }
  receive_pairs_.resize(2 * ranks);
  if (all_dense) {  // every rank sends this rank its whole shard, without 32-bit words: nothing to learn
    for (std::size_t from = 0; from < ranks; ++from) {
      receive_pairs_[2 * from] = counts_[static_cast<std::size_t>(rank_)];
      receive_pairs_[2 * from + 1] = 0;
    }
  } else {
    DDP_CHECK_MPI(MPI_Alltoall(send_pairs_.data(), 2, MPI_INT, receive_pairs_.data(), 2, MPI_INT, comm_));
  }
  receive_counts_.resize(ranks);
  receive_bytes_.resize(ranks);
  for (std::size_t from = 0; from < ranks; ++from) {
    receive_counts_[from] = receive_pairs_[2 * from];
    const auto floats = static_cast<std::size_t>(receive_pairs_[2 * from]);
    const auto words = static_cast<std::size_t>(receive_pairs_[2 * from + 1]);
    if (words > floats) {
      throw std::runtime_error("the colocated exchange from rank " + std::to_string(from) + ": " +
                               std::to_string(words) + " words in a payload of " + std::to_string(floats));
    }
    receive_bytes_[from] = static_cast<int>(wire_payload_bytes(floats, words, wire_));
  }
  payload_bytes_.resize(static_cast<std::size_t>(exclusive_offsets(receive_bytes_, receive_byte_offsets_)));
  DDP_CHECK_MPI(MPI_Alltoallv(payloads_.get(), send_bytes_.data(), send_byte_offsets_.data(), MPI_BYTE,
                              payload_bytes_.data(), receive_bytes_.data(), receive_byte_offsets_.data(),
                              MPI_BYTE, comm_));
  receive_.resize(static_cast<std::size_t>(exclusive_offsets(receive_counts_, receive_offsets_)));
  for (std::size_t from = 0; from < ranks; ++from) {
    const std::span<float> out(receive_.data() + receive_offsets_[from],
                               static_cast<std::size_t>(receive_counts_[from]));
    std::string error;
    const std::size_t floats = widen_values(
        payload_bytes_.data() + receive_byte_offsets_[from], static_cast<std::size_t>(receive_bytes_[from]),
        static_cast<std::size_t>(receive_pairs_[2 * from + 1]), out, wire_, error);
    if (!error.empty() || floats != out.size()) {
      throw std::runtime_error("the colocated exchange from rank " + std::to_string(from) + ": " +
                               (error.empty() ? "a short 16-bit payload" : error));
    }
  }
}

std::size_t ShardLevel::outside_counts(const RowRegion& region) {
  const auto ranks = static_cast<std::size_t>(size_);
  // Each shard's floats outside the region: before it and after it, packed.
  receive_counts_.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::size_t begin = this->begin(static_cast<int>(r)), end = this->end(static_cast<int>(r));
    const RegionPart part = region.empty() ? RegionPart{} : region_part(begin, end, region);
    receive_counts_[r] = static_cast<int>((end - begin) - (part.end - part.begin));
  }
  return static_cast<std::size_t>(exclusive_offsets(receive_counts_, receive_offsets_));
}

void ShardLevel::outside_pieces(
    int r, const RowRegion& region,
    const std::function<void(std::size_t, std::size_t, std::size_t)>& each) const {
  const std::size_t begin = this->begin(r), end = this->end(r);
  const RegionPart part = region.empty() ? RegionPart{} : region_part(begin, end, region);
  const std::size_t packed = static_cast<std::size_t>(receive_offsets_[static_cast<std::size_t>(r)]);
  if (part.empty()) {
    each(begin, end, packed);
  } else {
    each(begin, part.begin, packed);
    each(part.end, end, packed + (part.begin - begin));
  }
}

void ShardLevel::all_gather_outside(std::span<float> full, const RowRegion& region) {
  receive_.resize(outside_counts(region));
  outside_pieces(rank_, region, [&](std::size_t from, std::size_t to, std::size_t packed) {
    std::copy(full.begin() + static_cast<std::ptrdiff_t>(from),
              full.begin() + static_cast<std::ptrdiff_t>(to),
              receive_.begin() + static_cast<std::ptrdiff_t>(packed));
  });
  DDP_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, receive_.data(), receive_counts_.data(),
                               receive_offsets_.data(), MPI_FLOAT, comm_));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    outside_pieces(r, region, [&](std::size_t from, std::size_t to, std::size_t packed) {
      const auto at = receive_.begin() + static_cast<std::ptrdiff_t>(packed);
      std::copy(at, at + static_cast<std::ptrdiff_t>(to - from),
                full.begin() + static_cast<std::ptrdiff_t>(from));
    });
  }
}

void ShardLevel::all_gather_update(std::span<float> full, const RowRegion& region,
                                   std::span<const float> before) {
  if (wire_ == WireFormat::kFloat) {
    if (region.empty()) {
      all_gather(full);
    } else {
      all_gather_outside(full, region);
    }
    return;
  }
  DDP_CHECK(before.size() == shard_size());
  const std::size_t total = outside_counts(region);  // receive_counts_, receive_offsets_ in floats
  const auto ranks = static_cast<std::size_t>(size_);
  const auto me = static_cast<std::size_t>(rank_);
  // This owner's update (its pieces packed) on the wire.
  const std::size_t own = this->begin();
  const auto own_packed = static_cast<std::size_t>(receive_offsets_[me]);
  own_update_.resize(static_cast<std::size_t>(receive_counts_[me]));
  outside_pieces(rank_, region, [&](std::size_t from, std::size_t to, std::size_t packed) {
    for (std::size_t i = from; i < to; ++i)
      own_update_[packed - own_packed + (i - from)] = full[i] - before[i - own];
  });
  const std::size_t own_bytes = narrow_values(own_update_, 0, wire_);
  // Every owner's bytes, rank after rank.
  receive_bytes_.resize(ranks);
  for (std::size_t r = 0; r < ranks; ++r) {
    receive_bytes_[r] =
        static_cast<int>(wire_payload_bytes(static_cast<std::size_t>(receive_counts_[r]), 0, wire_));
  }
  payload_bytes_.resize(static_cast<std::size_t>(exclusive_offsets(receive_bytes_, receive_byte_offsets_)));
  DDP_CHECK(own_bytes == static_cast<std::size_t>(receive_bytes_[me]));
  std::memcpy(payload_bytes_.data() + receive_byte_offsets_[me], own_update_.data(), own_bytes);
  DDP_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, payload_bytes_.data(), receive_bytes_.data(),
                               receive_byte_offsets_.data(), MPI_BYTE, comm_));
  updates_.resize(total);
  for (std::size_t r = 0; r < ranks; ++r) {
    std::string error;
    const std::span<float> out(updates_.data() + receive_offsets_[r],
                               static_cast<std::size_t>(receive_counts_[r]));
    const std::size_t floats =
        widen_values(payload_bytes_.data() + receive_byte_offsets_[r],
                     static_cast<std::size_t>(receive_bytes_[r]), 0, out, wire_, error);
    if (!error.empty() || floats != out.size()) {
      throw std::runtime_error("the colocated all-gather from rank " + std::to_string(r) + ": " +
                               (error.empty() ? "a short 16-bit payload" : error));
    }
  }
  // Every copy, this owner's shard too, becomes its value before the update plus the update as sent.
  for (int r = 0; r < size_; ++r) {
    outside_pieces(r, region, [&](std::size_t from, std::size_t to, std::size_t packed) {
      for (std::size_t i = from; i < to; ++i) {
        const float update = updates_[packed + (i - from)];
        full[i] = r == rank_ ? before[i - own] + update : full[i] + update;
      }
    });
  }
}

void ShardLevel::fetch_rows(std::span<float> full, const RowRegion& region, std::span<const int32_t> rows,
                            const RowRefresh& refresh) {
  const auto ranks = static_cast<std::size_t>(size_);
  // The requests: each owner's rows (none to this rank itself, whose rows are current or refreshed below).
  send_ids_.clear();
  send_counts_.assign(ranks, 0);
  for (std::size_t owner = 0; owner < ranks; ++owner) {
    if (static_cast<int>(owner) == rank_) continue;
    const RegionPart part = region_part(begin(static_cast<int>(owner)), end(static_cast<int>(owner)), region);
    if (part.empty()) continue;
    const auto first = std::lower_bound(rows.begin(), rows.end(), static_cast<int32_t>(part.first_row));
    const auto last = std::lower_bound(first, rows.end(), static_cast<int32_t>(part.last_row));
    send_ids_.insert(send_ids_.end(), first, last);
    send_counts_[owner] = static_cast<int>(last - first);
  }
  exclusive_offsets(send_counts_, send_offsets_);
  receive_counts_.resize(ranks);
  DDP_CHECK_MPI(MPI_Alltoall(send_counts_.data(), 1, MPI_INT, receive_counts_.data(), 1, MPI_INT, comm_));
  receive_ids_.resize(static_cast<std::size_t>(exclusive_offsets(receive_counts_, receive_offsets_)));
  DDP_CHECK_MPI(MPI_Alltoallv(send_ids_.data(), send_counts_.data(), send_offsets_.data(), MPI_INT32_T,
                              receive_ids_.data(), receive_counts_.data(), receive_offsets_.data(),
                              MPI_INT32_T, comm_));
  const RegionPart mine = region_part(begin(), end(), region);
  auto asked_by = [&](std::size_t from) {
    return std::span<const int32_t>(receive_ids_)
        .subspan(static_cast<std::size_t>(receive_offsets_[from]),
                 static_cast<std::size_t>(receive_counts_[from]));
  };
  for (std::size_t from = 0; from < ranks; ++from) {
    for (const int32_t row : asked_by(from)) {
      if (mine.empty() || row < static_cast<int32_t>(mine.first_row) ||
          row >= static_cast<int32_t>(mine.last_row)) {
        throw std::runtime_error("the colocated exchange: rank " + std::to_string(from) + " asked for row " +
                                 std::to_string(row) + ", which rank " + std::to_string(rank_) +
                                 " does not hold");
      }
    }
  }
  if (refresh) {  // every row of this range that anyone here reads: asked for, or this rank's own
    refreshed_rows_.assign(receive_ids_.begin(), receive_ids_.end());
    if (!mine.empty()) {
      const auto first = std::lower_bound(rows.begin(), rows.end(), static_cast<int32_t>(mine.first_row));
      const auto last = std::lower_bound(first, rows.end(), static_cast<int32_t>(mine.last_row));
      refreshed_rows_.insert(refreshed_rows_.end(), first, last);
    }
    std::sort(refreshed_rows_.begin(), refreshed_rows_.end());
    refreshed_rows_.erase(std::unique(refreshed_rows_.begin(), refreshed_rows_.end()), refreshed_rows_.end());
    refresh(refreshed_rows_);
  }

  // The replies: this rank's floats of each requested row, in the order asked.
  std::vector<int> reply_counts(ranks, 0), reply_offsets;
  send_.clear();
  for (std::size_t from = 0; from < ranks; ++from) {
    for (const int32_t row : asked_by(from)) {
      const auto [first, last] = mine.row_span(static_cast<std::size_t>(row), region);
      send_.insert(send_.end(), full.begin() + static_cast<std::ptrdiff_t>(first),
                   full.begin() + static_cast<std::ptrdiff_t>(last));
      reply_counts[from] += static_cast<int>(last - first);
    }
  }
  exclusive_offsets(reply_counts, reply_offsets);
  // What each owner sends back follows from the rows asked: each row's floats in the owner's shard.
  auto each_asked = [&](const auto& visit) {
    for (std::size_t owner = 0; owner < ranks; ++owner) {
      const RegionPart part =
          region_part(begin(static_cast<int>(owner)), end(static_cast<int>(owner)), region);
      const auto ids = std::span<const int32_t>(send_ids_).subspan(
          static_cast<std::size_t>(send_offsets_[owner]), static_cast<std::size_t>(send_counts_[owner]));
      for (const int32_t row : ids) {
        const auto [first, last] = part.row_span(static_cast<std::size_t>(row), region);
        visit(owner, first, last);
      }
    }
  };
  std::vector<int> answer_counts(ranks, 0), answer_offsets;
  each_asked([&](std::size_t owner, std::size_t first, std::size_t last) {
    answer_counts[owner] += static_cast<int>(last - first);
  });
  receive_.resize(static_cast<std::size_t>(exclusive_offsets(answer_counts, answer_offsets)));
  DDP_CHECK_MPI(MPI_Alltoallv(send_.data(), reply_counts.data(), reply_offsets.data(), MPI_FLOAT,
                              receive_.data(), answer_counts.data(), answer_offsets.data(), MPI_FLOAT,
                              comm_));
  std::size_t at = 0;
  each_asked([&](std::size_t /*owner*/, std::size_t first, std::size_t last) {
    std::copy(receive_.begin() + static_cast<std::ptrdiff_t>(at),
              receive_.begin() + static_cast<std::ptrdiff_t>(at + (last - first)),
              full.begin() + static_cast<std::ptrdiff_t>(first));
    at += last - first;
  });
}

}  // namespace ddp::comm

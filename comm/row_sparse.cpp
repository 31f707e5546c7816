#include "comm/row_sparse.h"

#include <algorithm>
#include <cstring>

namespace ddp::comm {
namespace {

// The part of the region inside the shard, and which rows meet it.
struct ShardPart {
  std::size_t begin = 0;  // [begin, end) of the flat vector; empty when begin == end
  std::size_t end = 0;
  std::size_t first_row = 0;  // rows [first_row, last_row) meet it
  std::size_t last_row = 0;
};

ShardPart shard_part(std::size_t begin, std::size_t end, const RowRegion& region) {
  ShardPart part;
  if (region.empty()) return part;
  part.begin = std::max(begin, region.offset);
  part.end = std::min(end, region.end());
  if (part.begin >= part.end) return ShardPart{};
  part.first_row = (part.begin - region.offset) / region.width;
  part.last_row = (part.end - region.offset + region.width - 1) / region.width;
  return part;
}

// Row r's elements inside the part: [from, to) of the flat vector.
std::pair<std::size_t, std::size_t> row_span(std::size_t row, const RowRegion& region,
                                             const ShardPart& part) {
  const std::size_t row_begin = region.offset + row * region.width;
  return {std::max(row_begin, part.begin), std::min(row_begin + region.width, part.end)};
}

float int_bits(int32_t value) {
  float bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

int32_t from_bits(float bits) {
  int32_t value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

std::size_t encode_row_sparse(std::span<const float> grads, std::size_t begin, std::size_t end,
                              const RowRegion& region, std::span<const int32_t> touched_rows,
                              std::span<float> payload) {
  const ShardPart part = shard_part(begin, end, region);
  if (part.begin == part.end) return 0;
  const auto first =
      std::lower_bound(touched_rows.begin(), touched_rows.end(), static_cast<int32_t>(part.first_row));
  const auto last = std::lower_bound(first, touched_rows.end(), static_cast<int32_t>(part.last_row));
  const auto rows = static_cast<std::size_t>(last - first);
  std::size_t values = 0;
  for (auto row = first; row != last; ++row) {
    const auto [from, to] = row_span(static_cast<std::size_t>(*row), region, part);
    values += to - from;
  }
  const std::size_t rest = (end - begin) - (part.end - part.begin);
  const std::size_t size = 1 + rows + values + rest;
  if (size >= end - begin) return 0;

  std::size_t at = 0;
  payload[at++] = int_bits(static_cast<int32_t>(rows));
  for (auto row = first; row != last; ++row) payload[at++] = int_bits(*row);
  for (auto row = first; row != last; ++row) {
    const auto [from, to] = row_span(static_cast<std::size_t>(*row), region, part);
    at = static_cast<std::size_t>(std::copy(grads.begin() + from, grads.begin() + to, payload.begin() + at) -
                                  payload.begin());
  }
  at = static_cast<std::size_t>(
      std::copy(grads.begin() + begin, grads.begin() + part.begin, payload.begin() + at) - payload.begin());
  at = static_cast<std::size_t>(
      std::copy(grads.begin() + part.end, grads.begin() + end, payload.begin() + at) - payload.begin());
  return at;
}

std::string decode_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                              const RowRegion& region, std::span<float> dense) {
  const ShardPart part = shard_part(begin, end, region);
  if (part.begin == part.end) return "a sparse message for a shard that holds no row of the region";
  if (payload.empty()) return "an empty sparse message";
  const int32_t count = from_bits(payload[0]);
  if (count < 0 || static_cast<std::size_t>(count) > part.last_row - part.first_row ||
      payload.size() < 1 + static_cast<std::size_t>(count)) {
    return "a sparse message with a row count of " + std::to_string(count);
  }
  const auto rows = static_cast<std::size_t>(count);
  const std::span<const float> ids = payload.subspan(1, rows);
  std::size_t at = 1 + rows;
  std::fill(dense.begin() + static_cast<std::ptrdiff_t>(part.begin - begin),
            dense.begin() + static_cast<std::ptrdiff_t>(part.end - begin), 0.0f);
  int64_t previous = -1;
  for (const float bits : ids) {
    const int32_t row = from_bits(bits);
    if (row <= previous || static_cast<std::size_t>(row) < part.first_row ||
        static_cast<std::size_t>(row) >= part.last_row) {
      return "a sparse message with row " + std::to_string(row) + " out of order or outside the shard";
    }
    previous = row;
    const auto [from, to] = row_span(static_cast<std::size_t>(row), region, part);
    if (at + (to - from) > payload.size()) return "a sparse message shorter than its rows";
    std::copy(payload.begin() + at, payload.begin() + at + (to - from), dense.begin() + (from - begin));
    at += to - from;
  }
  const std::size_t rest = (end - begin) - (part.end - part.begin);
  if (payload.size() - at != rest) {
    return "a sparse message of " + std::to_string(payload.size()) + " values, expected " +
           std::to_string(at + rest);
  }
  std::copy(payload.begin() + at, payload.begin() + at + (part.begin - begin), dense.begin());
  at += part.begin - begin;
  std::copy(payload.begin() + at, payload.end(), dense.begin() + (part.end - begin));
  return {};
}

}  // namespace ddp::comm

#include "comm/row_sparse.h"

#include <algorithm>
#include <cstring>

namespace ddp::comm {
namespace {

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

// Reads a payload's row count and ids for `part`: empty error string when they are sound.
std::string read_row_ids(std::span<const float> payload, const RegionPart& part,
                         std::span<const float>& ids) {
  if (part.empty()) return "a sparse message for a shard that holds no row of the region";
  if (payload.empty()) return "an empty sparse message";
  const int32_t count = from_bits(payload[0]);
  if (count < 0 || static_cast<std::size_t>(count) > part.last_row - part.first_row ||
      payload.size() < 1 + static_cast<std::size_t>(count)) {
    return "a sparse message with a row count of " + std::to_string(count);
  }
  ids = payload.subspan(1, static_cast<std::size_t>(count));
  int64_t previous = -1;
  for (const float bits : ids) {
    const int32_t row = from_bits(bits);
    if (row <= previous || static_cast<std::size_t>(row) < part.first_row ||
        static_cast<std::size_t>(row) >= part.last_row) {
      return "a sparse message with row " + std::to_string(row) + " out of order or outside the shard";
    }
    previous = row;
  }
  return {};
}

// Calls `each(values, from, to)` for each row's values in the payload (after the ids) and then
// `rest(values)` for the shard's floats outside the region; the error when the sizes do not fit.
template <typename EachRow, typename Rest>
std::string walk_payload(std::span<const float> payload, std::size_t begin, std::size_t end,
                         const RowRegion& region, const RegionPart& part, std::span<const float> ids,
                         EachRow each, Rest rest) {
  std::size_t at = 1 + ids.size();
  for (const float bits : ids) {
    const auto [from, to] = part.row_span(static_cast<std::size_t>(from_bits(bits)), region);
    if (at + (to - from) > payload.size()) return "a sparse message shorter than its rows";
    each(payload.subspan(at, to - from), from, to);
    at += to - from;
  }
  const std::size_t outside = (end - begin) - (part.end - part.begin);
  if (payload.size() - at != outside) {
    return "a sparse message of " + std::to_string(payload.size()) + " values, expected " +
           std::to_string(at + outside);
  }
  rest(payload.subspan(at));
  return {};
}

}  // namespace

std::pair<std::size_t, std::size_t> RegionPart::row_span(std::size_t row, const RowRegion& region) const {
  const std::size_t row_begin = region.offset + row * region.width;
  return {std::max(row_begin, begin), std::min(row_begin + region.width, end)};
}

RegionPart region_part(std::size_t begin, std::size_t end, const RowRegion& region) {
  RegionPart part;
  if (region.empty()) return part;
  part.begin = std::max(begin, region.offset);
  part.end = std::min(end, region.end());
  if (part.begin >= part.end) return RegionPart{};
  part.first_row = (part.begin - region.offset) / region.width;
  part.last_row = (part.end - region.offset + region.width - 1) / region.width;
  return part;
}

std::size_t encode_row_sparse(std::span<const float> grads, std::size_t begin, std::size_t end,
                              const RowRegion& region, std::span<const int32_t> touched_rows,
                              std::span<float> payload) {
  const RegionPart part = region_part(begin, end, region);
  if (part.begin == part.end) return 0;
  const auto first =
      std::lower_bound(touched_rows.begin(), touched_rows.end(), static_cast<int32_t>(part.first_row));
  const auto last = std::lower_bound(first, touched_rows.end(), static_cast<int32_t>(part.last_row));
  const auto rows = static_cast<std::size_t>(last - first);
  std::size_t values = 0;
  for (auto row = first; row != last; ++row) {
    const auto [from, to] = part.row_span(static_cast<std::size_t>(*row), region);
    values += to - from;
  }
  const std::size_t rest = (end - begin) - (part.end - part.begin);
  const std::size_t size = 1 + rows + values + rest;
  if (size >= end - begin) return 0;

  std::size_t at = 0;
  payload[at++] = int_bits(static_cast<int32_t>(rows));
  for (auto row = first; row != last; ++row) payload[at++] = int_bits(*row);
  for (auto row = first; row != last; ++row) {
    const auto [from, to] = part.row_span(static_cast<std::size_t>(*row), region);
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
  const RegionPart part = region_part(begin, end, region);
  std::span<const float> ids;
  if (std::string error = read_row_ids(payload, part, ids); !error.empty()) return error;
  std::fill(dense.begin() + static_cast<std::ptrdiff_t>(part.begin - begin),
            dense.begin() + static_cast<std::ptrdiff_t>(part.end - begin), 0.0f);
  return walk_payload(
      payload, begin, end, region, part, ids,
      [&](std::span<const float> values, std::size_t from, std::size_t /*to*/) {
        std::copy(values.begin(), values.end(), dense.begin() + static_cast<std::ptrdiff_t>(from - begin));
      },
      [&](std::span<const float> outside) {
        const auto before = static_cast<std::ptrdiff_t>(part.begin - begin);
        std::copy(outside.begin(), outside.begin() + before, dense.begin());
        std::copy(outside.begin() + before, outside.end(),
                  dense.begin() + static_cast<std::ptrdiff_t>(part.end - begin));
      });
}

std::string rows_of_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                               const RowRegion& region, std::vector<int32_t>& rows) {
  std::span<const float> ids;
  if (std::string error = read_row_ids(payload, region_part(begin, end, region), ids); !error.empty())
    return error;
  for (const float bits : ids) rows.push_back(from_bits(bits));
  return {};
}

std::string add_row_sparse(std::span<const float> payload, std::size_t begin, std::size_t end,
                           const RowRegion& region, const std::function<float*(int32_t row)>& row_sum,
                           std::span<float> outside) {
  const RegionPart part = region_part(begin, end, region);
  std::span<const float> ids;
  if (std::string error = read_row_ids(payload, part, ids); !error.empty()) return error;
  if (outside.size() != (end - begin) - (part.end - part.begin)) return "a sum of the wrong size";
  auto add = [](std::span<const float> values, float* target) {
    for (std::size_t i = 0; i < values.size(); ++i) target[i] += values[i];
  };
  return walk_payload(
      payload, begin, end, region, part, ids,
      [&](std::span<const float> values, std::size_t from, std::size_t /*to*/) {
        const std::size_t row = (from - region.offset) / region.width;
        add(values, row_sum(static_cast<int32_t>(row)));
      },
      [&](std::span<const float> rest) { add(rest, outside.data()); });
}

}  // namespace ddp::comm

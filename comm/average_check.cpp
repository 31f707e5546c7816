#include "comm/average_check.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace ddp::comm {
namespace {

// 1..7 by element: with (rank + 1) as the other factor every value is at most 8 x 7 and every average over
// n <= 8 ranks is k (n + 1) / 2, a multiple of 0.5 below 32.
double element_factor(std::size_t i) {
  return static_cast<double>(1 + (i * 5 + i / 7) % 7);
}

std::string number(double v) {
  return fmt::format("{:.9g}", v);
}

}  // namespace

float average_pattern_value(int rank, std::size_t i) {
  return static_cast<float>(static_cast<double>(rank + 1) * element_factor(i));
}

double average_pattern_expected(int ranks, std::size_t i) {
  return element_factor(i) * static_cast<double>(ranks + 1) / 2.0;
}

AverageCheckResult check_average(HostGroup& group, GradientReducer& reducer, const CheckBuffer& buffer,
                                 std::span<const std::size_t> segment_sizes, double tolerance) {
  const std::size_t total = std::accumulate(segment_sizes.begin(), segment_sizes.end(), std::size_t{0});
  if (total > buffer.data.size()) {
    throw std::invalid_argument("check_average: the segments need " + std::to_string(total) +
                                " floats, the buffer holds " + std::to_string(buffer.data.size()));
  }
  std::vector<float> host(total);
  for (std::size_t i = 0; i < total; ++i) host[i] = average_pattern_value(group.rank(), i);
  buffer.upload(host);
  std::size_t offset = 0;
  for (const std::size_t size : segment_sizes) {
    reducer.start_average(buffer.data.subspan(offset, size));
    offset += size;
  }
  reducer.finish_average();
  buffer.download(host);

  AverageCheckResult result;
  std::size_t segment = 0;
  std::size_t segment_begin = 0;
  for (std::size_t i = 0; i < total; ++i) {
    while (i >= segment_begin + segment_sizes[segment]) segment_begin += segment_sizes[segment++];
    const double expected = average_pattern_expected(group.size(), i);
    const double got = static_cast<double>(host[i]);
    const double error = std::abs(got - expected) / std::max(1.0, std::abs(expected));
    if (std::isfinite(error) && error <= result.largest_error) continue;
    result.largest_error = std::isfinite(error) ? error : INFINITY;
    result.where = "segment " + std::to_string(segment + 1) + " of " + std::to_string(segment_sizes.size()) +
                   " (" + std::to_string(segment_sizes[segment]) + " floats), element " +
                   std::to_string(i - segment_begin) + ": " + number(got) + " instead of " + number(expected);
  }
  // Every rank gets the job's verdict: with an odd rank count the middle rank's own values are the average,
  // so a reduction that did nothing passes there and fails only elsewhere.
  std::vector<double> errors(static_cast<std::size_t>(group.size()), 0.0);
  errors[static_cast<std::size_t>(group.rank())] =
      std::isfinite(result.largest_error) ? result.largest_error : 1e300;
  group.sum(errors);
  const auto worst = static_cast<int>(std::max_element(errors.begin(), errors.end()) - errors.begin());
  if (worst != group.rank()) {
    result.largest_error = errors[static_cast<std::size_t>(worst)];
    result.where = "on rank " + std::to_string(worst) + " (which says where)";
  } else {
    result.where = "on rank " + std::to_string(worst) + ", " + result.where;
  }
  result.ok = result.largest_error <= tolerance;
  return result;
}

double average_tolerance(const std::string& compression, int ranks) {
  const double rounding_steps = static_cast<double>(std::max(ranks, 1) + 1);
  if (compression == "none") return std::max(kAverageTolerance, rounding_steps * std::ldexp(1.0, -24));
  if (compression == "fp16") return std::max(kFp16Tolerance, rounding_steps * std::ldexp(1.0, -11));
  if (compression == "bf16") return std::max(kBf16Tolerance, rounding_steps * std::ldexp(1.0, -8));
  throw std::invalid_argument("average_tolerance: unknown compression " + compression);
}

CheckBuffer host_check_buffer(std::span<float> data) {
  return {data, [data](std::span<const float> from) { std::copy(from.begin(), from.end(), data.begin()); },
          [data](std::span<float> to) { std::copy(data.begin(), data.begin() + to.size(), to.begin()); }};
}

}  // namespace ddp::comm

// A communicator's averaging against its closed form, as nccl-tests checks its collectives: rank r puts
// average_pattern_value(r, i) at element i, and every rank must get average_pattern_expected(ranks, i) back.
// The contract tests run it over every communicator; the GPU self-check (engine/self_check.h) over NCCL at
// the bucket sizes of the run. Memory-agnostic: the caller says how to copy to and from the buffer.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"

namespace ddp::comm {

// Small integers: every rank's value and the exact average over 1..8 ranks take at most 8 significant bits,
// so fp32, fp16 and bf16 hold them exactly, and an averaging that is right must give them exactly (up to
// the backend's rounding of sum x (1 / ranks), kAverageTolerance). Values differ per rank and per element, so
// a reduction skipped, summed without dividing, applied twice, or to another segment's data shows.
float average_pattern_value(int rank, std::size_t i);
double average_pattern_expected(int ranks, std::size_t i);

// Relative error allowed for fp32 averages (sum, then one multiplication by 1/ranks rounded to float), and
// for gradients averaged in 16 bits (comm.compression): each value rounded to the wire type and back, the sum
// in the wire type, its scaling: a few units of the wire type's last place.
constexpr double kAverageTolerance = 1e-6;
constexpr double kFp16Tolerance = 4.0 / 1024;  // 10-bit mantissa
constexpr double kBf16Tolerance = 4.0 / 128;   // 7-bit mantissa

// The tolerance for `ranks` ranks averaging with `compression` (none, fp16, bf16: comm.compression). A ring
// or tree sums in the wire type (NCCL may scale each value by 1/ranks first), rounding up to ranks - 1
// partial sums, each by half a unit in the last place of the total at most: (ranks + 1) half-units with the
// scaling, and the fixed bounds above as the floor. Throws std::invalid_argument for another compression.
double average_tolerance(const std::string& compression, int ranks);

// Where the checked floats live, and how to reach them from the host (copies complete on return).
struct CheckBuffer {
  std::span<float> data;
  std::function<void(std::span<const float>)> upload;
  std::function<void(std::span<float>)> download;
};

struct AverageCheckResult {
  bool ok = true;
  double largest_error = 0;  // relative to max(1, |expected|)
  // Where the largest error is: "on rank 1, segment 2 of 3 (4096 floats), element 17: 2.5 instead of 3"
  // (on the other ranks: "on rank 1 (which says where)").
  std::string where;
};

// Collective over `group` (the ranks `reducer` averages over): fills the first sum(segment_sizes) floats of
// `buffer` with this rank's pattern, has `reducer` start_average() each segment in order and
// finish_average(), and compares every element with the closed form:
// ok when every error on every rank is within `tolerance` (relative to max(1, |expected|)); every rank gets
// the largest error of the job and the rank it was on. Every rank must pass the same sizes.
AverageCheckResult check_average(HostGroup& group, GradientReducer& reducer, const CheckBuffer& buffer,
                                 std::span<const std::size_t> segment_sizes, double tolerance);

// A host-memory CheckBuffer over `data`.
CheckBuffer host_check_buffer(std::span<float> data);

}  // namespace ddp::comm

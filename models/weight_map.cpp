#include "models/weight_map.h"

#include <fmt/format.h>
#include <algorithm>

namespace ddp::models {

WeightMap merge_weight_runs(std::vector<WeightRun> runs, std::size_t lstm_begin, std::size_t lstm_floats,
                            std::string& problem) {
  problem.clear();
  std::sort(runs.begin(), runs.end(),
            [](const WeightRun& a, const WeightRun& b) { return a.cudnn < b.cudnn; });
  for (std::size_t i = 1; i < runs.size(); ++i) {
    if (runs[i - 1].cudnn + runs[i - 1].count > runs[i].cudnn) {
      problem = "cuDNN's weight space: blocks overlap";
      return {};
    }
  }
  std::sort(runs.begin(), runs.end(),
            [](const WeightRun& a, const WeightRun& b) { return a.canonical < b.canonical; });
  std::size_t next = lstm_begin;
  for (const WeightRun& run : runs) {
    if (run.canonical != next) {
      problem = "weight map: the LSTM tensors are not covered exactly once";
      return {};
    }
    next += run.count;
  }
  if (next != lstm_begin + lstm_floats) {
    problem = "weight map: LSTM size mismatch";
    return {};
  }
  WeightMap map;
  for (const WeightRun& run : runs) {
    WeightRun* last = map.runs.empty() ? nullptr : &map.runs.back();
    if (last != nullptr && last->canonical + last->count == run.canonical &&
        last->cudnn + last->count == run.cudnn) {
      last->count += run.count;
    } else {
      map.runs.push_back(run);
    }
  }
  for (const WeightRun& run : map.runs) map.longest = std::max(map.longest, run.count);
  return map;
}

std::string row_major_problem(const BlockDescription& b, int rows, int cols, const std::string& what) {
  const bool ok = b.of_data_type && b.dims_count == 3 && b.dims[0] == 1 && b.dims[1] == rows &&
                  b.dims[2] == cols && b.strides[2] == 1 && (rows == 1 || b.strides[1] == cols);
  if (ok) return "";
  return fmt::format(
      "cudnnGetRNNWeightParams: {} is not a row-major [{}, {}] of the data type (got {} dims {{{}, {}, {}}}, "
      "strides "
      "{{{}, {}, "
      "{}}})",
      what, rows, cols, b.dims_count, b.dims[0], b.dims[1], b.dims[2], b.strides[0], b.strides[1],
      b.strides[2]);
}

}  // namespace ddp::models

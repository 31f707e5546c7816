// The map between the canonical parameters (param_layout.h) and cuDNN's weight space, as runs of floats.
// cuDNN says where each gate's matrix and bias lies in its space (cudnnGetRNNWeightParams, queried by the
// CUDA replica); what is done with those answers is host code, tested on the host: the runs must cover the
// canonical LSTM tensors exactly once and must not overlap in cuDNN's space, and neighbours in both layouts
// become one run (fewer blocks of the copy kernel idle on short runs).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::models {

// Floats [canonical, canonical + count) of the flat buffers are floats [cudnn, cudnn + count) of cuDNN's
// weight space.
struct WeightRun {
  std::size_t canonical;
  std::size_t cudnn;
  std::size_t count;
};

struct WeightMap {
  std::vector<WeightRun> runs;  // merged, in canonical order
  std::size_t longest = 0;      // floats of the longest run
};

// Checks and merges the runs of every gate matrix and bias (in any order) for the canonical range
// [lstm_begin, lstm_begin + lstm_floats). Returns the map, or sets `problem` to what is wrong (and returns
// an empty map).
WeightMap merge_weight_runs(std::vector<WeightRun> runs, std::size_t lstm_begin, std::size_t lstm_floats,
                            std::string& problem);

// What cuDNN described for one block (its tensor descriptor's data type, dims and strides), checked against
// a row-major [rows, cols] matrix of the replica's data type; "" when it is one. `what` names the block in
// the message.
struct BlockDescription {
  bool of_data_type = false;  // the replica's data type (float, or bfloat16 at model.precision = bf16)
  int dims_count = 0;
  int dims[3] = {};
  int strides[3] = {};
};
std::string row_major_problem(const BlockDescription& block, int rows, int cols, const std::string& what);

}  // namespace ddp::models

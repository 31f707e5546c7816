// The map between the canonical LSTM tensors and cuDNN's weight space (models/weight_map.h), on the host:
// the checks and merging the CUDA replica applies to what cudnnGetRNNWeightParams says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "models/param_layout.h"
#include "models/weight_map.h"

namespace ddp::models {
namespace {

// The runs of every gate matrix and bias of `layout`, each block at a place of cuDNN's space in the order
// `shuffle` gives: all matrices first, then the biases, as cuDNN 9 lays them out for the standard algorithm,
// or a random order.
std::vector<WeightRun> gate_runs(const ParamLayout& layout, bool shuffle, std::size_t& space_floats) {
  std::vector<WeightRun> blocks;
  const ModelShape& shape = layout.shape();
  const auto h = static_cast<std::size_t>(shape.hidden);
  for (int l = 0; l < shape.layers; ++l) {
    const std::string prefix = "lstm.l" + std::to_string(l) + ".";
    const std::size_t in = static_cast<std::size_t>(l == 0 ? shape.embedding_dim : shape.hidden);
    for (std::size_t gate = 0; gate < 4; ++gate) {
      blocks.push_back({layout.tensor(prefix + "w_ih").offset + gate * h * in, 0, h * in});
      blocks.push_back({layout.tensor(prefix + "w_hh").offset + gate * h * h, 0, h * h});
    }
    for (std::size_t gate = 0; gate < 4; ++gate) {
      blocks.push_back({layout.tensor(prefix + "b_ih").offset + gate * h, 0, h});
      blocks.push_back({layout.tensor(prefix + "b_hh").offset + gate * h, 0, h});
    }
  }
  if (shuffle) std::shuffle(blocks.begin(), blocks.end(), std::mt19937(5));
  space_floats = 0;
  for (WeightRun& block : blocks) {
    block.cudnn = space_floats;
    space_floats += block.count + 3;  // cuDNN may pad between blocks
  }
  return blocks;
}

std::size_t lstm_floats(const ParamLayout& layout) {
  std::size_t floats = 0;
  for (const ParamTensor& tensor : layout.tensors()) {
    if (tensor.name.rfind("lstm.", 0) == 0) floats += tensor.size();
  }
  return floats;
}

// The copy kernel's job, on the host: canonical -> cuDNN's space -> canonical gives the LSTM tensors back
// exactly, whatever the order and padding of cuDNN's space.
TEST(WeightMap, CarriesEveryLstmFloatThereAndBack) {
  for (const bool shuffle : {false, true}) {
    const ParamLayout layout({50, 6, 5, 2});
    std::size_t space_floats = 0;
    const std::vector<WeightRun> blocks = gate_runs(layout, shuffle, space_floats);
    const std::size_t begin = layout.tensor("lstm.l0.w_ih").offset;
    std::string problem;
    const WeightMap map = merge_weight_runs(blocks, begin, lstm_floats(layout), problem);
    ASSERT_EQ(problem, "");
    EXPECT_LE(map.runs.size(), blocks.size());
    EXPECT_EQ(map.longest, std::max_element(map.runs.begin(), map.runs.end(), [](auto& a, auto& b) {
                             return a.count < b.count;
                           })->count);

    std::vector<float> canonical(layout.total_size());
    std::iota(canonical.begin(), canonical.end(), 1.0f);
    std::vector<float> space(space_floats, -1.0f);
    for (const WeightRun& run : map.runs) {
      std::copy_n(canonical.begin() + static_cast<std::ptrdiff_t>(run.canonical), run.count,
                  space.begin() + static_cast<std::ptrdiff_t>(run.cudnn));
    }
    std::vector<float> back(layout.total_size(), 0.0f);
    for (const WeightRun& run : map.runs) {
      std::copy_n(space.begin() + static_cast<std::ptrdiff_t>(run.cudnn), run.count,
                  back.begin() + static_cast<std::ptrdiff_t>(run.canonical));
    }
    for (std::size_t i = begin; i < begin + lstm_floats(layout); ++i) {
      ASSERT_EQ(back[i], canonical[i]) << "float " << i << (shuffle ? " (shuffled blocks)" : "");
    }
  }
}

TEST(WeightMap, NeighboursInBothLayoutsBecomeOneRun) {
  std::string problem;
  const WeightMap map = merge_weight_runs({{10, 100, 4}, {14, 104, 6}, {20, 0, 5}}, 10, 15, problem);
  ASSERT_EQ(problem, "");
  ASSERT_EQ(map.runs.size(), 2u);
  EXPECT_EQ(map.runs[0].canonical, 10u);
  EXPECT_EQ(map.runs[0].count, 10u);
  EXPECT_EQ(map.longest, 10u);
}

TEST(WeightMap, RefusesOverlapsGapsAndAWrongSize) {
  std::string problem;
  merge_weight_runs({{0, 0, 4}, {4, 3, 4}}, 0, 8, problem);
  EXPECT_EQ(problem, "cuDNN's weight space: blocks overlap");
  merge_weight_runs({{0, 0, 4}, {5, 10, 3}}, 0, 8, problem);
  EXPECT_EQ(problem, "weight map: the LSTM tensors are not covered exactly once");
  merge_weight_runs({{0, 0, 4}, {4, 10, 3}}, 0, 8, problem);
  EXPECT_EQ(problem, "weight map: LSTM size mismatch");
  merge_weight_runs({{0, 0, 4}, {0, 10, 4}}, 0, 8, problem);
  EXPECT_EQ(problem, "weight map: the LSTM tensors are not covered exactly once") << "a tensor mapped twice";
}

TEST(WeightMap, BlocksMustBeRowMajorFloats) {
  BlockDescription matrix{true, 3, {1, 8, 5}, {40, 5, 1}};
  EXPECT_EQ(row_major_problem(matrix, 8, 5, "w_ih gate 0"), "");
  BlockDescription padded = matrix;
  padded.strides[1] = 8;
  EXPECT_NE(row_major_problem(padded, 8, 5, "w_ih gate 0")
                .find("w_ih gate 0 is not a row-major [8, 5] of the data type"),
            std::string::npos);
  BlockDescription half = matrix;
  half.of_data_type = false;
  EXPECT_NE(row_major_problem(half, 8, 5, "w"), "");
  const BlockDescription bias{true, 3, {1, 8, 1}, {8, 1, 1}};
  EXPECT_EQ(row_major_problem(bias, 8, 1, "bias"), "");
}

}  // namespace
}  // namespace ddp::models

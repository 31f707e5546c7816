// An optimizer's state as data: what checkpoints store and what the parameter server hands between ranks,
// and a gradient given in pieces. The optimizers themselves (engine/optimizer/optimizer.h) are the training
// code's; comm/ moves their state and gradients without knowing them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

struct OptimizerState {
  int64_t iterations = 0;
  std::vector<std::pair<std::string, std::vector<float>>> buffers;  // e.g. {"m", ...}, {"v", ...}
};

// Receives a state's buffers one at a time, name and values, so that a whole state need not be copied or
// gathered at once (a checkpoint being written).
using StateBufferVisitor = std::function<void(const std::string& name, std::span<const float> values)>;

// One piece of a gradient that is zero outside its pieces: `values` are the gradient of elements
// [offset, offset + values.size()) of the vector the optimizer steps. Held that way, a gradient of which a
// step touched a few rows of a large matrix (the colocated parameter server's shard of the embedding) needs
// no dense vector the size of the parameters. A list of pieces is sorted by offset, without overlaps.
struct GradientPiece {
  std::size_t offset = 0;
  std::span<const float> values;
};

}  // namespace ddp

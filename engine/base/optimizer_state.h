// An optimizer's state as data: what checkpoints store and what the parameter server hands between ranks.
// The optimizers themselves (engine/optimizer.h) are the training code's; comm/ moves their state without
// knowing them.
#pragma once

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

}  // namespace ddp

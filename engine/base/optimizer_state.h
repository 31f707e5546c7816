// An optimizer's state as data: what checkpoints store and what the parameter server hands between ranks.
// The optimizers themselves (engine/optimizer.h) are the training code's; comm/ moves their state without
// knowing them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

struct OptimizerState {
  int64_t iterations = 0;
  std::vector<std::pair<std::string, std::vector<float>>> buffers;  // e.g. {"m", ...}, {"v", ...}
};

}  // namespace ddp

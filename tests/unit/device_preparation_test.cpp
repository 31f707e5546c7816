// The batch shapes a rank tries before its first step: the training batch, and each short last batch of
// its evaluation shards once.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "engine/device_preparation.h"

namespace ddp::engine {
namespace {

using Shapes = std::vector<std::pair<int, int>>;

TEST(DevicePreparation, BatchShapesOfARank) {
  EXPECT_EQ(batch_shapes(32, 80, 1250, 12500), (Shapes{{32, 80}, {2, 80}, {20, 80}}));
  EXPECT_EQ(batch_shapes(32, 80, 1250, 1250), (Shapes{{32, 80}, {2, 80}})) << "the same short batch once";
  EXPECT_EQ(batch_shapes(32, 80, 640, -1), (Shapes{{32, 80}})) << "whole batches only, no test split";
  EXPECT_EQ(batch_shapes(32, 40, 0, 7), (Shapes{{32, 40}, {7, 40}})) << "an empty validation shard";
}

}  // namespace
}  // namespace ddp::engine

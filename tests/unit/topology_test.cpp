// The node's cores and the ranks' binding (engine/topology.h).
#include <gtest/gtest.h>

#include <string>

#include "engine/topology.h"

namespace ddp::engine {
namespace {

// The hint names a binding that leaves cores idle: one rank bound to one core of two (Open MPI's default for
// a job of one rank), and not the bindings that use the node's cores.
TEST(Topology, IdleCoresHintOnlyWhenTheBindingLeavesCoresIdle) {
  const std::string lone_rank_on_one_core = idle_cores_hint(2, 1, 1);
  EXPECT_NE(lone_rank_on_one_core.find("1 of the node's 2 cores, less than its share of 2"),
            std::string::npos)
      << lone_rank_on_one_core;
  EXPECT_NE(lone_rank_on_one_core.find("--bind-to none"), std::string::npos);
  EXPECT_EQ(idle_cores_hint(2, 2, 1), "");    // unbound lone rank
  EXPECT_EQ(idle_cores_hint(2, 1, 2), "");    // two ranks, a core each
  EXPECT_EQ(idle_cores_hint(64, 16, 4), "");  // srun --cpus-per-task 16, 4 tasks
  EXPECT_NE(idle_cores_hint(64, 1, 4), "");   // four ranks on one core each of 64
  EXPECT_EQ(idle_cores_hint(2, 1, 3), "");    // oversubscribed: no share left to miss
}

}  // namespace
}  // namespace ddp::engine

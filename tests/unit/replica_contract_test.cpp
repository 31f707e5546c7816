// The replica contract (tests/replica_contract.h) over the CPU replica.
#include <memory>
#include <optional>
#include <string>

#include "engine/optimizer.h"
#include "models/replica.h"
#include "tests/replica_contract.h"

namespace ddp::testing {
namespace {

// Host batches, read where they are.
class HostPlacedBatch final : public PlacedBatch {
 public:
  explicit HostPlacedBatch(HostBatch batch) : batch_(std::move(batch)) {}
  BatchView view() const override { return batch_.view(); }

 private:
  HostBatch batch_;
};

struct CpuReplicaKind {
  static std::optional<std::string> unavailable() { return std::nullopt; }
  static std::unique_ptr<models::Replica> make(const models::ModelShape& shape) {
    return models::make_cpu_replica(shape);
  }
  static std::unique_ptr<engine::Optimizer> optimizer(const engine::OptimizerSettings& settings,
                                                      models::Replica& replica) {
    return engine::make_optimizer(settings, replica.layout().total_size());
  }
  static std::unique_ptr<PlacedBatch> place(const HostBatch& batch) {
    return std::make_unique<HostPlacedBatch>(batch);
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, ReplicaContract, CpuReplicaKind);

}  // namespace
}  // namespace ddp::testing

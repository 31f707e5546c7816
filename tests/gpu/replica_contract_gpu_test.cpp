// The replica contract (tests/replica_contract.h) over the cuDNN replica; skipped, saying why, where no GPU
// is visible.
#include <memory>
#include <optional>
#include <string>

#include "engine/device.h"
#include "engine/optimizer/optimizer.h"
#include "models/cuda_replica.h"
#include "models/replica.h"
#include "tests/replica_contract.h"

namespace ddp::testing {
namespace {

// A host batch copied to GPU 0 (engine::DeviceBuffer: the copies have landed when they return).
class DevicePlacedBatch final : public PlacedBatch {
 public:
  explicit DevicePlacedBatch(const HostBatch& host)
      : host_tokens_(host.tokens),
        tokens_(0, host.tokens.data(), host.tokens.size() * sizeof(int32_t)),
        labels_(0, host.labels.data(), host.labels.size() * sizeof(float)),
        batch_(host.batch),
        seq_(host.seq) {}
  BatchView view() const override {
    return {static_cast<const int32_t*>(tokens_.data()), static_cast<const float*>(labels_.data()), batch_,
            seq_, host_tokens_.data()};
  }

 private:
  std::vector<int32_t> host_tokens_;
  engine::DeviceBuffer tokens_;
  engine::DeviceBuffer labels_;
  int batch_;
  int seq_;
};

struct CudaReplicaKind {
  static std::optional<std::string> unavailable() {
    const engine::GpuInventory inventory = engine::probe_gpus();
    if (inventory.gpus.empty()) return "no GPU: " + inventory.why_none;
    return std::nullopt;
  }
  static std::unique_ptr<models::Replica> make(const models::ModelShape& shape,
                                               const models::ModelOptions& options = {}) {
    return models::make_cuda_replica(shape, 0, models::RnnAlgorithm::kAuto, options);
  }
  static std::unique_ptr<optim::Optimizer> optimizer(const optim::OptimizerSettings& settings,
                                                     models::Replica& replica) {
    return optim::make_cuda_optimizer(settings, replica.layout().total_size(), 0, replica.stream());
  }
  static std::unique_ptr<PlacedBatch> place(const HostBatch& batch) {
    return std::make_unique<DevicePlacedBatch>(batch);
  }
};

INSTANTIATE_TYPED_TEST_SUITE_P(Cuda, ReplicaContract, CudaReplicaKind);

}  // namespace
}  // namespace ddp::testing

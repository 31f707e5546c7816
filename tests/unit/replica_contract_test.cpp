// The replica contract (tests/replica_contract.h) over the CPU replica, on each of its kernel libraries
// (model.cpu_kernels): its own over the BLAS, and oneDNN's two where the build has it.
#include <memory>
#include <optional>
#include <string>

#include "engine/optimizer/optimizer.h"
#include "models/onednn_lstm.h"
#include "models/packed_gemm.h"
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

template <models::CpuKernels kKernels>
struct CpuReplicaKind {
  static std::optional<std::string> unavailable() {
    if (kKernels == models::CpuKernels::kPacked) {
      if (!models::packed_gemm_missing().empty()) return models::packed_gemm_missing();
      return std::nullopt;  // the products over the whole sequence fall back to the BLAS without oneDNN
    }
    if (kKernels != models::CpuKernels::kBuiltin && !models::onednn_missing().empty()) {
      return models::onednn_missing();
    }
    return std::nullopt;
  }
  static std::unique_ptr<models::Replica> make(const models::ModelShape& shape,
                                               const models::ModelOptions& options = {}) {
    return models::make_cpu_replica(shape, kKernels, options);
  }
  static std::unique_ptr<optim::Optimizer> optimizer(const optim::OptimizerSettings& settings,
                                                     models::Replica& replica) {
    return optim::make_optimizer(settings, replica.layout().total_size());
  }
  static std::unique_ptr<PlacedBatch> place(const HostBatch& batch) {
    return std::make_unique<HostPlacedBatch>(batch);
  }
};

using CpuKinds = ::testing::Types<
    CpuReplicaKind<models::CpuKernels::kBuiltin>, CpuReplicaKind<models::CpuKernels::kOnednn>,
    CpuReplicaKind<models::CpuKernels::kOnednnGemm>, CpuReplicaKind<models::CpuKernels::kPacked>>;
// Cpu/ReplicaContract/builtin.*, .../onednn.*, .../onednn_gemm.*, .../packed.*
struct KernelsName {
  template <typename Kind>
  static std::string GetName(int index) {
    static const char* const names[] = {"builtin", "onednn", "onednn_gemm", "packed"};
    return names[index];
  }
};
INSTANTIATE_TYPED_TEST_SUITE_P(Cpu, ReplicaContract, CpuKinds, KernelsName);

}  // namespace
}  // namespace ddp::testing

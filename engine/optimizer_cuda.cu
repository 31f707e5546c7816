// Placeholder: the fused CUDA optimizer is being written.
#include "engine/errors.h"
#include "engine/optimizer.h"

namespace ddp::engine {

std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerSettings&, std::size_t, void*) {
  throw UserError("device = cuda: the CUDA optimizer is not written yet");
}

}  // namespace ddp::engine

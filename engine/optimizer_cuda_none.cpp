#include "engine/base/errors.h"
#include "engine/optimizer.h"

namespace ddp::engine {

std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerSettings&, std::size_t, int, void*) {
  throw UserError("device = cuda: this ddptrain was built without CUDA");
}

}  // namespace ddp::engine

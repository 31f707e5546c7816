#include "engine/base/errors.h"
#include "engine/optimizer/optimizer.h"

namespace ddp::optim {

std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerSettings&, std::size_t, int, void*) {
  throw UserError("device = cuda: this ddptrain was built without CUDA");
}

}  // namespace ddp::optim

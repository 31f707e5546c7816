#include "engine/base/errors.h"
#include "models/cuda_replica.h"

namespace ddp::models {

std::unique_ptr<Replica> make_cuda_replica(const ModelShape&, int, RnnAlgorithm, const ModelOptions&) {
  throw UserError("device = cuda: this ddptrain was built without CUDA (configure with -DDDPTRAIN_CUDA=ON)");
}

}  // namespace ddp::models

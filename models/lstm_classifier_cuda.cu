// Placeholder: the cuDNN replica is being written.
#include "engine/errors.h"
#include "models/cuda_replica.h"

namespace ddp::models {

std::unique_ptr<Replica> make_cuda_replica(const ModelShape&, int) {
  throw UserError("device = cuda: the cuDNN replica is not written yet");
}

}  // namespace ddp::models

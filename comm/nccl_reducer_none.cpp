#include "comm/gradient_reducer.h"
#include "engine/base/errors.h"

namespace ddp::comm {

std::unique_ptr<GradientReducer> make_nccl_reducer(HostGroup&, void*, const std::string&) {
  throw UserError("comm.backend = nccl: this ddptrain was built without CUDA and NCCL");
}

}  // namespace ddp::comm

#include "comm/gradient_reducer.h"
#include "engine/base/errors.h"

namespace ddp::comm {

std::unique_ptr<GradientReducer> make_staged_mpi_reducer(const HostGroup&, void*, const MpiReducerOptions&) {
  throw UserError("device = cuda: this ddptrain was built without CUDA");
}

}  // namespace ddp::comm

#include "comm/communicator.h"
#include "engine/base/errors.h"

namespace ddp::comm {

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, void*, const std::string&) {
  throw UserError("comm.backend = nccl: this ddptrain was built without CUDA and NCCL");
}

}  // namespace ddp::comm

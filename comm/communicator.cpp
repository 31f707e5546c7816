#include "comm/communicator.h"

#include "engine/errors.h"

namespace ddp::comm {

std::unique_ptr<Communicator> make_communicator(const std::string& backend, MPI_Comm comm,
                                                std::string* reason) {
  std::string why;
  if (backend == "mpi") {
    why = "comm.backend = mpi";
  } else if (backend == "auto") {
    why = "comm.backend = auto: CPU replicas average gradients with MPI all-reduce";
  } else if (backend == "nccl" || backend == "ps") {
    throw UserError("comm.backend = " + backend +
                    ": this backend is not available in this build (use mpi or auto)");
  } else {
    throw UserError("comm.backend = " + backend + ": unknown backend (expected auto, mpi, nccl or ps)");
  }
  if (reason) *reason = why;
  return make_mpi_communicator(comm);
}

}  // namespace ddp::comm

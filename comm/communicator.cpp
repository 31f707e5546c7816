#include "comm/communicator.h"

#include "comm/mpi_check.h"
#include "engine/errors.h"

namespace ddp::comm {

BackendChoice choose_backend(const BackendRequest& request, MPI_Comm comm) {
  const std::string& backend = request.backend;
  if (backend != "auto" && backend != "mpi" && backend != "nccl" && backend != "ps") {
    throw UserError("comm.backend = " + backend + ": unknown backend (expected auto, mpi, nccl or ps)");
  }
  if (request.compression != "none" && request.compression != "fp16" && request.compression != "bf16") {
    throw UserError("comm.compression = " + request.compression + ": expected none, fp16 or bf16");
  }
  if (backend == "ps")
    throw UserError("comm.backend = ps: the parameter server is not part of this build yet");

  int mine = request.on_gpu ? 1 : 0;
  int gpu_ranks = 0;
  int size = 1;
  DDP_CHECK_MPI(MPI_Allreduce(&mine, &gpu_ranks, 1, MPI_INT, MPI_SUM, comm));
  DDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  const std::string census = std::to_string(gpu_ranks) + " of " + std::to_string(size) + " ranks on GPUs";

  BackendChoice choice;
  choice.all_on_cpu = gpu_ranks == 0;
  const bool all_on_gpu = gpu_ranks == size;
  if (backend == "nccl" && !all_on_gpu) {
    throw UserError("comm.backend = nccl needs every rank on a GPU, but " + census +
                    " (use comm.backend = auto or mpi)");
  }
  if (backend == "nccl" || (backend == "auto" && all_on_gpu)) {
    choice.reason =
        "nccl: " + census + (request.compression == "none" ? "" : ", gradients as " + request.compression);
    choice.communicator = make_nccl_communicator(comm, request.compute_stream, request.compression);
    return choice;
  }
  choice.reason = std::string("mpi: ") + census + (backend == "mpi" ? " (comm.backend = mpi)" : "") +
                  (gpu_ranks > 0 ? ", GPU gradients staged through host memory" : ", CPU all-reduce");
  choice.communicator = request.on_gpu ? make_staged_mpi_communicator(comm, request.compute_stream)
                                       : make_mpi_communicator(comm);
  return choice;
}

}  // namespace ddp::comm

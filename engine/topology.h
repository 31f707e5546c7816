// Where this rank sits: its rank and size in the job, its rank among the processes of its node (from
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), so it works the same under mpirun, srun or any launcher), and
// the device it trains on.
#pragma once

#include <mpi.h>

#include <string>

namespace ddp::engine {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string host;
  std::string device = "cpu";  // "cpu" (the GPU path adds "cuda:N")
  std::string device_reason;   // why this device, for the log
};

// Collective over `world`. Throws UserError when `device_request` (cpu | cuda | auto) cannot be met.
Topology discover_topology(MPI_Comm world, const std::string& device_request);

// BLAS threads for this rank: `requested` if positive, else the node's cores shared among its ranks.
int blas_threads_for(const Topology& topology, int requested);

}  // namespace ddp::engine

#include "engine/topology.h"

#include <sched.h>

#include <algorithm>
#include <thread>

#include "comm/mpi_check.h"
#include "engine/device.h"
#include "engine/errors.h"

namespace ddp::engine {

Topology discover_topology(MPI_Comm world, const std::string& device_request) {
  Topology t;
  DDP_CHECK_MPI(MPI_Comm_rank(world, &t.rank));
  DDP_CHECK_MPI(MPI_Comm_size(world, &t.size));
  MPI_Comm node = MPI_COMM_NULL;
  DDP_CHECK_MPI(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &node));
  DDP_CHECK_MPI(MPI_Comm_rank(node, &t.local_rank));
  DDP_CHECK_MPI(MPI_Comm_size(node, &t.local_size));
  DDP_CHECK_MPI(MPI_Comm_free(&node));
  t.host = host_name();

  const GpuInventory inventory = probe_gpus();
  if (device_request == "cpu") {
    t.device_reason = "device = cpu";
  } else if (device_request == "cuda") {
    if (inventory.gpus.empty()) throw UserError("device = cuda: " + inventory.why_none);
    throw UserError("device = cuda: this build has no GPU replica yet; use device = cpu or auto");
  } else {
    t.device_reason = inventory.gpus.empty() ? "device = auto: " + inventory.why_none + ", training on CPU"
                                             : "device = auto: no GPU replica in this build, training on CPU";
  }
  return t;
}

int blas_threads_for(const Topology& topology, int requested) {
  if (requested > 0) return requested;
  const int online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : online;
  // A launcher that bound this rank to its own cores already did the sharing; otherwise share the node.
  if (allowed < online) return std::max(1, allowed);
  return std::max(1, online / std::max(1, topology.local_size));
}

}  // namespace ddp::engine

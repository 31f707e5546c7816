// Where this rank sits: its rank and size in the job, its rank among the processes of its node (from
// comm::HostGroup::node(): the processes that share its memory, so it works the same under mpirun, srun or
// any launcher), and
// the device it trains on.
#pragma once

#include <string>

#include "comm/host_group.h"

namespace ddp::engine {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  std::string host;
  std::string device = "cpu";  // "cpu" or "cuda:N"
  std::string device_reason;   // why this device, for the log: a few words where no GPU is simply normal
  std::string device_detail;   // the full reason behind a brief device_reason (CUDA's own words), else ""
  int gpu = -1;                // CUDA ordinal (after CUDA_VISIBLE_DEVICES) when device is "cuda:N", else -1
  std::string gpu_name;
  std::string gpu_bus_id;  // PCI bus id, which names the board whatever CUDA_VISIBLE_DEVICES renumbers
};

// Collective over `world` (every rank passes the same request). Throws UserError when `device_request`
// (cpu | cuda | auto) cannot be met. A rank bound to a GPU leaves it current (cudaSetDevice) for its thread.
//
// GPU binding: the ranks of a node that see the same GPUs (same visible boards, so the same
// CUDA_VISIBLE_DEVICES) take them in local rank order, so local rank L of such a group trains on GPU L; a
// launcher that gives each rank its own CUDA_VISIBLE_DEVICES makes each rank a group of one, on its GPU 0.
// A rank left without a GPU is an error under cuda and trains on the CPU under auto. With `refuse_unmet`
// false (check-env) an unmet cuda request is described in device_reason instead of thrown.
Topology discover_topology(comm::HostGroup& world, const std::string& device_request,
                           bool refuse_unmet = true);

// Compute threads for this rank (train.threads): `requested` if positive, else the node's cores shared among
// its ranks.
int compute_threads_for(const Topology& topology, int requested);

// The node's cores and those this process may run on (its affinity mask, as the launcher bound it).
struct CoreCount {
  int online = 1;
  int allowed = 1;
};
CoreCount core_count();

// A hint for the start log when the launcher bound this CPU rank to fewer cores than its share of the node,
// so that train.threads = 0 leaves cores idle (Open MPI binds each rank of a one- or two-rank job to one
// core by default: half the speed of a lone rank on two cores); "" otherwise, or when train.threads is set.
std::string idle_cores_hint(const Topology& topology, int requested_threads);
// The rule: `online` cores on the node, `allowed` of them open to this rank, `local_size` ranks on the node.
std::string idle_cores_hint(int online, int allowed, int local_size);

}  // namespace ddp::engine

// The gradient backend for a job, chosen collectively from `comm.backend` and where the replicas run: an
// all-reduce (GradientReducer, gradient_reducer.h) or the parameter server (ps_service.h).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"

namespace ddp::comm {

// The backend for a job, chosen collectively from `comm.backend` and where the replicas run.
struct BackendRequest {
  std::string backend = "auto";      // auto | mpi | nccl | ps
  std::string compression = "none";  // gradients on the wire: none | fp16 (NCCL) | bf16
  std::string hierarchy = "auto";    // the MPI all-reduce across nodes: auto | off (comm.hierarchy)
  bool on_gpu = false;               // this rank's replica is on a GPU
  void* compute_stream = nullptr;    // that replica's cudaStream_t
  // That GPU's board as NCCL tells boards apart, "<host> PCI <bus id>" (MIG slices of one board share it); ""
  // where unknown.
  std::string gpu_board;
  // ps: the last K ranks serve (dedicated); 0: every rank trains and serves a shard (colocated) where every
  // rank is on a CPU (async mode also needs MPI_THREAD_MULTIPLE, for the server's thread), else one
  // dedicated server.
  int ps_servers = 0;
  bool ps_async = false;  // comm.ps_mode = async
  // The optimizer updates only the rows of a sparse matrix that a step touched (lazy embedding updates):
  // it needs the all-reduce backends, since the parameter server's optimizer updates every row of its shard.
  bool lazy_update = false;
  // comm.overlap = delayed: the all-reduce, whose steps apply the last step's average (the parameter server
  // has its own way to let workers run ahead: ps_async); on CPU ranks only, for now.
  bool delayed_exchange = false;
  // model.precision = fp16: where a rank is on a GPU, a step whose averaged gradient is not finite is skipped
  // on every rank, which needs the all-reduce, whose ranks all hold that average (the parameter server's
  // ranks do not).
  bool skips_nonfinite = false;
};

struct BackendChoice {
  // The all-reduce backends' reducer over every rank; null for the parameter server, whose ranks talk
  // through comm::ParameterService (ps_service.h).
  std::unique_ptr<GradientReducer> reducer;
  std::string reason;             // one line for rank 0's log: what was chosen and why
  bool all_on_cpu = true;         // every rank's replica is on the CPU (sparse embedding exchange possible)
  bool parameter_server = false;  // ps
  // ps, dedicated: the last `ps_servers` ranks serve, the others work. colocated: every rank works and
  // serves a shard (ps_servers is 0).
  int ps_servers = 0;
  bool colocated = false;
};

// The first two ranks (in rank order) whose non-empty `boards` are equal: NCCL refuses a board to two ranks
// ("Duplicate GPU detected"), as overlapping CUDA_VISIBLE_DEVICES ("0,1" and "0") or two MIG slices of one
// GPU give. nullopt where every rank has a board of its own.
std::optional<std::pair<int, int>> first_shared_board(const std::vector<std::string>& boards);

// Collective over `group`. auto picks NCCL when every rank has a GPU, a board of its own
// (first_shared_board); otherwise (CPU-only or mixed jobs) the parameter server, except on a job of one rank
// (no rank to serve: the single replica uses MPI) or with lazy_update (MPI, GPU ranks of a mixed job staging
// their gradients through host memory; also GPU ranks that share a board). mpi, nccl and ps force one. Throws
// UserError (the same on every rank) for an unknown backend or one the job cannot use: nccl with a CPU rank
// or two ranks on one board, ps with no rank left to work or with lazy_update.
BackendChoice choose_backend(const BackendRequest& request, HostGroup& group);

}  // namespace ddp::comm

#include "comm/backend_choice.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_check.h"
#include "engine/base/errors.h"

namespace ddp::comm {
namespace {

std::string count_of(int n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

// "rank 3" or "ranks 2-5" for [begin, end).
std::string rank_range(int begin, int end) {
  return end - begin == 1 ? "rank " + std::to_string(begin)
                          : "ranks " + std::to_string(begin) + "-" + std::to_string(end - 1);
}

// The parameter server's messages under comm.compression = bf16 | fp16 (PsOptions::wire); "" for none.
std::string ps_wire(const std::string& compression, bool async, bool colocated) {
  if (compression == "none") return "";
  const std::string wire = compression == "fp16" ? "fp16 scaled per message" : compression;
  if (async) return "; gradients pushed as " + wire + " (parameters pulled in float: async copies may lag)";
  return colocated ? "; gradients reduce-scattered and updates all-gathered as " + wire +
                         " (summed and applied in float; embedding rows fetched in float)"
                   : "; gradients pushed and updates pulled as " + wire + " (summed and applied in float)";
}

}  // namespace

std::optional<std::pair<int, int>> first_shared_board(const std::vector<std::string>& boards) {
  for (std::size_t second = 1; second < boards.size(); ++second) {
    if (boards[second].empty()) continue;
    for (std::size_t first = 0; first < second; ++first) {
      if (boards[first] == boards[second])
        return std::pair{static_cast<int>(first), static_cast<int>(second)};
    }
  }
  return std::nullopt;
}

BackendChoice choose_backend(const BackendRequest& request, HostGroup& group) {
  const std::string& backend = request.backend;
  if (backend != "auto" && backend != "mpi" && backend != "nccl" && backend != "ps") {
    throw UserError("comm.backend = " + backend + ": unknown backend (expected auto, mpi, nccl or ps)");
  }
  if (request.compression != "none" && request.compression != "fp16" && request.compression != "bf16") {
    throw UserError("comm.compression = " + request.compression + ": expected none, fp16 or bf16");
  }

  std::vector<int64_t> on_gpu{request.on_gpu ? 1 : 0};
  group.sum(std::span<int64_t>(on_gpu));
  const auto gpu_ranks = static_cast<int>(on_gpu[0]);
  const int size = group.size();
  const std::string census = std::to_string(gpu_ranks) + " of " + std::to_string(size) + " ranks on GPUs";

  BackendChoice choice;
  choice.all_on_cpu = gpu_ranks == 0;
  const bool all_on_gpu = gpu_ranks == size;
  if (backend == "nccl" && !all_on_gpu) {
    throw UserError("comm.backend = nccl needs every rank on a GPU, but " + census +
                    " (use comm.backend = auto, ps or mpi)");
  }
  if (request.delayed_exchange && (backend == "ps" || backend == "nccl" || gpu_ranks > 0)) {
    throw UserError("comm.overlap = delayed runs with the MPI all-reduce on CPU ranks, but " +
                    (gpu_ranks > 0 ? census : "comm.backend = " + backend) +
                    " (the parameter server lets workers run ahead with comm.ps_mode = async instead)");
  }
  // NCCL takes one board per rank: two ranks on one (overlapping CUDA_VISIBLE_DEVICES, MIG slices) would end
  // in its init's "Duplicate GPU detected", inside an abort.
  std::string shared_board;
  if (all_on_gpu && (backend == "nccl" || backend == "auto")) {
    const std::vector<std::string> boards = group.all_gather(request.gpu_board);
    if (const auto pair = first_shared_board(boards)) {
      shared_board = "ranks " + std::to_string(pair->first) + " and " + std::to_string(pair->second) +
                     " share the GPU at " + boards[static_cast<std::size_t>(pair->first)] +
                     " (overlapping CUDA_VISIBLE_DEVICES, or MIG slices of one GPU)";
    }
  }
  if (backend == "nccl" && !shared_board.empty()) {
    throw UserError("comm.backend = nccl needs a GPU of its own for every rank, but " + shared_board +
                    ", which NCCL refuses: give each rank its own GPU, or use comm.backend = auto or mpi");
  }
  if (backend == "nccl" || (backend == "auto" && all_on_gpu && shared_board.empty())) {
    choice.reason =
        "nccl: " + census + (request.compression == "none" ? "" : ", gradients as " + request.compression);
    choice.reducer = make_nccl_reducer(group, request.compute_stream, request.compression);
    return choice;
  }

  // What keeps auto from the parameter server, if anything.
  std::string no_server;
  if (size == 1) no_server = "a single rank trains alone (no rank to serve parameters)";
  if (request.lazy_update)
    no_server = "lazy embedding updates (train.embedding_update = lazy) need the all-reduce";
  if (!shared_board.empty()) no_server = shared_board + ", which NCCL refuses; every rank still trains";
  if (request.delayed_exchange) no_server = "comm.overlap = delayed needs the all-reduce";
  // fp16 scales the loss on GPU ranks only (CPU ranks compute in float32).
  const bool skips_nonfinite = request.skips_nonfinite && gpu_ranks > 0;
  if (skips_nonfinite) no_server = "model.precision = fp16 on GPU ranks needs the all-reduce";
  if (backend == "ps" || (backend == "auto" && no_server.empty())) {
    if (skips_nonfinite) {
      throw UserError(
          "comm.backend = ps: model.precision = fp16 needs an all-reduce backend (mpi or nccl), whose ranks "
          "all see the averaged gradient to skip a step that overflowed; use bf16, which needs no loss "
          "scaling");
    }
    if (request.lazy_update) {
      throw UserError(
          "comm.backend = ps: train.embedding_update = lazy needs an all-reduce backend (mpi or "
          "nccl); the parameter server's optimizer updates every row of its shard, also where a step "
          "pushed only the rows it touched");
    }
    // comm.ps_servers = 0: colocated where it can serve, else one dedicated server.
    std::string why_dedicated;
    if (request.ps_servers == 0 && !choice.all_on_cpu) why_dedicated = "GPU ranks";
    if (request.ps_servers == 0 && request.ps_async && !mpi_thread_multiple())
      why_dedicated = "async mode without MPI_THREAD_MULTIPLE";
    if (request.ps_servers == 0 && why_dedicated.empty()) {
      choice.colocated = true;
      choice.reason = "ps: " + census +
                      (backend == "ps" ? " (comm.backend = ps)"
                                       : " (auto: on CPU ranks every rank trains and serves, none idles)") +
                      "; colocated: " + count_of(size, "rank") + ", each training and serving 1/" +
                      std::to_string(size) + " of the parameters and their optimizer state" +
                      (request.ps_async ? " (on a server thread)" : "") +
                      ps_wire(request.compression, request.ps_async, true);
      choice.parameter_server = true;
      return choice;
    }
    const int servers = request.ps_servers == 0 ? 1 : request.ps_servers;
    if (servers >= size) {
      throw UserError("comm.ps_servers = " + std::to_string(servers) + " leaves no worker with " +
                      std::to_string(size) + (size == 1 ? " rank" : " ranks") +
                      " (the parameter server needs at least one more rank than servers)");
    }
    const int workers = size - servers;
    choice.parameter_server = true;
    choice.ps_servers = servers;
    choice.reason =
        "ps: " + census + (backend == "ps" ? " (comm.backend = ps)" : "") + "; " +
        count_of(workers, "worker") + " (" + rank_range(0, workers) + "), " +
        count_of(servers, "parameter server") + " (" + rank_range(workers, size) + ")" +
        (why_dedicated.empty() ? "" : " (the colocated layout serves CPU ranks, not " + why_dedicated + ")") +
        ps_wire(request.compression, request.ps_async, false);
    return choice;
  }
  const MpiReducerOptions options{request.compression, request.hierarchy};
  const MpiHierarchy hierarchy = mpi_hierarchy(group, options);
  choice.reason =
      std::string("mpi: ") + census + (backend == "mpi" ? " (comm.backend = mpi)" : "") +
      (gpu_ranks > 0 ? ", GPU gradients staged through host memory" : ", CPU all-reduce") +
      (backend == "auto" ? "; " + no_server : "") +
      (request.compression == "bf16"   ? ", gradients as bf16 (averaged in float)"
       : request.compression == "fp16" ? ", gradients as fp16, scaled per chunk (averaged in float)"
                                       : "") +
      (hierarchy.on ? "; hierarchical across " + std::to_string(hierarchy.nodes) +
                          " nodes (inside each node to its leader, across the leaders, back)"
                    : "");
  choice.reducer = request.on_gpu ? make_staged_mpi_reducer(group, request.compute_stream, options)
                                  : make_mpi_reducer(group, options);
  return choice;
}

}  // namespace ddp::comm

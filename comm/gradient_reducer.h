// How replicas average their gradients: the one interface the all-reduce backends implement (MPI, NCCL, MPI
// staged from GPUs). The trainer's all-reduce path sees the gradient exchange only through it, so a step
// reads like the algorithm: forward/backward, average gradients, optimizer step. Everything else the ranks
// agree on (metrics, the start, checkpoints) goes through a HostGroup (host_group.h). The parameter server
// (ps_service.h) does not fit it: its workers push gradients and pull parameters, and choose_backend()
// (backend_choice.h) only picks it.
//
// Gradient averaging is split in two so that it can overlap with backward: the replica hands each gradient
// segment to start_average() as soon as backward has finished it, and finish_average() waits for all of
// them before the optimizer runs. Every rank must start the same segments in the same order.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/host_group.h"

namespace ddp::comm {

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;

  // The backend's name as the config spells it ("mpi", ...), for logs and metrics.
  virtual std::string backend() const = 0;
  // The ranks it averages over: whether other ranks' gradients are mixed into this rank's at all.
  virtual int size() const = 0;

  // Starts averaging `segment` in place across ranks; returns at once. The memory must stay untouched until
  // finish_average() returns.
  virtual void start_average(std::span<float> segment) = 0;
  // Waits until every started segment holds the average over all ranks.
  virtual void finish_average() = 0;
  // Whether start_average() and finish_average() (after a first step that sized the backend's buffers) only
  // enqueue work on CUDA streams ordered by events, never waiting on the host nor allocating: then a whole
  // step, its exchange included, can be captured into a CUDA graph and replayed (engine/step_graph.h).
  // NCCL's do; the MPI backends' go through the host.
  virtual bool capturable() const { return false; }
  // Both at once.
  void average(std::span<float> data) {
    start_average(data);
    finish_average();
  }

  // Starts averaging the rows of a row-major matrix [total_rows, width] that any rank touched, for sparse
  // gradients such as the embedding's. `rows` are this rank's touched rows (sorted, unique); every other row
  // of `matrix` must be zero on this rank. Returns the union of all ranks' rows (sorted): exchanging the row
  // ids (small) blocks, the values travel in the background like a segment of start_average(), and once
  // finish_average() returns every rank holds those rows averaged; rows outside the union stay zero. Only
  // the union's rows travel, unless the union covers most of the matrix, when the whole matrix is averaged.
  // At most one such exchange may be pending; it counts as a segment for the order across ranks.
  virtual std::vector<int32_t> start_average_rows(std::span<float> matrix, std::size_t width,
                                                  std::span<const int32_t> rows) = 0;

  // An error the backend's asynchronous work has met (a peer that failed, a network that went down), which
  // may otherwise show only as a hang; nothing if none. Not collective, and safe to call from another thread
  // (the trainer's watchdog polls it). MPI reports such errors at the failing call, so only NCCL has any.
  virtual std::optional<std::string> asynchronous_error() { return std::nullopt; }

  // After an error on this rank: ends the backend's outstanding work without waiting for the other ranks, so
  // that nothing local waits on a reduction that will never complete (NCCL: ncclCommAbort, which releases a
  // compute stream that waits on the communication stream). The reducer is unusable afterwards. MPI
  // backends have nothing to abort: their errors end the job where they happen.
  virtual void abort() {}
};

// Aborts `reducer` (if any) when the scope is left by an exception. Declared after the objects whose
// destructors wait for the reducer's work (a GPU replica synchronising its stream), it runs before them on
// the way out.
class AbortOnUnwind {
 public:
  explicit AbortOnUnwind(GradientReducer* reducer)
      : reducer_(reducer), exceptions_(std::uncaught_exceptions()) {}
  ~AbortOnUnwind() {
    if (reducer_ != nullptr && std::uncaught_exceptions() > exceptions_) reducer_->abort();
  }
  AbortOnUnwind(const AbortOnUnwind&) = delete;
  AbortOnUnwind& operator=(const AbortOnUnwind&) = delete;

 private:
  GradientReducer* reducer_;
  int exceptions_;
};

// Each backend is made collectively over `group`'s ranks and keeps communicators of its own, so its traffic
// never mixes with the group's; `group` may go before it.

// How the MPI backend averages.
struct MpiReducerOptions {
  // Gradients travel as float (none), bfloat16 (bf16) or fp16 scaled per chunk by a power of two (fp16),
  // averaged in float; another is a UserError.
  std::string compression = "none";
  // comm.hierarchy. auto: on a job of several nodes where some node has several ranks, a segment is summed
  // inside each node to its leader, averaged across the leaders (on the wire `compression` says), and
  // broadcast inside each node (mpi_reducer.cpp); elsewhere, and with off, one exchange over every rank.
  // Every rank must pass the same.
  std::string hierarchy = "auto";
  // For tests on one machine: ranks that pass the same number (0 or more) count as one node; -1: the ranks
  // that share memory (MPI_COMM_TYPE_SHARED) do.
  int test_node = -1;
};

// Whether the MPI backend's hierarchy applies to a job, and over how many nodes.
struct MpiHierarchy {
  bool on = false;
  int nodes = 1;         // ranks grouped as `options` says
  int largest_node = 1;  // ranks on the fullest node
};
// Collective over `group`: what make_mpi_reducer(group, options) will do.
MpiHierarchy mpi_hierarchy(const HostGroup& group, const MpiReducerOptions& options);

// The MPI backend (mpi_reducer.cpp). It shares `group`'s lock (HostGroup::call_lock).
std::unique_ptr<GradientReducer> make_mpi_reducer(const HostGroup& group, const MpiReducerOptions& options);
inline std::unique_ptr<GradientReducer> make_mpi_reducer(const HostGroup& group,
                                                         const std::string& compression = "none") {
  return make_mpi_reducer(group, MpiReducerOptions{compression});
}

// NCCL over one GPU per rank: one communicator for the job (its unique id travels by a broadcast over
// `group`). Gradient segments (device memory) are reduced on a communication stream that first waits on an
// event recorded on `compute_stream` (the replica's cudaStream_t), so backward keeps running while a bucket
// is reduced; finish_average() makes the compute stream wait for the reductions, without a host
// synchronisation. `compression` is none, fp16 or bf16 (gradients cast for the wire, averaged, cast back).
// start_average_rows() averages the whole matrix. In a build without CUDA it throws a UserError.
std::unique_ptr<GradientReducer> make_nccl_reducer(HostGroup& group, void* compute_stream,
                                                   const std::string& compression);

// MPI for a GPU replica: segments in device memory are staged through pinned host buffers (copied after the
// compute stream's work, all-reduced over MPI, copied back). Interoperates with CPU ranks using the MPI
// backend in the same job, on the same wire and hierarchy (`options`: make_mpi_reducer's). In a build without
// CUDA it throws a UserError.
std::unique_ptr<GradientReducer> make_staged_mpi_reducer(const HostGroup& group, void* compute_stream,
                                                         const MpiReducerOptions& options = {});

}  // namespace ddp::comm

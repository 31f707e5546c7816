// How replicas talk: the one interface the all-reduce backends implement (MPI, NCCL, MPI staged from GPUs).
// The trainer's all-reduce path sees communication only through it, so a step reads like the algorithm:
// forward/backward, average gradients, optimizer step. The parameter server (parameter_server.h) does not fit
// it: its workers push gradients and pull parameters, and choose_backend() below only picks it.
//
// Gradient averaging is split in two so that it can overlap with backward: the replica hands each gradient
// segment to start_average() as soon as backward has finished it, and finish_average() waits for all of
// them before the optimizer runs. Every rank must start the same segments in the same order.
#pragma once

#include <mpi.h>

#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/base/errors.h"

namespace ddp::comm {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The backend's name as the config spells it ("mpi", ...), for logs and metrics.
  virtual std::string backend() const = 0;

  // Copies root's `data` into every rank's `data`.
  virtual void broadcast(std::span<float> data, int root) = 0;
  virtual void broadcast(std::span<double> data, int root) = 0;

  // Starts averaging `segment` in place across ranks; returns at once. The memory must stay untouched until
  // finish_average() returns.
  virtual void start_average(std::span<float> segment) = 0;
  // Waits until every started segment holds the average over all ranks.
  virtual void finish_average() = 0;
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

  // In-place sum over ranks of a few numbers (metrics, counters).
  virtual void sum(std::span<double> data) = 0;
  virtual void barrier() = 0;
  // Collective: root receives every rank's text in rank order (others get an empty vector).
  virtual std::vector<std::string> gather(const std::string& text, int root) = 0;
  // Collective, gather's inverse: root passes one text per rank (in rank order; the others' `texts` are not
  // read) and every rank gets its own.
  virtual std::string scatter(const std::vector<std::string>& texts, int root) = 0;

  // Collective: every rank passes its error (or nothing); every rank gets back the error of the lowest rank
  // that had one, so one rank can print it and all can exit together instead of hanging.
  virtual std::optional<std::string> first_error(const std::optional<std::string>& mine) = 0;

  // An error the backend's asynchronous work has met (a peer that failed, a network that went down), which
  // may otherwise show only as a hang; nothing if none. Not collective, and safe to call from another thread
  // (the trainer's watchdog polls it). MPI reports such errors at the failing call, so only NCCL has any.
  virtual std::optional<std::string> asynchronous_error() { return std::nullopt; }

  // After an error on this rank: ends the backend's outstanding work without waiting for the other ranks, so
  // that nothing local waits on a reduction that will never complete (NCCL: ncclCommAbort, which releases a
  // compute stream that waits on the communication stream). The communicator is unusable afterwards. MPI
  // backends have nothing to abort: their errors end the job where they happen.
  virtual void abort() {}
};

// Aborts `comm` (if any) when the scope is left by an exception. Declared after the objects whose
// destructors wait for the communicator's work (a GPU replica synchronising its stream), it runs before them
// on the way out.
class AbortOnUnwind {
 public:
  explicit AbortOnUnwind(Communicator* comm) : comm_(comm), exceptions_(std::uncaught_exceptions()) {}
  ~AbortOnUnwind() {
    if (comm_ != nullptr && std::uncaught_exceptions() > exceptions_) comm_->abort();
  }
  AbortOnUnwind(const AbortOnUnwind&) = delete;
  AbortOnUnwind& operator=(const AbortOnUnwind&) = delete;

 private:
  Communicator* comm_;
  int exceptions_;
};

// Runs `work` on every rank; if it throws a UserError on any rank, every rank throws the lowest failing
// rank's message as an AgreedUserError (errors.h). For checks of user input that run before (or between)
// collectives.
template <typename Work>
void agree_on_errors(Communicator& comm, Work&& work) {
  std::optional<std::string> error;
  try {
    work();
  } catch (const UserError& e) {
    error = e.what();
  }
  if (auto first = comm.first_error(error)) throw AgreedUserError(*first);
}

// The MPI backend over `comm` (duplicated, so its traffic never mixes with other users of `comm`). Gradients
// travel as float, or with `compression` bf16 as bfloat16, averaged in float (mpi_communicator.cpp); another
// compression is a UserError.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& compression = "none");

// Call before MPI_Init: Open MPI defaults for gradient exchange across nodes (benchmarks/RESULTS.md,
// "Across nodes"). Sets only parameters the user has not set; other MPIs ignore them.
// - Its TCP transport sends a message above 64 KiB by rendezvous: a first fragment, then a wait for the
//   receiver's answer before the rest. Across a link whose queue holds milliseconds of data that answer
//   waits behind the gradients going the other way, which cut the throughput of an all-reduce across a slow
//   link by half. Gradient buckets are sent eagerly up to 4 MiB instead.
// - Its non-blocking all-reduce (libnbc) takes a binomial tree below 4 ranks: a reduce to one rank, then a
//   broadcast back, so each direction of a link idles half the time. Rabenseifner's reduce-scatter and
//   all-gather keep both directions busy (the step across two nodes: benchmarks/RESULTS.md).
void set_mpi_transport_defaults();

// NCCL over one GPU per rank: one communicator for the job (its unique id travels by MPI_Bcast). Gradient
// segments (device memory) are reduced on a communication stream that first waits on an event recorded on
// `compute_stream` (the replica's cudaStream_t), so backward keeps running while a bucket is reduced;
// finish_average() makes the compute stream wait for the reductions, without a host synchronisation.
// `compression` is none, fp16 or bf16 (gradients cast for the wire, averaged, cast back).
// start_average_rows() averages the whole matrix. broadcast(), sum(), gather() and first_error() work on host
// memory over MPI. In a build without CUDA it throws a UserError.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, void* compute_stream,
                                                     const std::string& compression);

// MPI for a GPU replica: segments in device memory are staged through pinned host buffers (copied after the
// compute stream's work, all-reduced over MPI, copied back). Interoperates with CPU ranks using the MPI
// backend in the same job, on the same wire (`compression`: make_mpi_communicator's). In a build without CUDA
// it throws a UserError.
std::unique_ptr<Communicator> make_staged_mpi_communicator(MPI_Comm comm, void* compute_stream,
                                                           const std::string& compression = "none");

// The backend for a job, chosen collectively from `comm.backend` and where the replicas run.
struct BackendRequest {
  std::string backend = "auto";      // auto | mpi | nccl | ps
  std::string compression = "none";  // NCCL gradients on the wire: none | fp16 | bf16
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
};

struct BackendChoice {
  // The all-reduce backends' communicator over every rank; null for the parameter server, whose ranks
  // talk through comm::ParameterService (parameter_service.h).
  std::unique_ptr<Communicator> communicator;
  std::string reason;             // one line for rank 0's log: what was chosen and why
  bool all_on_cpu = true;         // every rank's replica is on the CPU (sparse embedding exchange possible)
  bool parameter_server = false;  // ps
  // ps, dedicated: the last `ps_servers` ranks serve, the others work. colocated: every rank works and
  // serves a shard (ps_servers is 0).
  int ps_servers = 0;
  bool colocated = false;
};

// Collective over `comm`, before any Communicator exists (topology, the backend's choice): every rank's
// `mine`, in rank order.
std::vector<std::string> all_gather_strings(const std::string& mine, MPI_Comm comm);

// The first two ranks (in rank order) whose non-empty `boards` are equal: NCCL refuses a board to two ranks
// ("Duplicate GPU detected"), as overlapping CUDA_VISIBLE_DEVICES ("0,1" and "0") or two MIG slices of one
// GPU give. nullopt where every rank has a board of its own.
std::optional<std::pair<int, int>> first_shared_board(const std::vector<std::string>& boards);

// Collective over `comm`. auto picks NCCL when every rank has a GPU, a board of its own (first_shared_board);
// otherwise (CPU-only or mixed jobs) the parameter server, except on a job of one rank (no rank to serve: the
// single replica uses MPI) or with lazy_update (MPI, GPU ranks of a mixed job staging their gradients through
// host memory; also GPU ranks that share a board). mpi, nccl and ps force one. Throws UserError (the same on
// every rank) for an unknown backend or one the job cannot use: nccl with a CPU rank or two ranks on one
// board, ps with no rank left to work or with lazy_update.
BackendChoice choose_backend(const BackendRequest& request, MPI_Comm comm);

}  // namespace ddp::comm

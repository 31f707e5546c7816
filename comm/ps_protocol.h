// The dedicated parameter server's protocol within a run of steps (ps_service.h is the interface
// around it, ps_service_dedicated.cpp the control between runs).
//
// Who owns what. The last K ranks of the job are servers, every other rank is a worker (W = size - K).
// Server j owns the contiguous shard [shard_begin(j), shard_end(j)) of the flat parameter vector (split as
// evenly as possible, the larger shards first) and that shard's optimizer state, which lives in the caller's
// ShardUpdate (an optimizer's step, ps_service.h): this protocol knows nothing of optimizers. Workers
// own the full parameter vector, compute gradients on it, and get it back from the servers after every step.
//
// Wire (PsOptions::wire in 16 bits halves both directions; see there). All traffic is non-blocking MPI
// point-to-point on a communicator duplicated from the one given, so it never mixes with other users of that
// communicator. Every message starts with a PsHeader {step, kind} (prepended to the payload, sent as bytes);
// the tag is the kind as well, and the receiver checks that both agree and that the step is the one it
// expects. A mismatch ends the job through DDP_FATAL with both steps and both ranks, never silent corruption.
//   worker -> server j:  kGrads  {t, grads[shard j]}   the gradients of the worker's step t (t = 0, 1, ...)
//                        kSparseGrads {t, rows...}     the same, row-sparse in
//                        PsOptions::sparse_exchange_rows
//                                                      (comm/row_sparse.h), when that is smaller
//                        kPull   {t}                   "send me your shard now", outside the step sequence
//                        kDone   {t}                   the worker will send nothing more
//   server j -> worker:  kParams {t, params[shard j]}  the reply to kGrads of step t, or to kPull (t echoed)
// A worker has at most one request outstanding per server, so replies need no matching beyond the header.
//
// Sync mode (default). For step t a server waits for the kGrads of step t of every worker, sums them in
// worker-rank order, multiplies by 1/W (so the result does not depend on arrival order), applies the update
// once and sends the new shard to every worker: all workers end the step with identical parameters, the same
// that an all-reduce of the gradients followed by the same optimizer would give. Every worker must run the
// same number of steps: a kDone while another worker's step is under way, or a kGrads after a kDone, is
// fatal.
//
// Async mode (PsOptions::async, staleness bound s = max_staleness >= 0). A server applies each worker's
// gradient as it arrives (one optimizer step per gradient, not averaged) and replies with its current shard,
// except that the reply to a worker whose push count would exceed the slowest active worker's by more than s
// waits until that worker catches up: while a worker computes step k, every other worker has pushed at least
// k - s steps, so the push counts the server sees never differ by more than s + 1. Workers that said kDone
// no longer hold the others back.
//
// Faults. No wait blocks in MPI: every wait polls (MPI_Test*, paced by comm/poller.h) against a deadline. A
// server ends the job (ddp::fatal, MPI_Abort) naming every worker it is waiting for that has been silent for
// timeout_s since their last exchange; a worker waits 2 * timeout_s for a server before naming it, so that
// when a worker is lost the server, which knows which one, speaks first. timeout_s must therefore exceed the
// longest silence of a healthy worker (a step, an evaluation between steps, start-up before the first pull).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/row_sparse.h"
#include "comm/wire_payload.h"

namespace ddp::comm {

struct PsOptions {
  int servers = 1;         // K: the last K ranks serve; 0: every rank serves (colocated)
  bool async = false;      // sync: averaged lock-step; async: bounded-staleness updates
  int max_staleness = 0;   // async only: s >= 0
  double timeout_s = 120;  // the longest silence a server accepts from a worker it waits for
  // Sync, colocated: the averaged gradient's global norm is clipped to this (0: never); the owners add up
  // their shards' squares.
  double clip_norm = 0;
  // Where gradients may be zero outside the rows a step touched (the embedding): such pushes send only those
  // rows (push_pull with touched rows). Empty: every push is dense. The same on every rank.
  RowRegion sparse_exchange_rows;
  // At most how many of those rows a training rank's step reads (its batch's tokens: batch x sequence
  // length); 0: unknown. The colocated layout moves rows instead of the region only where they are few.
  std::size_t rows_read_per_step = 0;
  // comm.compression = bf16 | fp16 (wire_payload.h): gradients are pushed in 16 bits (the server sums them
  // in float), and in sync mode a step's reply carries the shard's update rounded to 16 bits, which the
  // server adds to its own shard as the workers add it to theirs: every copy of the parameters stays the
  // same bits, and both directions move half the bytes. Pulls, and async replies (a worker's copy may lag the
  // server's), send the parameters in float. The same on every rank.
  WireFormat wire = WireFormat::kFloat;
  // comm.hierarchy = auto: the colocated layout's sync exchange goes through the nodes where several ranks
  // share each (sharded_exchange.h); `test_node` >= 0 makes pseudo-nodes for tests (node_layout.h). The same
  // on every rank.
  bool hierarchy = false;
  int test_node = -1;
  // A server's source for PsHeader::stop_signal: the stop signal its process has received, 0 if none (unset:
  // never one).
  std::function<int()> stop_signal;
};

// Which ranks serve and which shard each owns; the same on every rank. Dedicated: the last `servers` ranks
// serve, the others work. Colocated: every rank works and serves shard j = its rank.
struct PsRoles {
  int world_size = 1;
  int servers = 1;
  bool colocated = false;

  // Throws UserError unless 1 <= servers < world_size (at least one worker).
  static PsRoles make(int world_size, int servers);
  static PsRoles colocated_on(int world_size) { return PsRoles{world_size, world_size, true}; }
  // PsOptions::servers: 0 colocated, else dedicated.
  static PsRoles of(int world_size, int servers) {
    return servers == 0 ? colocated_on(world_size) : make(world_size, servers);
  }

  int workers() const { return colocated ? world_size : world_size - servers; }
  bool is_worker(int rank) const { return colocated || rank < workers(); }
  bool is_server(int rank) const { return colocated || rank >= workers(); }
  int server_rank(int server_index) const { return colocated ? server_index : workers() + server_index; }
  int server_index(int rank) const { return colocated ? rank : rank - workers(); }
  // Server j owns [shard_begin(j), shard_end(j)); some shards are empty when total < servers.
  std::size_t shard_begin(int server_index, std::size_t total) const;
  std::size_t shard_end(int server_index, std::size_t total) const;
};

// "rank 3" or "ranks 1, 4", for messages that name the ranks waited for.
std::string rank_list(const std::vector<int>& ranks);

// Colocated: the servers this rank's client waits for a reply from, as the server thread beside it reads
// them. A server that hears nothing from its own rank's worker then blames the servers that worker waits for,
// not the worker (the whole job waits on a lost rank; each server sees only who stopped pushing to it).
class ClientWaits {
 public:
  void set(std::vector<int> server_ranks);  // empty: not waiting
  std::vector<int> get() const;

 private:
  mutable std::mutex mutex_;
  std::vector<int> server_ranks_;
};

// The communicators a run of steps travels on: the workers' requests (gradients, pulls, done) on one, the
// servers' replies on another. Colocated, a rank's server (on its own thread) and its client both receive
// from every rank: on one communicator the server's receive, which takes any tag, could take a reply meant
// for the client. Dedicated, no rank is both, and one communicator serves both directions.
class PsChannels {
 public:
  // Collective over `parent`, each duplicate waited for with a deadline (a rank that never joins ends the
  // job, naming `who`).
  PsChannels(MPI_Comm parent, bool colocated, double timeout_s, const std::string& who);
  ~PsChannels();
  PsChannels(const PsChannels&) = delete;
  PsChannels& operator=(const PsChannels&) = delete;

  MPI_Comm requests() const { return requests_; }
  MPI_Comm replies() const { return replies_ == MPI_COMM_NULL ? requests_ : replies_; }
  // The servers' "are you alive?" and its answer: colocated, a server's rank is also a worker whose pushes
  // the others receive from it with any tag on requests(), so the questions travel apart.
  MPI_Comm alive() const { return alive_ == MPI_COMM_NULL ? requests_ : alive_; }
  // Shared by the rank's client (which writes it) and server (which reads it).
  ClientWaits& client_waits() const { return client_waits_; }

 private:
  MPI_Comm requests_ = MPI_COMM_NULL;
  MPI_Comm replies_ = MPI_COMM_NULL;  // colocated only
  MPI_Comm alive_ = MPI_COMM_NULL;    // colocated only
  mutable ClientWaits client_waits_;
};

// The server's update of its shard: params_shard -= f(grads_shard), an optimizer's step; the optimizer
// state stays with the caller.
using ShardUpdate = std::function<void(std::span<float> params_shard, std::span<const float> grads_shard)>;

// The message kinds; each is also the MPI tag its messages travel with.
enum class PsKind : int64_t { kGrads = 1, kPull = 2, kDone = 3, kParams = 4, kSparseGrads = 5 };

// What travels in front of every payload.
struct PsHeader {
  int64_t step = 0;
  int64_t kind = 0;  // a PsKind
  // kParams: the stop signal the server's process has received (0: none). A dedicated server is not among
  // the training ranks that agree on a stop (engine/preemption.h), so its replies carry it to them.
  int64_t stop_signal = 0;
};

// The check every receiver makes: empty when `got` is what `receiver` expected from `sender` (ranks), else
// the one-line fatal message naming both steps and both ranks. `tag` is the MPI tag the message came with.
std::string ps_header_error(const PsHeader& got, int tag, PsKind expected_kind, int64_t expected_step,
                            int sender, int receiver, bool receiver_is_server);

// What a server saw, for logs and tests.
struct PsServerStats {
  int64_t steps = 0;           // sync: steps applied; async: gradients applied
  int64_t updates = 0;         // calls of the ShardUpdate
  int64_t max_gap = 0;         // largest difference of push counts between active workers
  int64_t gradient_bytes = 0;  // payload bytes of the gradients received (dense or row-sparse)
};

// Runs this rank's server until every worker said kDone. `shard` holds this server's initial parameters
// (size shard_end - shard_begin) and is updated in place, so the caller holds the final ones on return.
// Over `channels`, shared with the workers' ParameterClients. Colocated (PsOptions::servers = 0), a rank
// runs its server on a thread of its own beside its client, which needs MPI_THREAD_MULTIPLE.
PsServerStats run_parameter_server(const PsChannels& channels, const PsOptions& options,
                                   std::size_t total_size, std::span<float> shard, const ShardUpdate& update);
// Dedicated: the same over channels made from `comm` (collective with the workers' ParameterClient
// constructors that take a communicator).
PsServerStats run_parameter_server(MPI_Comm comm, const PsOptions& options, std::size_t total_size,
                                   std::span<float> shard, const ShardUpdate& update);

// A worker's side: one per worker rank. Construction is collective with the servers' run_parameter_server.
class ParameterClient {
 public:
  // Over `channels` (kept by the caller for the client's life).
  ParameterClient(const PsChannels& channels, const PsOptions& options, std::size_t total_size);
  // Dedicated: over channels of its own made from `comm` (collective with the servers'
  // run_parameter_server that takes a communicator).
  ParameterClient(MPI_Comm comm, const PsOptions& options, std::size_t total_size);
  ~ParameterClient();
  ParameterClient(const ParameterClient&) = delete;
  ParameterClient& operator=(const ParameterClient&) = delete;

  // Pushes this step's gradients (the full flat vector, host memory) and returns when `params` (the full
  // vector) holds the servers' updated parameters. Advances step() by one.
  void push_pull(std::span<const float> grads, std::span<float> params);
  // The same, for gradients that are zero in PsOptions::sparse_exchange_rows outside `touched_rows` (sorted,
  // unique): each server gets only those rows of its shard, or its shard dense where that is no larger.
  void push_pull(std::span<const float> grads, std::span<const int32_t> touched_rows,
                 std::span<float> params);
  // One of the two above: row-sparse where `touched_rows` is given (non-null) and PsOptions names the rows.
  void push_pull(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                 std::span<float> params);
  // Fetches the servers' current parameters without pushing (at the start, for evaluation).
  void pull(std::span<float> params);
  // Tells every server this worker is done; the destructor calls it if it was not called.
  void finish();
  // Steps pushed so far.
  int64_t step() const { return step_; }
  // The highest stop signal a server's reply has reported (PsHeader::stop_signal), 0 if none.
  int servers_stop_signal() const { return servers_stop_signal_; }

 private:
  struct Peer {  // one server
    int rank = 0;
    std::size_t begin = 0;
    std::size_t end = 0;
    std::vector<float> send;     // header + gradients
    std::vector<float> receive;  // header + parameters
    MPI_Request send_request = MPI_REQUEST_NULL;
    MPI_Request receive_request = MPI_REQUEST_NULL;
  };
  void set_up();
  // `touched_rows` non-null: grads are row-sparse in options_.sparse_exchange_rows (kGrads only).
  void exchange(PsKind kind, std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                std::span<float> params);
  void wait_sends();
  // The servers whose reply has not come yet.
  std::vector<int> pending_servers() const;

  std::unique_ptr<PsChannels> own_channels_;  // made from a communicator
  ClientWaits* waits_ = nullptr;              // the channels' board
  MPI_Comm requests_ = MPI_COMM_NULL;
  MPI_Comm replies_ = MPI_COMM_NULL;
  PsOptions options_;
  PsRoles roles_;
  int rank_ = 0;
  std::size_t total_size_ = 0;
  std::vector<Peer> peers_;
  std::vector<float> update_;  // a 16-bit reply's update, widened
  int64_t step_ = 0;
  int servers_stop_signal_ = 0;
  bool finished_ = false;
};

}  // namespace ddp::comm

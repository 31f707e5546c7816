// The colocated layout of the parameter server (ps_service.h): every rank trains and serves one
// shard. Sync mode over the collectives of sharded_exchange.h; async mode over the protocol of
// ps_protocol.h, each rank's server on a thread of its own.
//
// Threads (async). A rank's shard must take the other ranks' gradients while the rank computes, so its
// server runs on a second thread, and both threads call MPI: the server polls its receives and replies, the
// training thread's client pushes and pulls. That needs MPI_THREAD_MULTIPLE, which main() asks for (and Open
// MPI 4.1 gives with its TCP and shared-memory transports). The other way, one communication thread making
// every MPI call of the rank (the collectives of evaluation, metrics and the stop agreement included), would
// route all of the trainer's communication through a queue for the sake of one mode; with
// MPI_THREAD_MULTIPLE the two threads share nothing but the MPI library, and each uses communicators of its
// own (PsChannels). Where the MPI gives less, the backend choice falls back to a dedicated server.
#include <algorithm>
#include <thread>
#include <utility>

#include "comm/mpi_check.h"
#include "comm/ps_service.h"
#include "comm/sharded_exchange.h"
#include "engine/base/errors.h"
#include "engine/base/gradient_clipping.h"
#include "engine/base/timeline.h"

namespace ddp::comm {
namespace {

// Open MPI 4.1's TCP transport can lose a connection handshake made while two threads of a rank are in MPI
// (a job across nodes then hangs in its first steps; seen with the MPI backend's progress thread). The async
// protocol reaches every pair of ranks from two threads, so every connection is made first, here, on one
// thread: each rank exchanges one message with every other, in size - 1 rounds. Collective.
void connect_every_pair(MPI_Comm parent) {
  MPI_Comm comm = MPI_COMM_NULL;
  DDP_CHECK_MPI(MPI_Comm_dup(parent, &comm));
  int rank = 0;
  int size = 1;
  DDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  DDP_CHECK_MPI(MPI_Comm_size(comm, &size));
  for (int k = 1; k < size; ++k) {
    int sent = rank;
    int received = -1;
    DDP_CHECK_MPI(MPI_Sendrecv(&sent, 1, MPI_INT, (rank + k) % size, 0, &received, 1, MPI_INT,
                               (rank - k + size) % size, 0, comm, MPI_STATUS_IGNORE));
  }
  DDP_CHECK_MPI(MPI_Comm_free(&comm));
}

// Collective: rank 0's parameters to every rank, and each rank's shard of rank 0's optimizer state (when it
// has one: else every shard keeps its zero state) into `optimizer`.
void distribute_shards(ShardedExchange& exchange, optim::Optimizer& optimizer, std::span<float> params,
                       const OptimizerState* whole_state) {
  exchange.broadcast(params);
  const bool root = exchange.rank() == 0;
  const bool has_state = exchange.broadcast(root && whole_state != nullptr ? 1 : 0) != 0;
  if (!has_state) return;
  OptimizerState shard = optimizer.state();
  shard.iterations = exchange.broadcast(root ? whole_state->iterations : 0);
  for (std::size_t b = 0; b < shard.buffers.size(); ++b) {
    exchange.scatter_from_root(
        root ? std::span<const float>(whole_state->buffers.at(b).second) : std::span<const float>(),
        shard.buffers[b].second);
  }
  optimizer.load_state(shard);
}

// Collective: each buffer of every shard's optimizer state, gathered whole on rank 0 and handed to its
// `visit` before the next is gathered.
void visit_shards(ShardedExchange& exchange, const optim::Optimizer& optimizer,
                  const StateBufferVisitor& visit) {
  const bool root = exchange.rank() == 0;
  std::vector<float> full(root ? exchange.total() : 0);
  optimizer.visit_state([&](const std::string& name, std::span<const float> shard) {
    exchange.gather_to_root(shard, full);
    if (root) visit(name, full);
  });
}

// Whether the sync exchange should move the region's rows rather than the region. Per rank and step the
// dense collectives move about 2 (N - 1) / N of the region; the rows move twice what the rank's batch reads
// (pushed, then fetched) in two more rounds of messages. Rows are chosen where that is at most half the
// bytes even if every token of a batch is another row (the IMDB shapes: 2,560 tokens of 20,000 rows), so
// that the saving outweighs the rounds' latency; the quickstart's batches read most of its 2,000 rows.
bool rows_worth_fetching(const PsOptions& options, int ranks) {
  const RowRegion& region = options.sparse_exchange_rows;
  if (region.empty() || options.rows_read_per_step == 0 || ranks < 2) return false;
  const auto n = static_cast<std::size_t>(ranks);
  return 2 * options.rows_read_per_step * n <= region.rows * (n - 1);
}

// Sync mode: a step is a reduce-scatter, the owner's update, an all-gather.
class ColocatedService final : public ParameterService {
 public:
  ColocatedService(MPI_Comm world, const PsOptions& options, std::size_t total,
                   const ShardOptimizerFactory& make_optimizer)
      : options_(options),
        exchange_(world, total, options.wire, ExchangeNodes{options.hierarchy, options.test_node}),
        trainers_(world),
        world_(world),
        optimizer_(make_optimizer(exchange_.shard_size())),
        row_sparse_(rows_worth_fetching(options, exchange_.size())) {}

  HostGroup& trainers() override { return trainers_; }
  std::string describe() const override {
    std::string line = exchange_.hierarchy_line();
    if (row_sparse_)
      line +=
          (line.empty() ? "" : "; ") + std::string("embedding rows pushed and fetched as batches use them");
    return line;
  }
  bool exchange_has_deadlines() const override { return false; }

  void distribute_start(std::span<float> params, const OptimizerState* whole_state) override {
    distribute_shards(exchange_, *optimizer_, params, whole_state);
  }

  std::vector<std::string> server_lines() const override { return {}; }

  void begin_steps() override {}

  // With a row-sparse region (the embedding) the step moves rows, not the region: each rank pushes each owner
  // the rows its batch touched (the gradient is zero elsewhere), and receives after the update only the
  // shards outside the region. Adam moves every row of the region each step (its moments decay), so the
  // other ranks' copies of a row are stale until prepare_step fetches it for a batch that reads it, or
  // end_steps gathers the whole vector.
  void prepare_step(std::span<const int32_t> tokens, std::span<float> params) override {
    if (!rows_stale_) return;
    timeline::Span span("fetch rows");
    rows_read_.assign(tokens.begin(), tokens.end());
    std::sort(rows_read_.begin(), rows_read_.end());
    rows_read_.erase(std::unique(rows_read_.begin(), rows_read_.end()), rows_read_.end());
    exchange_.fetch_rows(params, options_.sparse_exchange_rows, rows_read_);
  }

  void exchange(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                std::span<float> params) override {
    const RowRegion& region = options_.sparse_exchange_rows;
    const bool row_sparse = row_sparse_ && touched_rows != nullptr;
    timeline::Span span(row_sparse ? "push rows, update, all-gather" : "reduce-scatter, update, all-gather");
    const std::span<float> shard = params.subspan(exchange_.begin(), exchange_.shard_size());
    // A 16-bit wire: the all-gather sends the owner's update, rounded (ShardedExchange::all_gather_update).
    if (options_.wire != WireFormat::kFloat) before_update_.assign(shard.begin(), shard.end());
    if (row_sparse) {
      const std::span<const GradientPiece> pieces =
          exchange_.reduce_scatter_average_rows(grads, region, *touched_rows);
      const float scale = clipping([&] {
        // One running sum over the pieces in order: the dense sum's bits (its zeros add nothing).
        double squares = 0;
        for (const GradientPiece& piece : pieces) squares = add_squares(squares, piece.values);
        return squares;
      });
      optimizer_->step_pieces(shard, pieces, scale);
      exchange_.all_gather_update(params, region, before_update_);
    } else {
      shard_grads_.resize(exchange_.shard_size());  // on first use: the row exchange has its own
      exchange_.reduce_scatter_average(grads, shard_grads_);
      optimizer_->step(shard, shard_grads_, nullptr, clipping([&] { return add_squares(0, shard_grads_); }));
      exchange_.all_gather_update(params, RowRegion{}, before_update_);
    }
    rows_stale_ = row_sparse;
  }

  // The scale that clips the averaged gradient (1: train.clip_norm is off), from this owner's sum of its
  // shard's squares (`shard_squares()`): the whole gradient's squared norm is every owner's, added up over
  // the ranks.
  template <typename ShardSquares>
  float clipping(const ShardSquares& shard_squares) {
    if (options_.clip_norm <= 0) return 1.0f;
    double squares = shard_squares();
    DDP_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &squares, 1, MPI_DOUBLE, MPI_SUM, world_));
    return clipping_scale(squares, options_.clip_norm);
  }

  static double add_squares(double squares, std::span<const float> values) {
    for (const float g : values) squares += static_cast<double>(g) * g;
    return squares;
  }

  void finish_pushes() override {}  // every exchange was a collective, done by now

  void end_steps(std::span<float> params) override {
    if (rows_stale_) exchange_.all_gather(params);
    rows_stale_ = false;
  }

  int64_t state_iterations() const override { return optimizer_->iterations(); }
  void visit_state(const StateBufferVisitor& visit) override { visit_shards(exchange_, *optimizer_, visit); }

  void finish(std::span<const float> /*params*/) override {}

 private:
  PsOptions options_;
  ShardedExchange exchange_;
  HostGroup trainers_;
  MPI_Comm world_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::vector<float> shard_grads_;
  std::vector<float> before_update_;  // a 16-bit wire: this rank's shard before the step's update
  bool row_sparse_;                   // the region's rows are exchanged, not the region
  std::vector<int32_t> rows_read_;    // the step's rows, sorted and unique
  bool rows_stale_ = false;  // rows of the region other ranks own may be behind their owners' (row-sparse)
};

// Async mode: every rank's client pushes each shard's gradient to its owner's server thread, which applies
// it at once and replies with its shard, a rank at most max_staleness pushes ahead of the slowest
// (ps_protocol.h). Between runs of steps the threads are joined and the shards all-gathered.
class AsyncColocatedService final : public ParameterService {
 public:
  AsyncColocatedService(MPI_Comm world, const PsOptions& options, std::size_t total,
                        const ShardOptimizerFactory& make_optimizer)
      : exchange_(world, total),
        trainers_(world),
        world_(world),
        options_(options),
        total_(total),
        optimizer_(make_optimizer(exchange_.shard_size())),
        shard_(exchange_.shard_size()) {
    connect_every_pair(world_);
  }

  ~AsyncColocatedService() override {
    // The trainer ends every run of steps it begins; a run cut short ends the job before this (fatal).
    if (server_.joinable()) DDP_FATAL("the colocated parameter server's run of steps did not end");
  }

  HostGroup& trainers() override { return trainers_; }
  std::string describe() const override { return describe_mode(options_, "rank"); }

  bool exchange_has_deadlines() const override { return true; }

  void distribute_start(std::span<float> params, const OptimizerState* whole_state) override {
    distribute_shards(exchange_, *optimizer_, params, whole_state);
    copy_shard_out(params);
  }

  std::vector<std::string> server_lines() const override { return {}; }

  void begin_steps() override {
    channels_ = std::make_unique<PsChannels>(world_, true, options_.timeout_s,
                                             "rank " + std::to_string(exchange_.rank()));
    server_ = std::thread([this] {
      try {
        const ShardUpdate update = [this](std::span<float> params, std::span<const float> grads) {
          timeline::Span span("server update");
          optimizer_->step(params, grads);
        };
        run_parameter_server(*channels_, options_, total_, shard_, update);
      } catch (const std::exception& e) {
        DDP_FATAL(std::string("the parameter server's thread: ") + e.what());
      }
    });
    client_ = std::make_unique<ParameterClient>(*channels_, options_, total_);
  }

  void exchange(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                std::span<float> params) override {
    timeline::Span span("push/pull");
    client_->push_pull(grads, touched_rows, params);
  }

  void finish_pushes() override {
    if (!client_) return;
    client_->finish();
    client_.reset();
    server_.join();
    channels_.reset();
  }

  // Every rank continues from the servers' shards, gathered.
  void end_steps(std::span<float> params) override {
    finish_pushes();
    std::copy(shard_.begin(), shard_.end(), params.begin() + static_cast<std::ptrdiff_t>(exchange_.begin()));
    exchange_.all_gather(params);
  }

  int64_t state_iterations() const override { return optimizer_->iterations(); }
  void visit_state(const StateBufferVisitor& visit) override { visit_shards(exchange_, *optimizer_, visit); }
  void finish(std::span<const float> /*params*/) override {}

 private:
  void copy_shard_out(std::span<const float> params) {
    const auto begin = params.begin() + static_cast<std::ptrdiff_t>(exchange_.begin());
    std::copy(begin, begin + static_cast<std::ptrdiff_t>(shard_.size()), shard_.begin());
  }

  ShardedExchange exchange_;
  HostGroup trainers_;
  MPI_Comm world_;
  PsOptions options_;
  std::size_t total_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // stepped by the server thread only
  std::vector<float> shard_;                     // this rank's shard as its server holds it
  std::unique_ptr<PsChannels> channels_;         // during a run of steps
  std::unique_ptr<ParameterClient> client_;
  std::thread server_;
};

}  // namespace

std::unique_ptr<ParameterService> make_colocated_service(MPI_Comm world, const PsOptions& options,
                                                         std::size_t total,
                                                         const ShardOptimizerFactory& make_optimizer) {
  if (!options.async) return std::make_unique<ColocatedService>(world, options, total, make_optimizer);
  if (options.clip_norm > 0) {
    throw UserError(
        "train.clip_norm with comm.ps_mode = async: an async server applies each worker's "
        "gradient as it comes, there is no averaged gradient to clip (use sync or all-reduce)");
  }
  if (!mpi_thread_multiple()) {
    throw UserError(
        "comm.ps_servers = 0 with comm.ps_mode = async runs a server thread beside training, which needs an "
        "MPI with MPI_THREAD_MULTIPLE; this one has less (use comm.ps_servers >= 1)");
  }
  return std::make_unique<AsyncColocatedService>(world, options, total, make_optimizer);
}

}  // namespace ddp::comm

// The dedicated layout of the parameter server (ps_service.h): the last K ranks serve, the first W
// train. Within a run of steps the protocol of ps_protocol.h; around it, rank 0's point-to-point
// control of each server:
//
//   rank 0 -> server   control {kStart, has_state, iterations}, the parameter shard, each optimizer buffer's
//                      shard (if has_state)
//   server -> rank 0   its start-up line
//   per run of steps:
//   rank 0 -> server   control {kRun}
//   server -> rank 0   an acknowledgement (a control message is sent at once even to a stopped rank: the
//                      acknowledgement names a server that never starts); then every rank runs
//                      ps_protocol.h's protocol
//   server -> rank 0   its update count, parameter shard and optimizer buffers' shards
//   at the end:
//   rank 0 -> server   control {kNoMore}, the final parameters (the whole vector)
//   or, if the trainers fail before the end, control {kAbandon}.
//
// Every wait polls against a deadline (poller.h) and ends the job naming the rank waited for.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <utility>
#include <vector>

#include "comm/mpi_check.h"
#include "comm/poller.h"
#include "comm/ps_service.h"
#include "engine/base/errors.h"
#include "engine/base/gradient_clipping.h"
#include "engine/base/running_clock.h"
#include "engine/base/slow_storage.h"
#include "engine/base/timeline.h"

namespace ddp::comm {
namespace {

// Deadlines on the running clock: a job stopped and continued has no rank to blame for that time.
using Clock = RunningClock;

enum class Control : int64_t { kStart = 1, kRun = 2, kNoMore = 3, kAbandon = 4 };
using ControlMessage = std::array<int64_t, 3>;  // {Control, has_state, iterations}

// Tags on the control communicator; an optimizer buffer's shard travels with kTagBuffer + its index.
constexpr int kTagControl = 1;
constexpr int kTagParams = 2;
constexpr int kTagLine = 3;
constexpr int kTagIterations = 4;
constexpr int kTagFinal = 5;
constexpr int kTagSquares = 6;  // server to server: a sync step's shard of the squared gradient norm
constexpr int kTagRunning = 7;  // server to rank 0: a run of steps begins
constexpr int kTagBuffer = 16;

constexpr int kMaxLine = 1024;  // bytes of a server's start-up line

int count_of(std::size_t n) {
  return static_cast<int>(n);
}

float* data_or_null(std::span<float> v) {
  return v.empty() ? nullptr : v.data();
}

// The ranks of the servers, for messages.
std::string server_ranks(const PsRoles& roles) {
  const int first = roles.server_rank(0);
  const int last = roles.server_rank(roles.servers - 1);
  return first == last ? "rank " + std::to_string(first)
                       : "ranks " + std::to_string(first) + "-" + std::to_string(last);
}

// What both sides share: the roles, the control communicator, the deadline-checked wait.
class DedicatedLayout {
 public:
  DedicatedLayout(MPI_Comm world, const PsOptions& options, std::size_t total)
      : options_(options), total_(total) {
    int size = 0;
    DDP_CHECK_MPI(MPI_Comm_size(world, &size));
    DDP_CHECK_MPI(MPI_Comm_rank(world, &rank_));
    roles_ = PsRoles::make(size, options.servers);
    // Counts of MPI's point-to-point calls are ints.
    if (total > static_cast<std::size_t>(INT_MAX)) {
      throw UserError("comm.backend = ps: the model's " + std::to_string(total) +
                      " parameters exceed what one MPI message can address; use comm.backend = mpi");
    }
    DDP_CHECK_MPI(MPI_Comm_dup(world, &control_));
    DDP_CHECK_MPI(MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN));
  }
  ~DedicatedLayout() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&control_);
  }
  DedicatedLayout(const DedicatedLayout&) = delete;
  DedicatedLayout& operator=(const DedicatedLayout&) = delete;

  bool serves() const { return roles_.is_server(rank_); }
  std::string me() const {
    return (serves() ? "parameter server (rank " : "worker (rank ") + std::to_string(rank_) + ")";
  }
  std::size_t shard_begin(int server) const { return roles_.shard_begin(server, total_); }
  std::size_t shard_size(int server) const {
    return roles_.shard_end(server, total_) - roles_.shard_begin(server, total_);
  }

  // Completes `requests` or, after `timeouts` x timeout_s (and `extra_s`), ends the job naming `what` was
  // waited for.
  void wait(std::vector<MPI_Request>& requests, const std::string& what, int timeouts = 1,
            double extra_s = 0) const {
    const double limit = options_.timeout_s * timeouts + extra_s;
    wait_or_fatal(requests, Clock::now(), limit,
                  [&] { return fmt::format("{} waited {} s for {}: rank lost?", me(), limit, what); });
  }

  void send(const void* data, int count, MPI_Datatype type, int to, int tag,
            std::vector<MPI_Request>& requests) {
    requests.push_back(MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Isend(data, count, type, to, tag, control_, &requests.back()));
  }
  void receive(void* data, int count, MPI_Datatype type, int from, int tag,
               std::vector<MPI_Request>& requests) {
    requests.push_back(MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Irecv(data, count, type, from, tag, control_, &requests.back()));
  }

  PsOptions options_;
  std::size_t total_;
  PsRoles roles_;
  int rank_ = 0;
  MPI_Comm control_ = MPI_COMM_NULL;
};

// --- A training rank ---------------------------------------------------------------------------------------

class DedicatedService final : public ParameterService {
 public:
  DedicatedService(std::unique_ptr<DedicatedLayout> layout, const ShardOptimizerFactory& make_optimizer)
      : layout_(std::move(layout)),
        root_(layout_->rank_ == 0),
        // The buffers' names; their sizes do not matter here.
        state_names_(make_optimizer(0)->state()) {
    MPI_Comm split = MPI_COMM_NULL;
    DDP_CHECK_MPI(MPI_Comm_split(layout_->control_, 0, layout_->rank_, &split));
    workers_comm_ = split;
    DDP_CHECK_MPI(MPI_Comm_set_errhandler(workers_comm_, MPI_ERRORS_RETURN));
    workers_ = std::make_unique<HostGroup>(workers_comm_);
  }

  ~DedicatedService() override {
    if (root_ && !finished_) abandon();
    workers_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&workers_comm_);
  }

  HostGroup& trainers() override { return *workers_; }
  bool exchange_has_deadlines() const override { return true; }

  std::string describe() const override { return describe_mode(layout_->options_, "worker"); }

  void distribute_start(std::span<float> params, const OptimizerState* whole_state) override {
    broadcast_among_workers(params, "rank 0 to hand out the starting point");
    if (!root_) return;
    const PsRoles& roles = layout_->roles_;
    const bool has_state = whole_state != nullptr;
    const ControlMessage start{static_cast<int64_t>(Control::kStart), has_state ? 1 : 0,
                               has_state ? whole_state->iterations : 0};
    std::vector<MPI_Request> requests;
    lines_.assign(static_cast<std::size_t>(roles.servers), std::string(kMaxLine, '\0'));
    for (int j = 0; j < roles.servers; ++j) {
      const int to = roles.server_rank(j);
      const std::size_t begin = layout_->shard_begin(j);
      const int count = count_of(layout_->shard_size(j));
      layout_->send(start.data(), 3, MPI_INT64_T, to, kTagControl, requests);
      layout_->send(params.data() + begin, count, MPI_FLOAT, to, kTagParams, requests);
      for (std::size_t b = 0; has_state && b < whole_state->buffers.size(); ++b) {
        layout_->send(whole_state->buffers[b].second.data() + begin, count, MPI_FLOAT, to,
                      kTagBuffer + static_cast<int>(b), requests);
      }
      layout_->receive(lines_[static_cast<std::size_t>(j)].data(), kMaxLine, MPI_CHAR, to, kTagLine,
                       requests);
    }
    layout_->wait(requests, "the parameter servers (" + server_ranks(roles) + ") to take their shards");
    for (std::string& line : lines_)
      line.resize(line.find('\0') == std::string::npos ? line.size() : line.find('\0'));
  }

  std::vector<std::string> server_lines() const override { return lines_; }

  void begin_steps() override {
    if (root_) start_servers();
    client_ = std::make_unique<ParameterClient>(layout_->control_, layout_->options_, layout_->total_);
  }

  void exchange(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                std::span<float> params) override {
    timeline::Span span("push/pull");  // this worker's exchange with the servers, the update included
    client_->push_pull(grads, touched_rows, params);
    servers_stop_signal_ = std::max(servers_stop_signal_, client_->servers_stop_signal());
  }

  int servers_stop_signal() const override { return servers_stop_signal_; }

  void finish_pushes() override {
    if (!client_) return;
    client_->finish();
    client_.reset();
  }

  void end_steps(std::span<float> params) override {
    finish_pushes();
    if (root_) receive_state(params);
    // The workers continue from (and evaluate) what the servers hold.
    broadcast_among_workers(params, "rank 0 to hand out the parameters");
  }

  int64_t state_iterations() const override { return whole_.iterations; }
  void visit_state(const StateBufferVisitor& visit) override {
    if (!root_) return;
    DDP_CHECK(whole_.buffers.size() == state_names_.buffers.size());  // after a run of steps
    for (const auto& [name, buffer] : whole_.buffers) visit(name, buffer);
  }

  void finish(std::span<const float> params) override {
    if (root_) {
      const PsRoles& roles = layout_->roles_;
      const ControlMessage no_more{static_cast<int64_t>(Control::kNoMore), 0, 0};
      std::vector<MPI_Request> requests;
      for (int j = 0; j < roles.servers; ++j) {
        layout_->send(no_more.data(), 3, MPI_INT64_T, roles.server_rank(j), kTagControl, requests);
        layout_->send(params.data(), count_of(params.size()), MPI_FLOAT, roles.server_rank(j), kTagFinal,
                      requests);
      }
      layout_->wait(requests,
                    "the parameter servers (" + server_ranks(roles) + ") to take the final parameters");
    }
    finished_ = true;
  }

 private:
  void tell_servers(Control what) {
    const PsRoles& roles = layout_->roles_;
    const ControlMessage message{static_cast<int64_t>(what), 0, 0};
    std::vector<MPI_Request> requests;
    for (int j = 0; j < roles.servers; ++j)
      layout_->send(message.data(), 3, MPI_INT64_T, roles.server_rank(j), kTagControl, requests);
    layout_->wait(requests,
                  "the parameter servers (" + server_ranks(roles) + ") to start the next run of steps");
  }

  // Rank 0: tells every server to start a run of steps and waits until each says it has, naming those that
  // do not.
  void start_servers() {
    tell_servers(Control::kRun);
    const PsRoles& roles = layout_->roles_;
    std::vector<int64_t> running(static_cast<std::size_t>(roles.servers), 0);
    std::vector<MPI_Request> requests;
    for (int j = 0; j < roles.servers; ++j) {
      layout_->receive(&running[static_cast<std::size_t>(j)], 1, MPI_INT64_T, roles.server_rank(j),
                       kTagRunning, requests);
    }
    const double limit = layout_->options_.timeout_s;
    wait_or_fatal(requests, Clock::now(), limit, [&] {
      std::vector<int> silent;
      for (int j = 0; j < roles.servers; ++j) {
        int done = 0;
        if (MPI_Test(&requests[static_cast<std::size_t>(j)], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
            !done)
          silent.push_back(roles.server_rank(j));
      }
      return fmt::format("{} waited {} s for parameter server {} to start the next run of steps: rank lost?",
                         layout_->me(), limit, rank_list(silent));
    });
  }

  // Rank 0: every server's update count, parameter shard (into `params`) and optimizer state shards.
  void receive_state(std::span<float> params) {
    const PsRoles& roles = layout_->roles_;
    whole_ = state_names_;
    for (auto& buffer : whole_.buffers) buffer.second.assign(layout_->total_, 0.0f);
    std::vector<int64_t> iterations(static_cast<std::size_t>(roles.servers), -1);
    std::vector<MPI_Request> requests;
    for (int j = 0; j < roles.servers; ++j) {
      const int from = roles.server_rank(j);
      const std::size_t begin = layout_->shard_begin(j);
      const int count = count_of(layout_->shard_size(j));
      layout_->receive(&iterations[static_cast<std::size_t>(j)], 1, MPI_INT64_T, from, kTagIterations,
                       requests);
      layout_->receive(params.data() + begin, count, MPI_FLOAT, from, kTagParams, requests);
      for (std::size_t b = 0; b < whole_.buffers.size(); ++b) {
        layout_->receive(whole_.buffers[b].second.data() + begin, count, MPI_FLOAT, from,
                         kTagBuffer + static_cast<int>(b), requests);
      }
    }
    layout_->wait(requests, "the parameter servers (" + server_ranks(roles) + ") to hand in their shards");
    whole_.iterations = iterations[0];
    for (int j = 1; j < roles.servers; ++j) {
      if (iterations[static_cast<std::size_t>(j)] != whole_.iterations) {
        DDP_FATAL("parameter server rank " + std::to_string(roles.server_rank(j)) + " applied " +
                  std::to_string(iterations[static_cast<std::size_t>(j)]) +
                  " updates but parameter server rank " + std::to_string(roles.server_rank(0)) + " applied " +
                  std::to_string(whole_.iterations));
      }
    }
  }

  void broadcast_among_workers(std::span<float> params, const std::string& what) {
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    DDP_CHECK_MPI(
        MPI_Ibcast(params.data(), count_of(params.size()), MPI_FLOAT, 0, workers_comm_, requests.data()));
    layout_->wait(requests, what);
  }

  // On the way out of a failed run: tells every server that no more is coming, without waiting long (a
  // server may be gone, or busy in a run of steps that the failure cut short; then the launcher ends it).
  void abandon() {
    const PsRoles& roles = layout_->roles_;
    // Static: a send still pending when this returns keeps its buffer.
    static const ControlMessage message{static_cast<int64_t>(Control::kAbandon), 0, 0};
    std::vector<MPI_Request> requests(static_cast<std::size_t>(roles.servers), MPI_REQUEST_NULL);
    for (int j = 0; j < roles.servers; ++j) {
      if (MPI_Isend(message.data(), 3, MPI_INT64_T, roles.server_rank(j), kTagControl, layout_->control_,
                    &requests[static_cast<std::size_t>(j)]) != MPI_SUCCESS)
        return;
    }
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    Poller poller;
    int done = 0;
    while (MPI_Testall(count_of(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE) ==
               MPI_SUCCESS &&
           !done && Clock::now() < deadline) {
      poller.idle();
    }
  }

  std::unique_ptr<DedicatedLayout> layout_;
  bool root_;
  OptimizerState state_names_;  // the optimizer's buffers, empty
  MPI_Comm workers_comm_ = MPI_COMM_NULL;
  std::unique_ptr<HostGroup> workers_;
  std::unique_ptr<ParameterClient> client_;
  int servers_stop_signal_ = 0;
  std::vector<std::string> lines_;  // rank 0: the servers' start-up lines
  OptimizerState whole_;            // rank 0: the servers' state at the end of the last run of steps
  bool finished_ = false;
};

// --- A server ----------------------------------------------------------------------------------------------

class DedicatedServerRun final : public DedicatedServer {
 public:
  DedicatedServerRun(std::unique_ptr<DedicatedLayout> layout, const ShardOptimizerFactory& make_optimizer,
                     std::string line)
      : layout_(std::move(layout)),
        index_(layout_->roles_.server_index(layout_->rank_)),
        begin_(layout_->shard_begin(index_)),
        shard_(layout_->shard_size(index_)),
        optimizer_(make_optimizer(shard_.size())),
        line_(std::move(line)) {
    // The workers' communicator is split off collectively: a server takes part with no color.
    MPI_Comm none = MPI_COMM_NULL;
    DDP_CHECK_MPI(MPI_Comm_split(layout_->control_, MPI_UNDEFINED, layout_->rank_, &none));
  }

  std::vector<float> serve() override {
    // Resuming, rank 0 reads the parameters and at most two optimizer buffers of their size.
    ControlMessage message = wait_for_control("rank 0 to hand out the starting point", kStartupTimeouts,
                                              slowest_storage_seconds(3 * layout_->total_ * sizeof(float)));
    if (message[0] != static_cast<int64_t>(Control::kStart)) unexpected(message, "the start");
    receive_start(message[1] != 0, message[2]);
    const ShardUpdate update = [&](std::span<float> params, std::span<const float> grads) {
      const float scale = clipping_scale_of(grads);
      timeline::Span span("server update");
      optimizer_->step(params, grads, nullptr, scale);
    };
    for (;;) {
      // Rank 0 comes once every worker is through the epoch's sums, evaluation and checkpoint: the rank that
      // is hung may be another worker, whom rank 0 waits for.
      // Rank 0 may be writing last.h5 and best.h5: the parameters and at most two optimizer buffers of their
      // size (Adam's moments), twice.
      message = wait_for_control(
          "rank 0 to start the next run of steps (rank 0, or a worker it waits for between runs of steps)", 1,
          slowest_storage_seconds(2 * 3 * layout_->total_ * sizeof(float)));
      if (message[0] == static_cast<int64_t>(Control::kNoMore)) break;
      if (message[0] != static_cast<int64_t>(Control::kRun)) unexpected(message, "a run of steps");
      acknowledge_run();
      const PsServerStats stats =
          run_parameter_server(layout_->control_, layout_->options_, layout_->total_, shard_, update);
      gradients_received_ += layout_->options_.async ? stats.steps : stats.steps * layout_->roles_.workers();
      gradient_bytes_ += stats.gradient_bytes;
      send_state();
    }
    std::vector<float> params(layout_->total_);
    std::vector<MPI_Request> requests;
    layout_->receive(params.data(), count_of(params.size()), MPI_FLOAT, 0, kTagFinal, requests);
    layout_->wait(requests, "rank 0 to hand out the final parameters");
    log_traffic();
    return params;
  }

  // train.clip_norm (sync): the averaged gradient's global norm from every server's shard. Each server adds
  // its shard's squares and sends them to the others; all add the K sums in server order, so every server
  // scales alike (all-reduce's norm up to the order of float sums, as the colocated servers'). All servers
  // reach the same step here: every worker pushes to each of them before it waits for a reply.
  float clipping_scale_of(std::span<const float> grads) {
    const double clip_norm = layout_->options_.clip_norm;
    if (clip_norm <= 0) return 1.0f;
    timeline::Span span("server gradient norm");
    double mine = 0;
    for (const float g : grads) mine = add_square(mine, g);
    const int servers = layout_->roles_.servers;
    std::vector<double> squares(static_cast<std::size_t>(servers), 0.0);
    squares[static_cast<std::size_t>(index_)] = mine;
    std::vector<MPI_Request> requests;
    for (int s = 0; s < servers; ++s) {
      if (s == index_) continue;
      const int other = layout_->roles_.server_rank(s);
      layout_->send(&mine, 1, MPI_DOUBLE, other, kTagSquares, requests);
      layout_->receive(&squares[static_cast<std::size_t>(s)], 1, MPI_DOUBLE, other, kTagSquares, requests);
    }
    layout_->wait(requests, "the other servers' shares of the gradient norm");
    double total = 0;
    for (const double part : squares) total += part;
    return clipping_scale(total, clip_norm);
  }

 private:
  ControlMessage wait_for_control(const std::string& what, int timeouts, double extra_s = 0) {
    ControlMessage message{};
    std::vector<MPI_Request> requests;
    layout_->receive(message.data(), 3, MPI_INT64_T, 0, kTagControl, requests);
    layout_->wait(requests, what, timeouts, extra_s);
    if (message[0] == static_cast<int64_t>(Control::kAbandon)) {
      throw ServiceAbandoned(layout_->me() + ": the training ranks ended the run (rank 0 says why)");
    }
    return message;
  }

  [[noreturn]] void unexpected(const ControlMessage& message, const std::string& expected) const {
    DDP_FATAL(layout_->me() + " got control message " + std::to_string(message[0]) +
              " from rank 0, expected " + expected);
  }

  void receive_start(bool has_state, int64_t iterations) {
    OptimizerState state = optimizer_->state();
    const int count = count_of(shard_.size());
    std::vector<MPI_Request> requests;
    layout_->receive(data_or_null(shard_), count, MPI_FLOAT, 0, kTagParams, requests);
    for (std::size_t b = 0; has_state && b < state.buffers.size(); ++b) {
      layout_->receive(data_or_null(state.buffers[b].second), count, MPI_FLOAT, 0,
                       kTagBuffer + static_cast<int>(b), requests);
    }
    const std::string line =
        fmt::format("{}: parameter server {}/{}, parameters [{}, {}) and their {} state", line_, index_ + 1,
                    layout_->roles_.servers, begin_, begin_ + shard_.size(), optimizer_->name())
            .substr(0, kMaxLine - 1);
    layout_->send(line.data(), count_of(line.size()), MPI_CHAR, 0, kTagLine, requests);
    layout_->wait(requests, "rank 0 to hand out the starting point");
    if (!has_state) return;
    state.iterations = iterations;
    optimizer_->load_state(state);
  }

  void acknowledge_run() {
    const int64_t running = 1;
    std::vector<MPI_Request> requests;
    layout_->send(&running, 1, MPI_INT64_T, 0, kTagRunning, requests);
    layout_->wait(requests, "rank 0 to hear that a run of steps begins");
  }

  void send_state() {
    const OptimizerState state = optimizer_->state();
    const int count = count_of(shard_.size());
    std::vector<MPI_Request> requests;
    layout_->send(&state.iterations, 1, MPI_INT64_T, 0, kTagIterations, requests);
    layout_->send(data_or_null(shard_), count, MPI_FLOAT, 0, kTagParams, requests);
    for (std::size_t b = 0; b < state.buffers.size(); ++b) {
      layout_->send(state.buffers[b].second.data(), count, MPI_FLOAT, 0, kTagBuffer + static_cast<int>(b),
                    requests);
    }
    layout_->wait(requests, "rank 0 to collect the shards");
  }

  // What the workers' pushes cost this server, against pushing every shard dense.
  void log_traffic() const {
    const double mb = 1e-6;
    const double dense = static_cast<double>(gradients_received_) * static_cast<double>(shard_.size()) * 4.0;
    std::printf("%s: %lld gradients received, %.1f MB (%.1f MB if dense)\n", layout_->me().c_str(),
                static_cast<long long>(gradients_received_), static_cast<double>(gradient_bytes_) * mb,
                dense * mb);
    std::fflush(stdout);
  }

  std::unique_ptr<DedicatedLayout> layout_;
  int index_;
  std::size_t begin_;
  std::vector<float> shard_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::string line_;
  int64_t gradients_received_ = 0;  // over every run of steps
  int64_t gradient_bytes_ = 0;
};

}  // namespace

ParameterServerRank join_dedicated_layout(MPI_Comm world, const PsOptions& options, std::size_t total,
                                          const ShardOptimizerFactory& make_optimizer,
                                          const std::string& server_line) {
  auto layout = std::make_unique<DedicatedLayout>(world, options, total);
  ParameterServerRank rank;
  if (layout->serves()) {
    rank.server = std::make_unique<DedicatedServerRun>(std::move(layout), make_optimizer, server_line);
  } else {
    rank.service = std::make_unique<DedicatedService>(std::move(layout), make_optimizer);
  }
  return rank;
}

}  // namespace ddp::comm

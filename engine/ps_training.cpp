// Training with the parameter server (see ps_training.h): the job's split, the workers' updater and the
// servers' run.
#include "engine/ps_training.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <sstream>

#include "comm/mpi_check.h"
#include "comm/poller.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::engine {
namespace {

using Clock = std::chrono::steady_clock;

// Messages of step 5 and 6 of the sequence: another run of steps, or none.
constexpr int64_t kAnotherRun = 1;
constexpr int64_t kNoMore = 0;

std::string seconds_text(double s) {
  std::ostringstream out;
  out << s;
  return out.str();
}

// The ranks of the servers, for messages.
std::string server_ranks(const comm::PsRoles& roles) {
  const int first = roles.server_rank(0);
  const int last = roles.server_rank(roles.servers - 1);
  return first == last ? "rank " + std::to_string(first)
                       : "ranks " + std::to_string(first) + "-" + std::to_string(last);
}

float* data_or_null(std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace

// --- The job -----------------------------------------------------------------------------------------------

PsJob::PsJob(MPI_Comm world, const Config& config, int servers, const models::ParamLayout& layout)
    : total_size_(layout.total_size()) {
  const std::size_t total_size = total_size_;
  int size = 0;
  DDP_CHECK_MPI(MPI_Comm_size(world, &size));
  DDP_CHECK_MPI(MPI_Comm_rank(world, &rank_));
  roles_ = comm::PsRoles::make(size, servers);
  // Counts and displacements of MPI_Scatterv/Gatherv are ints.
  if (total_size > static_cast<std::size_t>(INT_MAX)) {
    throw UserError("comm.backend = ps: the model's " + std::to_string(total_size) +
                    " parameters exceed what one MPI_Gatherv can address; use comm.backend = mpi");
  }
  options_.servers = servers;
  options_.async = config.comm.ps_mode == "async";
  options_.max_staleness = config.comm.max_staleness;
  options_.timeout_s = config.comm.timeout_s;
  if (config.comm.sparse_embedding) {
    const models::ParamTensor& embedding = layout.tensor("embedding");
    options_.sparse_exchange_rows = {embedding.offset, static_cast<std::size_t>(embedding.shape.at(0)),
                                     static_cast<std::size_t>(embedding.shape.at(1))};
  }

  counts_.assign(static_cast<std::size_t>(size), 0);
  offsets_.assign(static_cast<std::size_t>(size), 0);
  for (int j = 0; j < roles_.servers; ++j) {
    const auto r = static_cast<std::size_t>(roles_.server_rank(j));
    offsets_[r] = static_cast<int>(roles_.shard_begin(j, total_size));
    counts_[r] = static_cast<int>(roles_.shard_end(j, total_size) - roles_.shard_begin(j, total_size));
  }

  DDP_CHECK_MPI(MPI_Comm_dup(world, &world_));
  DDP_CHECK_MPI(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
  MPI_Comm split = MPI_COMM_NULL;
  DDP_CHECK_MPI(MPI_Comm_split(world, serves() ? 1 : 0, rank_, &split));
  if (serves()) {
    DDP_CHECK_MPI(MPI_Comm_free(&split));
  } else {
    workers_comm_ = split;
    DDP_CHECK_MPI(MPI_Comm_set_errhandler(workers_comm_, MPI_ERRORS_RETURN));
    workers_ = comm::make_mpi_communicator(workers_comm_);
  }
}

PsJob::~PsJob() {
  workers_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (workers_comm_ != MPI_COMM_NULL) MPI_Comm_free(&workers_comm_);
  MPI_Comm_free(&world_);
}

comm::Communicator& PsJob::workers() {
  DDP_CHECK(workers_ != nullptr);
  return *workers_;
}

std::string PsJob::describe_mode() const {
  std::string mode = options_.async ? "async, a worker at most " + std::to_string(options_.max_staleness) +
                                          " steps ahead of the slowest"
                                    : "sync";
  return mode + ", timeout " + seconds_text(options_.timeout_s) + " s";
}

std::string PsJob::me() const {
  return (serves() ? "parameter server (rank " : "worker (rank ") + std::to_string(rank_) + ")";
}

void PsJob::wait(std::vector<MPI_Request>& requests, const std::string& what) const {
  comm::wait_or_fatal(requests, Clock::now(), options_.timeout_s, [&] {
    return me() + " waited " + seconds_text(options_.timeout_s) + " s for " + what + ": rank lost?";
  });
}

// --- A worker ----------------------------------------------------------------------------------------------

namespace {

class PsWorkerUpdater final : public Updater {
 public:
  PsWorkerUpdater(PsJob& job, models::Replica& replica, const OptimizerSettings& settings)
      : job_(job),
        replica_(replica),
        total_(replica.layout().total_size()),
        root_(job.rank() == 0),
        state_(make_optimizer(settings, root_ ? total_ : 0)),
        on_host_(replica.device() == models::DeviceKind::kCpu),
        host_params_(total_),
        host_grads_(on_host_ ? 0 : total_) {
    DDP_CHECK(!job.serves());
  }

  Optimizer& optimizer() override { return *state_; }

  void distribute_start(std::span<float> host_params) override {
    job_.workers().broadcast(host_params, 0);
    replica_.copy_params_from_host(host_params);
    // Rank 0 sends every server its shard of the parameters and of each optimizer buffer.
    OptimizerState state = state_->state();
    std::vector<MPI_Request> requests(2 + state.buffers.size(), MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Ibcast(&state.iterations, 1, MPI_INT64_T, 0, job_.world(), &requests[0]));
    scatter(host_params.data(), requests[1]);
    for (std::size_t b = 0; b < state.buffers.size(); ++b)
      scatter(state.buffers[b].second.data(), requests[2 + b]);
    job_.wait(requests,
              root_ ? "the parameter servers (" + server_ranks(job_.roles()) + ") to take their shards"
                    : "rank 0 to hand out the starting point");
  }

  void begin_steps() override {
    int64_t message = kAnotherRun;
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Ibcast(&message, 1, MPI_INT64_T, 0, job_.world(), requests.data()));
    job_.wait(requests, "rank 0 to start the next run of steps");
    client_ = std::make_unique<comm::ParameterClient>(job_.world(), job_.options(), total_);
  }

  void step(const BatchView& batch) override {
    replica_.train_step(batch, [](const models::ParamSegment&) {});
    timeline::Span span("push/pull");  // this worker's exchange with the servers, the update included
    if (on_host_ && !job_.options().sparse_exchange_rows.empty()) {
      // The CPU replica's embedding gradient is zero outside the rows the batch touched: push only those.
      client_->push_pull(replica_.grads(), replica_.touched_embedding_rows(), replica_.params());
      return;
    }
    if (on_host_) {
      client_->push_pull(replica_.grads(), replica_.params());
      return;
    }
    replica_.copy_grads_to_host(host_grads_);
    client_->push_pull(host_grads_, host_params_);
    replica_.copy_params_from_host(host_params_);
  }

  void end_steps() override {
    client_->finish();
    client_.reset();
    // Rank 0 gathers the servers' shards: the parameters and the optimizer state as they are now.
    OptimizerState state = state_->state();
    std::vector<int64_t> iterations(root_ ? job_.roles().world_size : 0);
    int64_t none = -1;  // a worker has no optimizer state
    std::vector<MPI_Request> requests(2 + state.buffers.size(), MPI_REQUEST_NULL);
    DDP_CHECK_MPI(
        MPI_Igather(&none, 1, MPI_INT64_T, iterations.data(), 1, MPI_INT64_T, 0, job_.world(), &requests[0]));
    gather(host_params_.data(), requests[1]);
    for (std::size_t b = 0; b < state.buffers.size(); ++b)
      gather(state.buffers[b].second.data(), requests[2 + b]);
    job_.wait(requests,
              root_ ? "the parameter servers (" + server_ranks(job_.roles()) + ") to hand in their shards"
                    : "the other ranks to end the run of steps");
    if (root_) {
      const auto first_server = static_cast<std::size_t>(job_.roles().server_rank(0));
      state.iterations = iterations[first_server];
      for (std::size_t r = first_server; r < iterations.size(); ++r) {
        if (iterations[r] != state.iterations) {
          DDP_FATAL("parameter server rank " + std::to_string(r) + " applied " +
                    std::to_string(iterations[r]) + " updates but parameter server rank " +
                    std::to_string(first_server) + " applied " + std::to_string(state.iterations));
        }
      }
      state_->load_state(state);
    }
    // The workers continue from (and evaluate) what the servers hold.
    std::vector<MPI_Request> broadcast(1, MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Ibcast(host_params_.data(), static_cast<int>(total_), MPI_FLOAT, 0, job_.workers_comm(),
                             broadcast.data()));
    job_.wait(broadcast, "rank 0 to hand out the parameters");
    replica_.copy_params_from_host(host_params_);
  }

  void finish(std::span<float> host_params) override {
    int64_t message = kNoMore;
    std::vector<MPI_Request> requests(2, MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Ibcast(&message, 1, MPI_INT64_T, 0, job_.world(), &requests[0]));
    replica_.copy_params_to_host(host_params);
    DDP_CHECK_MPI(
        MPI_Ibcast(host_params.data(), static_cast<int>(total_), MPI_FLOAT, 0, job_.world(), &requests[1]));
    job_.wait(requests, "the other ranks to finish");
  }

  std::string backend() const override { return "ps"; }

 private:
  void scatter(const float* full, MPI_Request& request) {
    DDP_CHECK_MPI(MPI_Iscatterv(full, job_.shard_counts().data(), job_.shard_offsets().data(), MPI_FLOAT,
                                nullptr, 0, MPI_FLOAT, 0, job_.world(), &request));
  }
  void gather(float* full, MPI_Request& request) {
    DDP_CHECK_MPI(MPI_Igatherv(nullptr, 0, MPI_FLOAT, full, job_.shard_counts().data(),
                               job_.shard_offsets().data(), MPI_FLOAT, 0, job_.world(), &request));
  }

  PsJob& job_;
  models::Replica& replica_;
  std::size_t total_;
  bool root_;
  std::unique_ptr<Optimizer> state_;  // rank 0: the whole optimizer state, for checkpoints; else empty
  bool on_host_;                      // the replica's buffers are host memory: push and pull in place
  std::vector<float> host_params_;
  std::vector<float> host_grads_;  // a GPU replica's gradients, staged for the push
  std::unique_ptr<comm::ParameterClient> client_;
};

}  // namespace

std::unique_ptr<Updater> make_ps_worker_updater(PsJob& job, models::Replica& replica,
                                                const OptimizerSettings& settings) {
  return std::make_unique<PsWorkerUpdater>(job, replica, settings);
}

// --- A server ----------------------------------------------------------------------------------------------

PsServerRun::PsServerRun(PsJob& job, comm::Communicator& world, const Config& config,
                         const Topology& topology, ProgressWatchdog& watchdog)
    : job_(job), world_(world), topology_(topology), watchdog_(watchdog) {
  DDP_CHECK(job.serves());
  index_ = job.roles().server_index(job.rank());
  begin_ = job.roles().shard_begin(index_, job.total_size());
  shard_.resize(job.roles().shard_end(index_, job.total_size()) - begin_);
  optimizer_ = make_optimizer(optimizer_settings(config), shard_.size());
}

TrainResult PsServerRun::run() {
  watchdog_.enter("waiting for the workers' batch shapes and GPU self-checks");
  comm::agree_on_errors(world_, [] {});  // 0. the workers' devices
  watchdog_.enter("waiting for rank 0 to prepare checkpoint.dir");
  comm::agree_on_errors(world_, [] {});  // 1. the run directory
  watchdog_.enter("waiting for rank 0 to read the starting point");
  comm::agree_on_errors(world_, [] {});  // 2. the starting point
  watchdog_.pause();
  receive_start();  // 3.
  watchdog_.enter("gathering the start-up log");
  log_start();  // 4.
  watchdog_.pause();
  const comm::ShardUpdate update = [&](std::span<float> params, std::span<const float> grads) {
    timeline::Span span("server update");
    optimizer_->step(params, grads);
  };
  for (;;) {  // 5.
    int64_t message = kNoMore;
    std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
    DDP_CHECK_MPI(MPI_Ibcast(&message, 1, MPI_INT64_T, 0, job_.world(), requests.data()));
    job_.wait(requests, "rank 0 to start the next run of steps");
    if (message != kAnotherRun) break;
    const comm::PsServerStats stats =
        comm::run_parameter_server(job_.world(), job_.options(), job_.total_size(), shard_, update);
    gradients_received_ += job_.options().async ? stats.steps : stats.steps * job_.roles().workers();
    gradient_bytes_ += stats.gradient_bytes;
    send_state();
  }
  TrainResult result;  // 6. the final parameters
  result.params.resize(job_.total_size());
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  DDP_CHECK_MPI(MPI_Ibcast(result.params.data(), static_cast<int>(result.params.size()), MPI_FLOAT, 0,
                           job_.world(), requests.data()));
  job_.wait(requests, "rank 0 to hand out the final parameters");
  log_traffic();
  return result;
}

// What the workers' pushes cost this server, against pushing every shard dense.
void PsServerRun::log_traffic() const {
  const double mb = 1e-6;
  const double dense = static_cast<double>(gradients_received_) * static_cast<double>(shard_.size()) * 4.0;
  std::printf("%s: %lld gradients received, %.1f MB (%.1f MB if dense)\n", job_.me().c_str(),
              static_cast<long long>(gradients_received_), static_cast<double>(gradient_bytes_) * mb,
              dense * mb);
  std::fflush(stdout);
}

void PsServerRun::receive_start() {
  OptimizerState state = optimizer_->state();
  std::vector<MPI_Request> requests(2 + state.buffers.size(), MPI_REQUEST_NULL);
  DDP_CHECK_MPI(MPI_Ibcast(&state.iterations, 1, MPI_INT64_T, 0, job_.world(), &requests[0]));
  const int count = static_cast<int>(shard_.size());
  DDP_CHECK_MPI(MPI_Iscatterv(nullptr, nullptr, nullptr, MPI_FLOAT, data_or_null(shard_), count, MPI_FLOAT, 0,
                              job_.world(), &requests[1]));
  for (std::size_t b = 0; b < state.buffers.size(); ++b) {
    DDP_CHECK_MPI(MPI_Iscatterv(nullptr, nullptr, nullptr, MPI_FLOAT, data_or_null(state.buffers[b].second),
                                count, MPI_FLOAT, 0, job_.world(), &requests[2 + b]));
  }
  job_.wait(requests, "rank 0 to hand out the starting point");
  optimizer_->load_state(state);
}

void PsServerRun::send_state() {
  OptimizerState state = optimizer_->state();
  const int count = static_cast<int>(shard_.size());
  std::vector<MPI_Request> requests(2 + state.buffers.size(), MPI_REQUEST_NULL);
  DDP_CHECK_MPI(
      MPI_Igather(&state.iterations, 1, MPI_INT64_T, nullptr, 1, MPI_INT64_T, 0, job_.world(), &requests[0]));
  DDP_CHECK_MPI(MPI_Igatherv(data_or_null(shard_), count, MPI_FLOAT, nullptr, nullptr, nullptr, MPI_FLOAT, 0,
                             job_.world(), &requests[1]));
  for (std::size_t b = 0; b < state.buffers.size(); ++b) {
    DDP_CHECK_MPI(MPI_Igatherv(data_or_null(state.buffers[b].second), count, MPI_FLOAT, nullptr, nullptr,
                               nullptr, MPI_FLOAT, 0, job_.world(), &requests[2 + b]));
  }
  job_.wait(requests, "rank 0 to collect the shards");
}

void PsServerRun::log_start() {
  world_.gather(
      fmt::format("rank {}/{} on {} (local rank {}/{}): parameter server {}/{}, parameters [{}, {}) "
                  "and their {} state",
                  job_.rank(), job_.roles().world_size, topology_.host, topology_.local_rank,
                  topology_.local_size, index_ + 1, job_.roles().servers, begin_, begin_ + shard_.size(),
                  optimizer_->name()),
      0);
}

}  // namespace ddp::engine

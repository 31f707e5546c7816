#include "engine/colocated_updater.h"

#include <span>
#include <string>
#include <vector>

#include "comm/sharded_exchange.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::engine {
namespace {

class ColocatedUpdater final : public Updater {
 public:
  ColocatedUpdater(models::Replica& replica, MPI_Comm trainers, const OptimizerSettings& settings)
      : replica_(replica),
        exchange_(trainers, replica.layout().total_size()),
        root_(exchange_.rank() == 0),
        state_(make_optimizer(settings, root_ ? replica.layout().total_size() : 0)),
        shard_optimizer_(make_optimizer(settings, exchange_.shard_size())),
        shard_grads_(exchange_.shard_size()) {}

  // Rank 0's whole state for checkpoints (it never steps); the other ranks' is empty.
  Optimizer& optimizer() override { return *state_; }

  void distribute_start(std::span<float> host_params) override {
    exchange_.broadcast(host_params);
    replica_.copy_params_from_host(host_params);
    // Each rank takes its shard of rank 0's optimizer state.
    const OptimizerState whole = state_->state();
    OptimizerState shard = shard_optimizer_->state();
    shard.iterations = exchange_.broadcast(whole.iterations);
    for (std::size_t b = 0; b < shard.buffers.size(); ++b) {
      exchange_.scatter_from_root(
          root_ ? std::span<const float>(whole.buffers[b].second) : std::span<const float>(),
          shard.buffers[b].second);
    }
    shard_optimizer_->load_state(shard);
  }

  void begin_steps() override {}

  void step(const BatchView& batch) override {
    replica_.train_step(batch, {});
    timeline::Span span("reduce-scatter, update, all-gather");
    exchange_.reduce_scatter_average(replica_.grads(), shard_grads_);
    const std::span<float> params = replica_.params();
    shard_optimizer_->step(params.subspan(exchange_.begin(), exchange_.shard_size()), shard_grads_);
    exchange_.all_gather(params);
  }

  // Rank 0 gathers every shard's optimizer state, as a checkpoint written now holds it.
  void end_steps() override {
    const OptimizerState shard = shard_optimizer_->state();
    OptimizerState whole = state_->state();
    for (std::size_t b = 0; b < shard.buffers.size(); ++b) {
      exchange_.gather_to_root(shard.buffers[b].second,
                               root_ ? std::span<float>(whole.buffers[b].second) : std::span<float>());
    }
    if (root_) {
      whole.iterations = shard.iterations;
      state_->load_state(whole);
    }
  }

  void finish(std::span<float> host_params) override { replica_.copy_params_to_host(host_params); }
  std::string backend() const override { return "ps"; }

 private:
  models::Replica& replica_;
  comm::ShardedExchange exchange_;
  bool root_;
  std::unique_ptr<Optimizer> state_;            // rank 0: the whole state, for checkpoints
  std::unique_ptr<Optimizer> shard_optimizer_;  // this rank's shard
  std::vector<float> shard_grads_;
};

}  // namespace

std::unique_ptr<Updater> make_colocated_updater(models::Replica& replica, MPI_Comm trainers,
                                                const OptimizerSettings& settings) {
  if (replica.device() != models::DeviceKind::kCpu) {
    throw UserError(
        "comm.ps_servers = 0: a rank's replica is on a GPU; the colocated parameter server serves CPU "
        "replicas");
  }
  if (settings.lazy_update) {
    throw UserError("comm.ps_servers = 0: train.embedding_update = lazy needs an all-reduce backend");
  }
  return std::make_unique<ColocatedUpdater>(replica, trainers, settings);
}

}  // namespace ddp::engine

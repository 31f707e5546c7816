// The colocated layout of the parameter server (parameter_service.h): every rank trains and serves one
// shard, sync mode, over the collectives of sharded_exchange.h.
#include <utility>

#include "comm/parameter_service.h"
#include "comm/sharded_exchange.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::comm {
namespace {

class ColocatedService final : public ParameterService {
 public:
  ColocatedService(MPI_Comm world, std::size_t total, const ShardOptimizerFactory& make_optimizer)
      : exchange_(world, total),
        trainers_(make_mpi_communicator(world)),
        world_(world),
        optimizer_(make_optimizer(exchange_.shard_size())),
        shard_grads_(exchange_.shard_size()) {}

  Communicator& trainers() override { return *trainers_; }
  MPI_Comm trainers_comm() const override { return world_; }
  std::string describe() const override { return ""; }  // the backend line says it all

  void distribute_start(std::span<float> params, const OptimizerState* whole_state) override {
    exchange_.broadcast(params);
    const bool root = exchange_.rank() == 0;
    // Whether rank 0 hands out a state at all: else every shard keeps its zero state.
    const bool has_state = exchange_.broadcast(root && whole_state != nullptr ? 1 : 0) != 0;
    if (!has_state) return;
    OptimizerState shard = optimizer_->state();
    shard.iterations = exchange_.broadcast(root ? whole_state->iterations : 0);
    for (std::size_t b = 0; b < shard.buffers.size(); ++b) {
      exchange_.scatter_from_root(
          root ? std::span<const float>(whole_state->buffers.at(b).second) : std::span<const float>(),
          shard.buffers[b].second);
    }
    optimizer_->load_state(shard);
  }

  std::vector<std::string> server_lines() const override { return {}; }

  void begin_steps() override {}

  // The embedding's touched rows do not narrow the exchange: the optimizer moves every row's parameters
  // (Adam's moments decay densely), so the all-gather carries every row anyway.
  void exchange(std::span<const float> grads, const std::span<const int32_t>* /*touched_rows*/,
                std::span<float> params) override {
    timeline::Span span("reduce-scatter, update, all-gather");
    exchange_.reduce_scatter_average(grads, shard_grads_);
    optimizer_->step(params.subspan(exchange_.begin(), exchange_.shard_size()), shard_grads_);
    exchange_.all_gather(params);
  }

  void end_steps(std::span<float> /*params*/) override {}  // every rank already holds every shard

  OptimizerState gather_state() override {
    const bool root = exchange_.rank() == 0;
    OptimizerState shard = optimizer_->state();
    OptimizerState whole;
    whole.iterations = shard.iterations;
    for (auto& [name, buffer] : shard.buffers) {
      std::vector<float> full(root ? total() : 0);
      exchange_.gather_to_root(buffer, full);
      if (root) whole.buffers.emplace_back(name, std::move(full));
    }
    return root ? whole : OptimizerState{};
  }

  void finish(std::span<const float> /*params*/) override {}

 private:
  std::size_t total() const { return exchange_.end(exchange_.size() - 1); }

  ShardedExchange exchange_;
  std::unique_ptr<Communicator> trainers_;
  MPI_Comm world_;
  std::unique_ptr<ShardOptimizer> optimizer_;
  std::vector<float> shard_grads_;
};

}  // namespace

std::unique_ptr<ParameterService> make_colocated_service(MPI_Comm world, const PsOptions& options,
                                                         std::size_t total,
                                                         const ShardOptimizerFactory& make_optimizer) {
  if (options.async) {
    throw UserError(
        "comm.ps_servers = 0 serves sync mode only; comm.ps_mode = async needs dedicated servers");
  }
  return std::make_unique<ColocatedService>(world, total, make_optimizer);
}

}  // namespace ddp::comm

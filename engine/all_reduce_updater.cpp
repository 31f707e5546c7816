#include "engine/all_reduce_updater.h"

#include <utility>
#include <vector>

#include "engine/all_reduce_step.h"

namespace ddp::engine {
namespace {

// The all-reduce backends: gradients averaged over every rank, then every rank's own optimizer.
class AllReduceUpdater final : public Updater {
 public:
  AllReduceUpdater(models::Replica& replica, comm::HostGroup& trainers, comm::GradientReducer& reducer,
                   std::unique_ptr<optim::Optimizer> optimizer, bool sparse_exchange, double clip_norm,
                   bool delayed, bool gpu_job, bool skip_nonfinite, bool cuda_graphs)
      : replica_(replica),
        comm_(trainers),
        reducer_(reducer),
        optimizer_(std::move(optimizer)),
        step_(replica, reducer, *optimizer_, sparse_exchange, clip_norm, delayed, gpu_job, skip_nonfinite,
              cuda_graphs) {}

  std::string optimizer_name() const override { return optimizer_->name(); }

  void distribute_start(std::span<float> host_params, const OptimizerState* whole_state) override {
    comm_.broadcast(host_params, 0);
    replica_.copy_params_from_host(host_params);
    if (comm_.rank() == 0 && whole_state != nullptr) optimizer_->load_state(*whole_state);
    OptimizerState state = optimizer_->state();
    std::vector<double> iterations{static_cast<double>(state.iterations)};
    comm_.broadcast(std::span<double>(iterations), 0);
    state.iterations = static_cast<int64_t>(iterations[0]);
    for (auto& [name, buffer] : state.buffers) comm_.broadcast(std::span<float>(buffer), 0);
    optimizer_->load_state(state);
  }

  void begin_steps() override {}
  void step(const BatchView& batch) override { step_.run(batch); }
  void end_steps() override { step_.flush(); }  // the delayed exchange's last gradient
  int64_t optimizer_iterations() const override { return optimizer_->iterations(); }
  void visit_optimizer_state(const StateBufferVisitor& visit) override {
    if (comm_.rank() == 0) optimizer_->visit_state(visit);
  }
  void finish(std::span<float> host_params) override { replica_.copy_params_to_host(host_params); }
  std::string backend() const override { return reducer_.backend(); }
  std::string step_note() const override { return step_.graph_note(); }
  bool steps_from_graphs() const override { return step_.uses_graphs(); }
  void release_step_graphs() noexcept override { step_.release_graphs(); }
  comm::GradientReducer* gradient_reducer() override { return &reducer_; }

 private:
  models::Replica& replica_;
  comm::HostGroup& comm_;
  comm::GradientReducer& reducer_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  AllReduceStep step_;
};

// `gpu`: the replica's GPU, when it runs on one.
std::unique_ptr<optim::Optimizer> make_optimizer_for(models::Replica& replica, int gpu,
                                                     const optim::OptimizerSettings& s) {
  const std::size_t size = replica.layout().total_size();
  return replica.device() == models::DeviceKind::kCuda
             ? optim::make_cuda_optimizer(s, size, gpu, replica.stream())
             : optim::make_optimizer(s, size);
}

}  // namespace

std::unique_ptr<Updater> make_all_reduce_updater(models::Replica& replica, int gpu, comm::HostGroup& trainers,
                                                 comm::GradientReducer& reducer,
                                                 const optim::OptimizerSettings& settings,
                                                 bool sparse_exchange, bool delayed, bool gpu_job,
                                                 bool skip_nonfinite, bool cuda_graphs) {
  return std::make_unique<AllReduceUpdater>(
      replica, trainers, reducer, make_optimizer_for(replica, gpu, settings), sparse_exchange,
      settings.clip_norm, delayed, gpu_job, skip_nonfinite, cuda_graphs);
}

}  // namespace ddp::engine

#include "engine/ps_updater.h"

#include <span>
#include <utility>
#include <vector>

#include "engine/base/errors.h"

namespace ddp::engine {
namespace {

class ParameterServerUpdater final : public Updater {
 public:
  ParameterServerUpdater(models::Replica& replica, comm::ParameterService& service,
                         const optim::OptimizerSettings& settings)
      : replica_(replica),
        service_(&service),
        optimizer_name_(settings.name),
        on_host_(replica.device() == models::DeviceKind::kCpu),
        host_params_(on_host_ ? 0 : replica.layout().total_size()),
        host_grads_(on_host_ ? 0 : replica.layout().total_size()) {}

  std::string optimizer_name() const override { return optimizer_name_; }

  void distribute_start(std::span<float> host_params, const OptimizerState* whole_state) override {
    service_->distribute_start(host_params, whole_state);
    replica_.copy_params_from_host(host_params);
  }

  void begin_steps() override { service_->begin_steps(); }

  void step(const BatchView& batch) override {
    if (on_host_) {
      // The embedding rows the forward pass reads: the batch's tokens.
      service_->prepare_step(std::span<const int32_t>(batch.tokens, static_cast<std::size_t>(batch.batch) *
                                                                        static_cast<std::size_t>(batch.seq)),
                             replica_.params());
    }
    replica_.train_step(batch, {});
    if (on_host_) {
      // The CPU replica's embedding gradient is zero outside the rows the batch touched.
      const std::span<const int32_t> touched = replica_.touched_embedding_rows();
      service_->exchange(replica_.grads(), &touched, replica_.params());
      return;
    }
    replica_.copy_grads_to_host(host_grads_);
    service_->exchange(host_grads_, nullptr, host_params_);
    replica_.copy_params_from_host(host_params_);
  }

  void finish_pushes() override { service_->finish_pushes(); }

  void end_steps() override {
    if (on_host_) {
      service_->end_steps(replica_.params());
      return;
    }
    service_->end_steps(host_params_);
    replica_.copy_params_from_host(host_params_);
  }

  int64_t optimizer_iterations() const override { return service_->state_iterations(); }
  void visit_optimizer_state(const StateBufferVisitor& visit) override { service_->visit_state(visit); }

  void finish(std::span<float> host_params) override {
    replica_.copy_params_to_host(host_params);
    service_->finish(host_params);
  }

  bool exchange_has_deadlines() const override { return service_->exchange_has_deadlines(); }

  std::string backend() const override { return "ps"; }
  std::vector<std::string> server_lines() const override { return service_->server_lines(); }
  int servers_stop_signal() const override { return service_->servers_stop_signal(); }

 private:
  models::Replica& replica_;
  comm::ParameterService* service_;
  std::string optimizer_name_;
  bool on_host_;                    // the replica's buffers are host memory: exchanged in place
  std::vector<float> host_params_;  // a GPU replica's, staged
  std::vector<float> host_grads_;
};

}  // namespace

comm::ShardOptimizerFactory shard_optimizers(const optim::OptimizerSettings& settings) {
  return [settings](std::size_t size) { return optim::make_optimizer(settings, size); };
}

void exchange_embedding_rows(comm::PsOptions& options, const models::ParamLayout& layout, int batch,
                             int seq) {
  const models::ParamTensor& embedding = layout.tensor("embedding");
  options.sparse_exchange_rows = {embedding.offset, static_cast<std::size_t>(embedding.shape.at(0)),
                                  static_cast<std::size_t>(embedding.shape.at(1))};
  options.rows_read_per_step = static_cast<std::size_t>(batch) * static_cast<std::size_t>(seq);
}

std::unique_ptr<Updater> make_ps_updater(models::Replica& replica, comm::ParameterService& service,
                                         const optim::OptimizerSettings& settings, bool colocated) {
  if (colocated && replica.device() != models::DeviceKind::kCpu) {
    throw UserError(
        "comm.ps_servers = 0: a rank's replica is on a GPU; the colocated parameter server serves CPU "
        "replicas");
  }
  if (settings.lazy_update) {
    throw UserError("comm.backend = ps: train.embedding_update = lazy needs an all-reduce backend");
  }
  return std::make_unique<ParameterServerUpdater>(replica, service, settings);
}

}  // namespace ddp::engine

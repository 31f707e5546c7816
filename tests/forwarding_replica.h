// A replica that passes every call to another one: the base of the tests' replicas that change one thing
// (inject a fault, keep a random state, hand gradients over in another order) and leave the rest as it is.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "models/replica.h"

namespace ddp::testing {

class ForwardingReplica : public models::Replica {
 public:
  explicit ForwardingReplica(std::unique_ptr<models::Replica> inner) : inner_(std::move(inner)) {}

  const models::ParamLayout& layout() const override { return inner_->layout(); }
  models::DeviceKind device() const override { return inner_->device(); }
  void* stream() const override { return inner_->stream(); }
  std::string recurrent_kernels() const override { return inner_->recurrent_kernels(); }
  std::span<float> params() override { return inner_->params(); }
  std::span<float> grads() override { return inner_->grads(); }
  void copy_params_to_host(std::span<float> host) override { inner_->copy_params_to_host(host); }
  void copy_params_from_host(std::span<const float> host) override { inner_->copy_params_from_host(host); }
  void copy_grads_to_host(std::span<float> host) override { inner_->copy_grads_to_host(host); }
  void set_dropout_key(uint64_t key) override { inner_->set_dropout_key(key); }
  std::string rng_state() override { return inner_->rng_state(); }
  bool restore_rng_state(const std::string& saved) override { return inner_->restore_rng_state(saved); }
  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    inner_->train_step(batch, on_ready);
  }
  void evaluate(const BatchView& batch) override { inner_->evaluate(batch); }
  void predict(const BatchView& batch, std::span<float> probabilities) override {
    inner_->predict(batch, probabilities);
  }
  models::BatchStats take_stats() override { return inner_->take_stats(); }
  bool gradients_finite() override { return inner_->gradients_finite(); }
  void after_update(bool applied) override { inner_->after_update(applied); }
  std::optional<models::LossScale::State> loss_scaling() const override { return inner_->loss_scaling(); }
  void restore_loss_scale(const models::LossScale::State& state) override {
    inner_->restore_loss_scale(state);
  }
  bool try_shape(int batch, int seq) override { return inner_->try_shape(batch, seq); }
  void settle_shape(int batch, int seq, bool preferred) override {
    inner_->settle_shape(batch, seq, preferred);
  }
  std::string check_parameter_mapping() override { return inner_->check_parameter_mapping(); }
  std::span<const int32_t> touched_embedding_rows() const override {
    return inner_->touched_embedding_rows();
  }
  void clear_embedding_gradient_rows(std::span<const int32_t> rows) override {
    inner_->clear_embedding_gradient_rows(rows);
  }
  void clear_embedding_gradient() override { inner_->clear_embedding_gradient(); }

 protected:
  models::Replica& inner() { return *inner_; }

 private:
  std::unique_ptr<models::Replica> inner_;
};

}  // namespace ddp::testing

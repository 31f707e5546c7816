// Fakes for a step replayed from CUDA graphs (engine/step_graph.h), on the host: a stream whose work runs at
// once, or is recorded while a capture is on and run again at each launch, as CUDA's graphs do; a recorder
// over it; and a replica over the CPU one whose per-step values live "on the device", written only by work
// on the fake stream, so that a replay computes the eager step only where the host's part of every step
// happens outside the graph.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/step_graph.h"
#include "models/replica.h"
#include "tests/forwarding_replica.h"

namespace ddp::testing {

// Work enqueued runs at once, unless a capture is on: then it is recorded for the graph.
struct FakeStream {
  std::vector<std::function<void()>>* capture = nullptr;
  void enqueue(std::function<void()> work) {
    if (capture != nullptr) {
      capture->push_back(std::move(work));
    } else {
      work();
    }
  }
};

class FakeRecorder final : public engine::GraphRecorder {
 public:
  explicit FakeRecorder(FakeStream& stream, int* destroyed = nullptr)
      : stream_(stream), destroyed_(destroyed) {}
  ~FakeRecorder() override {
    if (destroyed_ != nullptr) ++*destroyed_;
  }
  FakeRecorder(const FakeRecorder&) = delete;
  FakeRecorder& operator=(const FakeRecorder&) = delete;
  void begin_capture() override {
    capturing_.clear();
    stream_.capture = &capturing_;
    ++captures;
  }
  std::size_t end_capture() override {
    stream_.capture = nullptr;
    graphs.push_back(std::move(capturing_));
    return graphs.size() - 1;
  }
  void abandon_capture() noexcept override {
    stream_.capture = nullptr;
    ++abandoned;
  }
  void launch(std::size_t graph) override {
    ++launches;
    for (const auto& work : graphs.at(graph)) work();
  }
  void clear() override {
    graphs.clear();
    ++clears;
  }

  std::vector<std::vector<std::function<void()>>> graphs;
  int captures = 0;
  int launches = 0;
  int clears = 0;
  int abandoned = 0;

 private:
  FakeStream& stream_;
  int* destroyed_;  // counts this recorder's end
  std::vector<std::function<void()>> capturing_;
};

// A GPU replica over the CPU one: its "device memory" is the CPU replica's buffers and the values below,
// written only by work on the fake stream. Each step's gradient gets this step's draw added (as the
// embedding dropout's stream is drawn per step), read from the device when the work runs, and the step reads
// its batch from the replica's own copy (begin_step).
class FakeGpuReplica final : public ForwardingReplica {
 public:
  // `kind`: what device() says (kCpu: the batches stay in host memory, as the self-check hands a CPU
  // replica's over).
  FakeGpuReplica(std::unique_ptr<models::Replica> inner, FakeStream& stream,
                 models::DeviceKind kind = models::DeviceKind::kCuda)
      : ForwardingReplica(std::move(inner)), stream_(stream), kind_(kind) {}
  models::DeviceKind device() const override { return kind_; }
  std::string step_graph_refusal() const override { return ""; }
  uint64_t memory_generation() const override { return generation; }

  void train_step(const BatchView& batch, const models::GradientReadyFn& on_ready) override {
    begin_training();
    enqueue_training(batch, on_ready);
  }
  BatchView begin_step(const BatchView& batch) override {
    begin_training();
    if (!stages_batch) return batch;
    const std::vector<int32_t> tokens(batch.tokens, batch.tokens + batch.batch * batch.seq);
    const std::vector<float> labels(batch.labels, batch.labels + batch.batch);
    stream_.enqueue([this, tokens, labels] {
      std::copy(tokens.begin(), tokens.end(), staged_tokens_.begin());
      std::copy(labels.begin(), labels.end(), staged_labels_.begin());
    });
    return {staged_tokens_.data(), staged_labels_.data(), batch.batch, batch.seq, staged_tokens_.data()};
  }
  void enqueue_step(const BatchView& staged, const models::GradientReadyFn& on_ready) override {
    if (stages_batch && staged.tokens != staged_tokens_.data())
      throw std::logic_error("not begin_step's batch");
    enqueue_training(staged, on_ready);
  }

  // As the GPU replica: every step zeroes the whole gradient first, so there is nothing to clear.
  void clear_embedding_gradient_rows(std::span<const int32_t>) override {}
  void clear_embedding_gradient() override {}

  uint64_t generation = 1;
  // Each step's gradient gets the step's draw added; off, the gradient is the CPU replica's.
  bool adds_draw = true;
  // Faults, for tests. The step's work takes the draw from the host when it is enqueued (as a kernel given it
  // by value), which a graph freezes at its capture's; begin_step hands back the caller's batch instead of
  // its own copy, whose address a graph freezes.
  bool reads_draw_on_host = false;
  bool stages_batch = true;

 private:
  void begin_training() {
    host_draw_ = static_cast<float>(++draws_) * 0.25f;
    stream_.enqueue([this, draw = host_draw_] { device_draw_ = draw; });
  }
  void enqueue_training(const BatchView& batch, const models::GradientReadyFn& on_ready) {
    stream_.enqueue([this, batch, frozen = reads_draw_on_host, draw = host_draw_] {
      std::fill(inner().grads().begin(), inner().grads().end(), 0.0f);
      inner().train_step(batch, {});
      if (adds_draw) {
        for (float& g : inner().grads()) g += frozen ? draw : device_draw_;
      }
    });
    if (!on_ready) return;
    // The GPU replica's order: the dense layer, the embedding, the layers.
    const auto& segments = layout().segments();
    on_ready(segments.back());
    on_ready(segments.front());
    for (std::size_t s = segments.size() - 1; s-- > 1;) on_ready(segments[s]);
  }

  FakeStream& stream_;
  models::DeviceKind kind_;
  int draws_ = 0;
  float host_draw_ = 0;
  float device_draw_ = 0;
  std::vector<int32_t> staged_tokens_ = std::vector<int32_t>(64 * 64);
  std::vector<float> staged_labels_ = std::vector<float>(64);
};

}  // namespace ddp::testing

#include "engine/app/node_checks.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend_choice.h"
#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/base/errors.h"
#include "engine/base/json.h"
#include "engine/device.h"
#include "engine/optimizer/optimizer.h"
#include "engine/step_graph.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/param_layout.h"
#include "models/replica.h"

namespace ddp::engine {
namespace {

// The model of the default config (the Keras imdb_lstm), whose shapes the GPU checks use.
const models::ModelShape kImdbShape{20000, 128, 128, 1};

// A tiny model and a fixed batch: one step takes milliseconds on any device.
constexpr int kSmokeVocab = 40;
constexpr int kSmokeBatch = 8;
constexpr int kSmokeSeq = 12;
constexpr uint64_t kSmokeSeed = 7;
// Keras's initializers start the classifier near p = 0.5 for every sample, so the mean BCE is near ln 2.
constexpr double kLossTolerance = 0.05;
constexpr double kGpuCpuTolerance = 1e-4;  // relative, loss of the GPU replica against the CPU one

models::ModelShape smoke_shape() {
  models::ModelShape shape;
  shape.vocab_size = kSmokeVocab;
  shape.embedding_dim = 8;
  shape.hidden = 8;
  shape.layers = 1;
  return shape;
}

struct HostBatch {
  std::vector<int32_t> tokens;
  std::vector<float> labels;
};

// Deterministic tokens (some rows left-padded with 0) and alternating labels.
HostBatch smoke_batch() {
  HostBatch batch;
  for (int b = 0; b < kSmokeBatch; ++b) {
    for (int t = 0; t < kSmokeSeq; ++t) {
      const bool padding = t < b % 3;
      batch.tokens.push_back(padding ? 0 : (b * 7 + t * 3) % (kSmokeVocab - 1) + 1);
    }
    batch.labels.push_back(static_cast<float>(b % 2));
  }
  return batch;
}

// One train_step: the mean loss, and the gradients copied to `grads`.
double one_step(models::Replica& replica, const BatchView& batch, std::vector<float>* grads) {
  replica.train_step(batch, [](const models::ParamSegment&) {});
  const models::BatchStats stats = replica.take_stats();
  grads->assign(replica.layout().total_size(), 0.0f);
  replica.copy_grads_to_host(*grads);
  if (stats.count != batch.batch) {
    throw std::runtime_error("the step counted " + std::to_string(stats.count) + " samples instead of " +
                             std::to_string(batch.batch));
  }
  return stats.loss_sum / static_cast<double>(stats.count);
}

// Throws when the loss is not near ln 2 or a segment's gradient is not finite or all zero.
void check_step(const std::string& where, double loss, const models::ParamLayout& layout,
                const std::vector<float>& grads) {
  if (!std::isfinite(loss)) throw std::runtime_error(where + " loss is " + std::to_string(loss));
  if (std::abs(loss - std::log(2.0)) > kLossTolerance) {
    throw std::runtime_error(where + " loss " + std::to_string(loss) + " is not near ln 2 = 0.6931");
  }
  for (const models::ParamSegment& segment : layout.segments()) {
    double squares = 0;
    for (std::size_t i = segment.offset; i < segment.offset + segment.size; ++i) {
      squares += static_cast<double>(grads[i]) * grads[i];
    }
    if (!std::isfinite(squares))
      throw std::runtime_error(where + " gradient of " + segment.name + " is not finite");
    if (squares == 0) throw std::runtime_error(where + " gradient of " + segment.name + " is all zero");
  }
}

}  // namespace

SmokeResult smoke_test(const Topology& topology) {
  SmokeResult result;
  result.device = topology.device;
  const auto start = std::chrono::steady_clock::now();
  try {
    const ThrowFatalErrors report_instead_of_abort;  // no MPI call in here: no other rank can be left waiting
    const models::ModelShape shape = smoke_shape();
    const models::ParamLayout layout(shape);
    std::vector<float> params(layout.total_size());
    models::initialize_keras(layout, params, kSmokeSeed);
    HostBatch host = smoke_batch();
    const BatchView host_view{host.tokens.data(), host.labels.data(), kSmokeBatch, kSmokeSeq,
                              host.tokens.data()};

    auto cpu = models::make_cpu_replica(shape);
    cpu->copy_params_from_host(params);
    std::vector<float> cpu_grads;
    const double cpu_loss = one_step(*cpu, host_view, &cpu_grads);
    if (topology.gpu < 0) {
      check_step("CPU", cpu_loss, layout, cpu_grads);
      result.loss = cpu_loss;
    } else {
      auto gpu = models::make_cuda_replica(shape, topology.gpu);
      gpu->copy_params_from_host(params);
      const DeviceBuffer tokens(topology.gpu, host.tokens.data(), host.tokens.size() * sizeof(int32_t));
      const DeviceBuffer labels(topology.gpu, host.labels.data(), host.labels.size() * sizeof(float));
      const BatchView device_view{static_cast<const int32_t*>(tokens.data()),
                                  static_cast<const float*>(labels.data()), kSmokeBatch, kSmokeSeq,
                                  host.tokens.data()};
      std::vector<float> gpu_grads;
      result.loss = one_step(*gpu, device_view, &gpu_grads);
      result.cpu_loss = cpu_loss;
      check_step("GPU", result.loss, layout, gpu_grads);
      if (std::abs(result.loss - cpu_loss) > kGpuCpuTolerance * std::abs(cpu_loss)) {
        throw std::runtime_error("GPU loss " + std::to_string(result.loss) + " differs from the CPU's " +
                                 std::to_string(cpu_loss) + " on the same parameters");
      }
    }
    result.ok = true;
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  result.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

SelfCheckReport imdb_self_check(int gpu) {
  const std::vector<std::pair<int, int>> shapes{{32, 80}, {7, 80}};
  try {
    const ThrowFatalErrors report_instead_of_abort;
    auto replica = models::make_cuda_replica(kImdbShape, gpu);
    for (const auto& [batch, seq] : shapes) replica->settle_shape(batch, seq, replica->try_shape(batch, seq));
    // With the default train.cuda_graph = auto, a step replayed from a CUDA graph too.
    return check_gpu_replica(*replica, gpu, shapes, optim::OptimizerSettings{}, kSmokeSeed, {}, {},
                             make_cuda_graph_recorder);
  } catch (const std::exception& e) {
    SelfCheckReport report;
    report.ok = false;
    report.failure = std::string("the GPU replica could not be made: ") + e.what();
    return report;
  }
}

SelfCheckReport nccl_check(comm::HostGroup& world, int gpu, const std::string& board, bool ready, bool& ran) {
  ran = false;
  std::optional<comm::HostGroup> gpus = world.subgroup(ready);
  SelfCheckReport report;
  if (!gpus) return report;
  if (gpus->size() >= 2) {
    ran = true;
    const auto failed = [&report](const std::string& why) {
      report.ok = false;
      report.failure = why;
    };
    // A new multi-GPU node's likeliest failure is NCCL's set-up: it is reported, as every other check's
    // failure is, rather than ending the job. Two ranks on one board NCCL refuses outright, so that is not
    // even tried.
    comm::HostGroup& host = *gpus;
    const std::vector<std::string> boards = host.gather(board, 0);
    std::optional<std::string> shared;
    if (host.rank() == 0) {
      if (const auto pair = comm::first_shared_board(boards)) {
        shared = "not run: ranks " + std::to_string(pair->first) + " and " + std::to_string(pair->second) +
                 " of the GPU ranks share the GPU at " + boards[static_cast<std::size_t>(pair->first)] +
                 " (overlapping CUDA_VISIBLE_DEVICES, or MIG slices of one GPU), which NCCL refuses";
      }
    }
    if (const auto problem = host.first_error(shared)) failed(*problem);
    const models::ParamLayout imdb(kImdbShape);
    std::vector<std::size_t> sizes;
    for (const std::size_t index : imdb.reduction_order(/*embedding_early=*/true))
      sizes.push_back(imdb.segments()[index].size);
    for (const std::string compression : {"none", "fp16", "bf16"}) {
      if (!report.ok) break;
      std::unique_ptr<comm::GradientReducer> nccl;
      std::optional<std::string> error;
      try {
        const ThrowFatalErrors report_instead_of_abort;
        nccl = comm::make_nccl_reducer(host, nullptr, compression);
      } catch (const std::exception& e) {
        error =
            "rank " + std::to_string(host.rank()) + " of the GPU ranks: NCCL's set-up failed: " + e.what();
      }
      // Every rank learns whether all have a communicator before the first average; one that has it while
      // another failed drops it by abort (a finalize would wait for the failed rank).
      if (const auto problem = host.first_error(error)) {
        if (nccl) nccl->abort();
        failed(*problem);
        break;
      }
      report.add(check_gpu_communicator(host, *nccl, gpu, sizes, compression));
    }
  }
  return report;
}

void to_json(nlohmann::json& out, const SmokeResult& s) {
  out = {{"ok", s.ok}, {"device", s.device}, {"error", s.error}};
  json::put_number(out, "loss", s.loss);
  json::put_number(out, "cpu_loss", s.cpu_loss);
  json::put_number(out, "millis", s.millis);
}
void from_json(const nlohmann::json& in, SmokeResult& s) {
  s.ok = in.at("ok").get<bool>();
  s.device = in.at("device").get<std::string>();
  s.error = in.at("error").get<std::string>();
  s.loss = json::number_at(in, "loss");
  s.cpu_loss = json::number_at(in, "cpu_loss");
  s.millis = json::number_at(in, "millis");
}
}  // namespace ddp::engine

#include "engine/self_check.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>

#include "comm/average_check.h"
#include "engine/base/errors.h"
#include "engine/device.h"
#include "models/rnn_classifier_cpu.h"

namespace ddp::engine {
namespace {

using Clock = std::chrono::steady_clock;

std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

std::string number(double v) {
  return fmt::format("{:.3g}", v);
}

// A failed comparison, thrown inside check_gpu_replica and caught at its end.
struct CheckFailed {
  std::string what;
};

// Random tokens with some rows left-padded (0 is padding, an ordinary token to the model) and random labels,
// as the data pipeline delivers them.
struct GeneratedBatch {
  std::vector<int32_t> tokens;  // [batch, seq]
  std::vector<float> labels;
  std::vector<double> labels_double;
};

GeneratedBatch generate_batch(int vocab, int batch, int seq, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GeneratedBatch out{std::vector<int32_t>(to_size(batch) * to_size(seq)), std::vector<float>(to_size(batch)),
                     std::vector<double>(to_size(batch))};
  for (auto& t : out.tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  for (int b = 0; b < batch; b += 3) {
    const int padding = static_cast<int>(rng() % static_cast<uint64_t>(seq / 2 + 1));
    for (int t = 0; t < padding; ++t) out.tokens[to_size(b) * to_size(seq) + to_size(t)] = 0;
  }
  for (std::size_t b = 0; b < out.labels.size(); ++b) {
    out.labels[b] = static_cast<float>(rng() % 2);
    out.labels_double[b] = out.labels[b];
  }
  return out;
}

// The parameters the check runs on: every tensor uniform in [-limit, limit], biases too (a mapping that drops
// or swaps a bias shows only where biases are not zero), with PyTorch's limit 1/sqrt(hidden) for the
// recurrent layers and the dense one, so that the recurrence neither explodes nor dies over a long sequence,
// and embeddings of about PyTorch's unit scale, so that rows of other tokens end in clearly other states.
// Not Keras's initializers: their orthogonal matrices cost seconds at large hidden sizes, and the check
// needs only values of a realistic size.
std::vector<float> generate_params(const models::ParamLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.total_size());
  std::mt19937_64 rng(seed ^ 0x5e1fc4ecULL);
  const double recurrent = 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(layout.shape().hidden, 1)));
  for (const models::ParamTensor& tensor : layout.tensors()) {
    std::uniform_real_distribution<float> draw(
        static_cast<float>(-(tensor.name == "embedding" ? 1.0 : recurrent)),
        static_cast<float>(tensor.name == "embedding" ? 1.0 : recurrent));
    for (std::size_t i = tensor.offset; i < tensor.offset + tensor.size(); ++i) params[i] = draw(rng);
  }
  return params;
}

// `rows` rows of `data` (a batch of `seq` steps), those from `first` on.
GeneratedBatch rows_of(const GeneratedBatch& data, int seq, int first, int rows) {
  GeneratedBatch out;
  for (int r = 0; r < rows; ++r) {
    const int from = first + r;
    const auto begin = data.tokens.begin() + static_cast<std::ptrdiff_t>(to_size(from) * to_size(seq));
    out.tokens.insert(out.tokens.end(), begin, begin + seq);
    out.labels.push_back(data.labels[to_size(from)]);
    out.labels_double.push_back(data.labels_double[to_size(from)]);
  }
  return out;
}

// One train_step of the checked replica. One that scales its loss (fp16) may overflow at its first scale: as
// in training, the step is skipped (its stats dropped) and taken again at half the scale, until finite.
void train_checked(models::Replica& replica, const BatchView& batch) {
  replica.train_step(batch, {});
  const auto scale = [&replica] {
    const std::optional<models::LossScale::State> scaling = replica.loss_scaling();
    return scaling ? scaling->scale : 1.0f;
  };
  for (int tries = 0; tries < 32 && scale() > 1.0f && !replica.gradients_finite(); ++tries) {
    replica.take_stats();
    replica.after_update(false);
    replica.train_step(batch, {});
  }
}

// `gpu` against the float64 `reference`, with the bound derived from the float32 CPU's error (self_check.h).
// `what` names the compared quantity for the failure line.
template <typename GpuValues, typename CpuValues, typename ReferenceValues>
void compare(const std::string& what, const GpuValues& gpu, const CpuValues& cpu,
             const ReferenceValues& reference, std::size_t begin, std::size_t end,
             const PrecisionBounds& bounds) {
  double gpu_error = 0;
  double cpu_error = 0;
  double size = 0;
  double largest = 0;
  std::size_t where = begin;
  for (std::size_t i = begin; i < end; ++i) {
    const double ref = static_cast<double>(reference[i]);
    const double g = static_cast<double>(gpu[i]) - ref;
    const double c = static_cast<double>(cpu[i]) - ref;
    if (!std::isfinite(g) || std::abs(g) > largest) {
      largest = std::isfinite(g) ? std::abs(g) : INFINITY;
      where = i;
    }
    gpu_error += g * g;
    cpu_error += c * c;
    size += ref * ref;
  }
  gpu_error = std::sqrt(gpu_error);
  const double bound = reference_bound(bounds, std::sqrt(cpu_error), std::sqrt(size));
  if (std::isfinite(gpu_error) && gpu_error <= bound) return;
  throw CheckFailed{what + ": error " + number(gpu_error) + " against the float64 reference (bound " +
                    number(bound) + "; the float32 CPU's " + number(std::sqrt(cpu_error)) +
                    "), largest at element " + std::to_string(where - begin) + ": " +
                    number(static_cast<double>(gpu[where])) + " instead of " +
                    number(static_cast<double>(reference[where]))};
}

// Host data where the checked replica reads it: copied to GPU `device` for a GPU replica, as it is for a
// CPU one (which is how the check itself is tested without a GPU).
class OnReplica {
 public:
  OnReplica(const models::Replica& replica, int device, const void* host, std::size_t bytes) : host_(host) {
    if (replica.device() == models::DeviceKind::kCuda) copy_.emplace(device, host, bytes);
  }
  template <typename T>
  const T* get() const {
    return static_cast<const T*>(copy_ ? copy_->data() : host_);
  }

 private:
  const void* host_;
  std::optional<DeviceBuffer> copy_;
};

// The slice: one train_step and predict of the replica against the CPU replicas (float and double) on the
// same parameters and generated batch, comparing the loss, every parameter tensor's gradient and the
// probabilities. Each batch the references run is added to `reference_batches`.
void compare_slice(models::Replica& gpu, int device, models::Replica& cpu,
                   models::CpuRnnClassifier<double>& reference, int batch, int seq, uint64_t seed,
                   std::vector<std::pair<int, int>>& reference_batches, const PrecisionBounds& bounds) {
  const models::ParamLayout& layout = gpu.layout();
  const GeneratedBatch data = generate_batch(layout.shape().vocab_size, batch, seq, seed);
  const OnReplica tokens(gpu, device, data.tokens.data(), data.tokens.size() * sizeof(int32_t));
  const OnReplica labels(gpu, device, data.labels.data(), data.labels.size() * sizeof(float));
  const BatchView on_gpu{tokens.get<int32_t>(), labels.get<float>(), batch, seq, data.tokens.data()};
  const BatchView on_host{data.tokens.data(), data.labels.data(), batch, seq, data.tokens.data()};
  const std::string at = " (batch " + std::to_string(batch) + " x " + std::to_string(seq) + ")";

  gpu.take_stats();
  cpu.take_stats();
  train_checked(gpu, on_gpu);
  cpu.train_step(on_host, {});
  const models::BatchStats gpu_stats = gpu.take_stats();
  const models::BatchStats cpu_stats = cpu.take_stats();
  const models::BatchStats ref_stats =
      reference.train_step(data.tokens.data(), data.labels_double.data(), batch, seq, {});
  reference_batches.insert(reference_batches.end(), 2, {batch, seq});
  const double g_loss[] = {gpu_stats.loss_sum};
  const double c_loss[] = {cpu_stats.loss_sum};
  const double r_loss[] = {ref_stats.loss_sum};
  compare("loss" + at, g_loss, c_loss, r_loss, 0, 1, bounds);

  std::vector<float> gpu_grads(layout.total_size());
  gpu.copy_grads_to_host(gpu_grads);
  const std::span<const float> cpu_grads = cpu.grads();
  const std::span<const double> ref_grads = reference.grads();
  for (const models::ParamTensor& tensor : layout.tensors()) {
    compare("gradient of " + tensor.name + at, gpu_grads, cpu_grads, ref_grads, tensor.offset,
            tensor.offset + tensor.size(), bounds);
  }

  const std::size_t outputs = to_size(batch) * to_size(layout.shape().outputs());
  std::vector<float> gpu_p(outputs);
  std::vector<float> cpu_p(outputs);
  std::vector<double> ref_p(outputs);
  gpu.predict(on_gpu, gpu_p);
  cpu.predict(on_host, cpu_p);
  reference.evaluate(data.tokens.data(), data.labels_double.data(), batch, seq, ref_p);
  reference_batches.insert(reference_batches.end(), 2, {batch, seq});
  compare("probabilities" + at, gpu_p, cpu_p, ref_p, 0, gpu_p.size(), bounds);
}

// `got` against `expected`, both from the replica: norm-wise, |got - expected| <= tolerance x
// |expected - center| (at least tolerance x 1e-2, for values near the center). `center` (per element; empty:
// zero) measures probabilities from the batch's mean, near which an untrained model's all sit: what tells
// rows apart is how far each is from it.
void compare_consistent(const std::string& what, std::span<const float> got, std::span<const double> expected,
                        double tolerance, std::span<const double> center = {}) {
  double difference = 0;
  double size = 0;
  std::size_t where = 0;
  double largest = -1;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - expected[i];
    if (!std::isfinite(d) || std::abs(d) > largest) {
      largest = std::isfinite(d) ? std::abs(d) : INFINITY;
      where = i;
    }
    difference += d * d;
    const double from_center = expected[i] - (center.empty() ? 0.0 : center[i]);
    size += from_center * from_center;
  }
  difference = std::sqrt(difference);
  const double bound = tolerance * std::max(std::sqrt(size), 1e-2);
  if (std::isfinite(difference) && difference <= bound) return;
  throw CheckFailed{what + ": differs by " + number(difference) + " (bound " + number(bound) +
                    "), largest at element " + std::to_string(where) + ": " +
                    number(static_cast<double>(got[where])) + " instead of " + number(expected[where])};
}

std::vector<double> widened(std::span<const float> values) {
  return {values.begin(), values.end()};
}

// The replica's probabilities for `data` (`rows` x `seq`).
std::vector<float> predict_rows(models::Replica& gpu, int device, const GeneratedBatch& data, int rows,
                                int seq) {
  const OnReplica tokens(gpu, device, data.tokens.data(), data.tokens.size() * sizeof(int32_t));
  const OnReplica labels(gpu, device, data.labels.data(), data.labels.size() * sizeof(float));
  std::vector<float> probabilities(to_size(rows) * to_size(gpu.layout().shape().outputs()));
  gpu.predict({tokens.get<int32_t>(), labels.get<float>(), rows, seq, data.tokens.data()}, probabilities);
  gpu.take_stats();
  return probabilities;
}

// One training step of the replica on `data` (`rows` x `seq`): its loss sum and gradients (mean over rows).
std::pair<double, std::vector<float>> train_rows(models::Replica& gpu, int device, const GeneratedBatch& data,
                                                 int rows, int seq) {
  const OnReplica tokens(gpu, device, data.tokens.data(), data.tokens.size() * sizeof(int32_t));
  const OnReplica labels(gpu, device, data.labels.data(), data.labels.size() * sizeof(float));
  gpu.take_stats();
  train_checked(gpu, {tokens.get<int32_t>(), labels.get<float>(), rows, seq, data.tokens.data()});
  std::vector<float> grads(gpu.layout().total_size());
  gpu.copy_grads_to_host(grads);
  return {gpu.take_stats().loss_sum, std::move(grads)};
}

// One of the run's shapes, on the replica alone: the batch against its two halves run as batches of their
// own, all on distinct rows. Every row's outputs against the same row's in its half; with `train`, the loss
// sum and the mean gradient against what follows exactly from the halves': (h G_first + (batch - h) G_second)
// / batch. A kernel that mixes rows, tiles or batch positions up, or is wrong at this batch size alone,
// differs by the size of the values; the halves sit at other positions of other batches. Nothing here grows
// the CPU's work with the shape.
void check_consistency(models::Replica& gpu, int device, int batch, int seq, bool train, uint64_t seed,
                       double tolerance) {
  const models::ParamLayout& layout = gpu.layout();
  const auto outputs = to_size(layout.shape().outputs());
  const std::string shape = "batch " + std::to_string(batch) + " x " + std::to_string(seq);
  const GeneratedBatch data = generate_batch(layout.shape().vocab_size, batch, seq, seed);
  const std::vector<float> full = predict_rows(gpu, device, data, batch, seq);
  for (std::size_t i = 0; i < full.size(); ++i) {
    if (!std::isfinite(full[i]))
      throw CheckFailed{"probabilities (" + shape + "): element " + std::to_string(i) + " is not finite"};
  }
  const int half = batch / 2;  // the first half's rows; the second has the rest
  struct Half {
    int first;
    int rows;
  };
  const Half halves[] = {{0, half}, {half, batch - half}};
  if (half > 0) {
    // Each output's mean over the batch, for every row of a half.
    std::vector<double> mean(to_size(batch - half) * outputs, 0.0);
    for (std::size_t i = 0; i < full.size(); ++i) mean[i % outputs] += double(full[i]) / batch;
    for (std::size_t i = outputs; i < mean.size(); ++i) mean[i] = mean[i % outputs];
    for (const Half& h : halves) {
      const std::vector<float> part =
          predict_rows(gpu, device, rows_of(data, seq, h.first, h.rows), h.rows, seq);
      compare_consistent("probabilities of rows " + std::to_string(h.first) + ".." +
                             std::to_string(h.first + h.rows - 1) + " (" + shape +
                             ", against those rows alone)",
                         {full.data() + to_size(h.first) * outputs, part.size()}, widened(part), tolerance,
                         {mean.data(), part.size()});
    }
  }
  if (!train) return;
  const auto [loss, grads] = train_rows(gpu, device, data, batch, seq);
  if (!std::isfinite(loss)) throw CheckFailed{"loss (" + shape + ") is not finite"};
  if (half == 0) return;
  double expected_loss = 0;
  std::vector<double> expected(grads.size(), 0.0);
  for (const Half& h : halves) {
    const auto [part_loss, part_grads] =
        train_rows(gpu, device, rows_of(data, seq, h.first, h.rows), h.rows, seq);
    expected_loss += part_loss;
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] += double(h.rows) * part_grads[i];
  }
  for (double& g : expected) g /= batch;
  const std::string against = " (" + shape + ", against its two halves)";
  const float got_loss[] = {static_cast<float>(loss)};
  const double want_loss[] = {expected_loss};
  compare_consistent("loss" + against, got_loss, want_loss, tolerance);
  for (const models::ParamTensor& tensor : layout.tensors()) {
    compare_consistent("gradient of " + tensor.name + against,
                       std::span<const float>(grads).subspan(tensor.offset, tensor.size()),
                       std::span<const double>(expected).subspan(tensor.offset, tensor.size()), tolerance);
  }
}

// The training shape's step replayed from a CUDA graph (train.cuda_graph, step_graph.h) against the same step
// enqueued eagerly, on two batches: the graph is captured on the first and replayed on both, and must give
// each the eager step's gradients. A value the capture froze (a batch's address, a per-step scalar) would
// give the second batch the first's gradient; a kernel or cuDNN call that a replay runs wrongly, anything.
void check_replayed_step(models::Replica& gpu, int device, int batch, int seq, uint64_t seed,
                         const GraphRecorderFactory& make_recorder) {
  const std::string hint = " (train.cuda_graph = off runs the step eagerly)";
  const std::string shape = "batch " + std::to_string(batch) + " x " + std::to_string(seq);
  const int vocab = gpu.layout().shape().vocab_size;
  const GeneratedBatch data[] = {generate_batch(vocab, batch, seq, seed),
                                 generate_batch(vocab, batch, seq, seed + 1)};
  const OnReplica tokens[] = {{gpu, device, data[0].tokens.data(), data[0].tokens.size() * sizeof(int32_t)},
                              {gpu, device, data[1].tokens.data(), data[1].tokens.size() * sizeof(int32_t)}};
  const OnReplica labels[] = {{gpu, device, data[0].labels.data(), data[0].labels.size() * sizeof(float)},
                              {gpu, device, data[1].labels.data(), data[1].labels.size() * sizeof(float)}};
  const auto view = [&](int i) {
    const auto k = static_cast<std::size_t>(i);
    return BatchView{tokens[k].get<int32_t>(), labels[k].get<float>(), batch, seq, data[k].tokens.data()};
  };
  const auto gradients = [&] {
    std::vector<float> grads(gpu.layout().total_size());
    gpu.copy_grads_to_host(grads);
    return grads;
  };
  std::vector<float> eager[2];
  for (int i = 0; i < 2; ++i) {
    gpu.enqueue_step(gpu.begin_step(view(i)), {});
    eager[i] = gradients();
  }
  const std::unique_ptr<GraphRecorder> recorder = make_recorder(gpu.stream());
  const BatchView staged = gpu.begin_step(view(0));
  recorder->begin_capture();
  try {
    gpu.enqueue_step(staged, {});
  } catch (...) {
    recorder->abandon_capture();
    throw;
  }
  const std::size_t graph = recorder->end_capture();
  for (int i = 0; i < 2; ++i) {
    if (i > 0) gpu.begin_step(view(i));
    recorder->launch(graph);
    compare_consistent("gradients of a step replayed from a CUDA graph (" + shape + ", batch " +
                           std::to_string(i + 1) + " of 2, against the eager step)" + hint,
                       gradients(), widened(eager[i]), kReplayTolerance);
  }
  gpu.take_stats();
}

// One optimizer step on the GPU and on the host from the same parameters and gradients: the kernels round
// every operation as the host code does (optimizer.cpp), so the results must be equal bit for bit.
void compare_optimizer_step(models::Replica& gpu, int device, const optim::OptimizerSettings& settings,
                            std::span<const float> params, std::span<const float> grads) {
  const std::size_t n = params.size();
  // With train.clip_norm, the clipped step: the GPU's norm is summed in the host's order, so it agrees too.
  auto step = [&](optim::Optimizer& optimizer, std::span<float> p, std::span<const float> g) {
    if (settings.clip_norm > 0) {
      optimizer.step_clipped(p, g, nullptr, settings.clip_norm);
    } else {
      optimizer.step(p, g);
    }
  };
  std::vector<float> host(params.begin(), params.end());
  step(*optim::make_optimizer(settings, n), host, grads);
  gpu.copy_params_from_host(params);
  const OnReplica device_grads(gpu, device, grads.data(), grads.size_bytes());
  const bool on_gpu = gpu.device() == models::DeviceKind::kCuda;
  step(*(on_gpu ? optim::make_cuda_optimizer(settings, n, device, gpu.stream())
                : optim::make_optimizer(settings, n)),
       gpu.params(), {device_grads.get<float>(), n});
  std::vector<float> back(n);
  gpu.copy_params_to_host(back);
  std::size_t differing = 0;
  std::size_t first = n;
  for (std::size_t i = 0; i < n; ++i) {
    if (std::memcmp(&back[i], &host[i], sizeof(float)) == 0) continue;
    if (differing++ == 0) first = i;
  }
  if (differing == 0) return;
  std::string where = std::to_string(first);
  for (const models::ParamTensor& tensor : gpu.layout().tensors()) {
    if (first >= tensor.offset && first < tensor.offset + tensor.size())
      where = tensor.name + "[" + std::to_string(first - tensor.offset) + "]";
  }
  throw CheckFailed{settings.name + " step: " + std::to_string(differing) + " of " + std::to_string(n) +
                    " parameters differ from the host optimizer's, first " + where + ": " +
                    number(back[first]) + " instead of " + number(host[first])};
}

std::string describe_sizes(std::span<const std::size_t> sizes) {
  std::string text;
  for (std::size_t i = 0; i < sizes.size(); ++i) text += (i == 0 ? "" : ", ") + std::to_string(sizes[i]);
  return text;
}

}  // namespace

SelfCheckReport check_gpu_communicator(comm::HostGroup& group, comm::GradientReducer& reducer, int device,
                                       std::span<const std::size_t> segment_sizes,
                                       const std::string& compression) {
  const auto start = Clock::now();
  SelfCheckReport report;
  const double tolerance = comm::average_tolerance(compression, group.size());
  std::size_t total = 0;
  for (const std::size_t size : segment_sizes) total += size;
  std::optional<DeviceBuffer> memory;
  std::optional<std::string> error;
  try {
    const ThrowFatalErrors report_instead_of_abort;
    memory.emplace(device, total * sizeof(float));
  } catch (const std::exception& e) {
    error = std::string("a GPU call failed: ") + e.what();
  }
  // Every rank learns whether every rank has its buffer before the first average.
  if (auto first = group.first_error(
          error ? std::optional<std::string>("rank " + std::to_string(group.rank()) + ": " + *error)
                : std::nullopt)) {
    report.ok = false;
    report.failure = reducer.backend() + " average check: " + *first;
  } else {
    // Between the collectives of check_average a copy that fails cannot be agreed on: it ends the job
    // (fatal), as a failed NCCL call there does, instead of leaving the other ranks waiting.
    auto or_fatal = [](auto&& copy) {
      try {
        copy();
      } catch (const std::exception& e) {
        DDP_FATAL(std::string("self-check of the communicator: ") + e.what());
      }
    };
    comm::CheckBuffer buffer{
        std::span<float>(static_cast<float*>(memory->data()), total),
        [&](std::span<const float> host) {
          or_fatal([&] { memory->upload(host.data(), host.size_bytes()); });
        },
        [&](std::span<float> host) { or_fatal([&] { memory->download(host.data(), host.size_bytes()); }); }};
    const comm::AverageCheckResult result =
        comm::check_average(group, reducer, buffer, segment_sizes, tolerance);
    if (result.ok) {
      report.passed.push_back(reducer.backend() + " averages = closed form" +
                              (compression == "none" ? "" : " (" + compression + " on the wire)") + " over " +
                              std::to_string(group.size()) + " ranks in segments of " +
                              describe_sizes(segment_sizes) + " floats");
    } else {
      report.ok = false;
      report.failure = reducer.backend() + " average (comm.compression = " + compression +
                       "): largest error " + number(result.largest_error) + " (bound " + number(tolerance) +
                       ") " + result.where;
    }
  }
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

void SelfCheckReport::add(const SelfCheckReport& next) {
  passed.insert(passed.end(), next.passed.begin(), next.passed.end());
  reference_batches.insert(reference_batches.end(), next.reference_batches.begin(),
                           next.reference_batches.end());
  if (ok && !next.ok) failure = next.failure;
  ok = ok && next.ok;
  seconds += next.seconds;
}

std::string SelfCheckReport::summary() const {
  if (!ok) return "FAILED: " + failure;
  std::string text = "passed in " + number(seconds) + " s (";
  for (std::size_t i = 0; i < passed.size(); ++i) text += (i == 0 ? "" : "; ") + passed[i];
  return text + ")";
}

PrecisionBounds precision_bounds(models::Precision precision) {
  const double u = models::unit_roundoff(precision);
  PrecisionBounds bounds;
  bounds.error_scale = u / models::unit_roundoff(models::Precision::kFp32);
  bounds.relative_floor = std::max(kRelativeFloor, kErrorFactor * u);
  bounds.consistency = std::max(kConsistencyTolerance, kErrorFactor * u);
  return bounds;
}

double reference_bound(const PrecisionBounds& bounds, double cpu_error, double reference_size) {
  const double size = std::max(reference_size, 1e-3);
  return std::min(kLargestRelativeError * size,
                  std::max(kErrorFactor * bounds.error_scale * cpu_error, bounds.relative_floor * size));
}

SelfCheckReport check_gpu_replica(models::Replica& replica, int device,
                                  std::span<const std::pair<int, int>> shapes,
                                  optim::OptimizerSettings settings, uint64_t seed,
                                  const models::ModelOptions& options, const std::function<void()>& progress,
                                  const GraphRecorderFactory& make_recorder) {
  const auto start = Clock::now();
  const auto proceed = [&] {
    if (progress) progress();
  };
  SelfCheckReport report;
  const models::ParamLayout& layout = replica.layout();
  const std::optional<models::LossScale::State> scaling_before = replica.loss_scaling();
  try {
    const ThrowFatalErrors report_instead_of_abort;
    const std::vector<float> params = generate_params(layout, seed);
    replica.copy_params_from_host(params);

    // The slice: every layer and direction of the model, on a few rows and a few dozen steps, whatever the
    // run's shapes.
    int longest = shapes.empty() ? kSliceSteps : 1;
    for (const auto& [batch, seq] : shapes) longest = std::max(longest, seq);
    const int slice_steps = std::min(kSliceSteps, longest);
    models::ModelOptions deterministic = options;
    deterministic.dropout = 0;
    deterministic.embedding_dropout = 0;
    auto cpu = models::make_cpu_replica(layout.shape(), models::CpuKernels::kBuiltin, deterministic);
    models::CpuRnnClassifier<double> reference(layout.shape(), deterministic);
    cpu->copy_params_from_host(params);
    std::copy(params.begin(), params.end(), reference.params().begin());
    const PrecisionBounds bounds = precision_bounds(options.precision);
    compare_slice(replica, device, *cpu, reference, kSliceRows, slice_steps, seed + 1,
                  report.reference_batches, bounds);
    report.passed.push_back("loss, gradients and outputs = CPU's on " + std::to_string(kSliceRows) + "x" +
                            std::to_string(slice_steps) +
                            (options.precision == models::Precision::kFp32
                                 ? std::string()
                                 : " within " + models::precision_name(options.precision) + "'s bounds"));
    proceed();

    std::string shapes_text;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      const auto [batch, seq] = shapes[i];
      // The first shape is the training batch's; the others are evaluated only.
      check_consistency(replica, device, batch, seq, /*train=*/i == 0, seed + 2 + i, bounds.consistency);
      shapes_text += (i == 0 ? "" : ", ") + std::to_string(batch) + "x" + std::to_string(seq);
      proceed();
    }
    if (!shapes.empty()) report.passed.push_back(shapes_text + " = their rows in small batches");

    // train.cuda_graph: the training shape's step, replayed from a graph, against the eager step.
    if (make_recorder && !shapes.empty() && replica.step_graph_refusal().empty()) {
      check_replayed_step(replica, device, shapes.front().first, shapes.front().second,
                          seed + 2 + shapes.size(), make_recorder);
      report.passed.push_back("a step replayed from a CUDA graph = its eager step");
      proceed();
    }

    if (const std::string problem = replica.check_parameter_mapping(); !problem.empty()) {
      throw CheckFailed{"parameter mapping: " + problem};
    }
    report.passed.push_back("parameter mapping exact");
    proceed();

    settings.lazy_update = false;  // GPU ranks update the embedding densely
    const std::span<const float> grads = cpu->grads();
    compare_optimizer_step(replica, device, settings, params, grads);
    report.passed.push_back(settings.name + (settings.clip_norm > 0 ? " clipped" : "") +
                            " step = host's bit for bit");
    replica.take_stats();
    proceed();
  } catch (const CheckFailed& failed) {
    report.ok = false;
    report.failure = failed.what;
  } catch (const std::exception& e) {
    // A CUDA or cuDNN call that failed on the way (FatalError under ThrowFatalErrors, runtime_error from
    // DeviceBuffer), or a UserError of the replica.
    report.ok = false;
    report.failure = std::string("a GPU call failed: ") + e.what();
  }
  // fp16: training keeps the scale that the check's overflowing steps lowered (one that fits), but those
  // steps were no training steps skipped.
  if (const std::optional<models::LossScale::State> scaling = replica.loss_scaling();
      scaling && scaling_before)
    replica.restore_loss_scale({scaling->scale, scaling->clean_steps, scaling_before->skipped});
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

}  // namespace ddp::engine

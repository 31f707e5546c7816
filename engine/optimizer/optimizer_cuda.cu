// Adam and SGD over a flat device buffer (optimizer.h): one fused kernel per step on the replica's stream, no
// host synchronisation. The step's coefficients (learning rate, bias correction) are computed on the host and
// stored on the device by a one-thread kernel before the update, which reads them there: the update itself
// has the same arguments at every step, so a CUDA graph can capture it once (prepare_step, enqueue_step). The
// element-wise math is the host loop's own (optimizer_math.h), compiled here with
// --fmad=false and there with -ffp-contract=off, so the two agree to the last bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/base/cuda_check.h"
#include "engine/base/cuda_handles.h"
#include "engine/base/errors.h"
#include "engine/base/gradient_clipping.h"
#include "engine/optimizer/optimizer.h"
#include "engine/optimizer/optimizer_math.h"

namespace ddp::optim {
namespace {

constexpr int kThreads = 256;

// Clipping: lane l of the squared norm (gradient_clipping.h's order, as the host loop), one thread per lane.
__global__ void squared_norm_lanes(const float* __restrict__ g, std::size_t n, double* __restrict__ lanes) {
  const std::size_t lane = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (lane >= kNormLanes) return;
  double sum = 0;
  for (std::size_t i = lane; i < n; i += kNormLanes) sum = add_square(sum, g[i]);
  lanes[lane] = sum;
}

// The lanes added in order and the step's gradient scale, left on the device for the update kernel: the host
// never waits for the norm.
__global__ void clipping_scale_kernel(const double* __restrict__ lanes, double clip_norm,
                                      float* __restrict__ scale) {
  double sum = 0;
  for (std::size_t l = 0; l < kNormLanes; ++l) sum += lanes[l];
  *scale = clipping_scale(sum, clip_norm);
}

// float4 lanes of a parameter array, a read-only gradient's copy; stored back only where writable.
__device__ float4 load4(float* array, std::size_t i) {
  return reinterpret_cast<float4*>(array)[i];
}
__device__ float4 load4(const float* array, std::size_t i) {
  return reinterpret_cast<const float4*>(array)[i];
}
__device__ void store4(float* array, std::size_t i, const float4& lanes) {
  reinterpret_cast<float4*>(array)[i] = lanes;
}
__device__ void store4(const float*, std::size_t, const float4&) {}

// Grid-stride loop calling update(element of each array...) on every index below n. With vec4 (every pointer
// 16-byte aligned) the first n/4*4 elements go as float4 (one 16-byte load and store per array), the rest one
// by one.
template <typename Update, typename... Arrays>
__device__ void update_elements(std::size_t n, bool vec4, Update update, Arrays* __restrict__... arrays) {
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t done = 0;
  if (vec4) {
    const std::size_t n4 = n / 4;
    for (std::size_t i = first; i < n4; i += stride) {
      [&](auto... lanes) {
        update(lanes.x...);
        update(lanes.y...);
        update(lanes.z...);
        update(lanes.w...);
        (store4(arrays, i, lanes), ...);
      }(load4(arrays, i)...);
    }
    done = n4 * 4;
  }
  for (std::size_t i = done + first; i < n; i += stride) update(arrays[i]...);
}

// A step's coefficients, computed on the host, into the device memory the update kernels read: a kernel
// argument is copied when the launch is enqueued, so the host needs no buffer that outlives the call.
template <typename Coefficients>
__global__ void store_coefficients(Coefficients value, Coefficients* __restrict__ to) {
  *to = value;
}

// The step's coefficients from the device (prepare_step's); `scale` (clipping, on the device; null: theirs)
// multiplies every gradient.
__global__ void adam_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                            float* __restrict__ v, std::size_t n, const AdamCoefficients* __restrict__ stored,
                            const float* __restrict__ scale, bool vec4) {
  AdamCoefficients c = *stored;
  if (scale != nullptr) c.grad_scale = *scale;
  update_elements(
      n, vec4, [&](float& pi, float gi, float& mi, float& vi) { adam_update_one(pi, gi, mi, vi, c); }, p, g,
      m, v);
}

__global__ void sgd_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ velocity,
                           std::size_t n, const SgdCoefficients* __restrict__ stored,
                           const float* __restrict__ scale, bool vec4) {
  SgdCoefficients c = *stored;
  if (scale != nullptr) c.grad_scale = *scale;
  update_elements(
      n, vec4, [&](float& pi, float gi, float& vi) { sgd_update_one(pi, gi, vi, c); }, p, g, velocity);
}

bool aligned16(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

class CudaOptimizer : public Optimizer {
 public:
  void step(std::span<float> params, std::span<const float> grads, const TouchedRows*,
            float gradient_scale) final {
    // `sparse` is ignored: lazy rows were refused at construction, so the update is dense.
    DDP_CHECK(params.size() == size_ && grads.size() == size_);
    prepare(gradient_scale);
    enqueue(params.data(), grads.data(), 0);
  }

  void step_clipped(std::span<float> params, std::span<const float> grads, const TouchedRows*,
                    double clip_norm) final {
    DDP_CHECK(params.size() == size_ && grads.size() == size_);
    prepare(1.0f);  // the gradient scale is replaced on the device by the clipping scale
    enqueue(params.data(), grads.data(), clip_norm);
  }

  bool splits_steps() const final { return true; }
  void prepare_step() final { prepare(1.0f); }
  void enqueue_step(std::span<float> params, std::span<const float> grads, double clip_norm) final {
    DDP_CHECK(params.size() == size_ && grads.size() == size_);
    enqueue(params.data(), grads.data(), clip_norm);
  }

  int64_t iterations() const final { return iterations_; }
  OptimizerState state() const final {
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    OptimizerState state{iterations_, {}};
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      std::vector<float> host(size_);
      if (size_ > 0) {
        DDP_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffers_[i]->get(), size_ * sizeof(float),
                                       cudaMemcpyDeviceToHost, stream_));
      }
      state.buffers.emplace_back(names_[i], std::move(host));
    }
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return state;
  }

  void load_state(const OptimizerState& state) final {
    bool ok = state.buffers.size() == names_.size();
    for (std::size_t i = 0; ok && i < names_.size(); ++i) {
      ok = state.buffers[i].first == names_[i] && state.buffers[i].second.size() == size_;
    }
    if (!ok) throw UserError("checkpoint: optimizer state does not match train.optimizer = " + name());
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    for (std::size_t i = 0; i < names_.size() && size_ > 0; ++i) {
      DDP_CUDA_CHECK(cudaMemcpyAsync(buffers_[i]->get(), state.buffers[i].second.data(),
                                     size_ * sizeof(float), cudaMemcpyHostToDevice, stream_));
    }
    // The host vectors belong to the caller: wait for the copies.
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
    iterations_ = state.iterations;
  }

 protected:
  // The caller names the stream's device: cudaStreamGetDevice would tell, but only from CUDA 12.8 on.
  CudaOptimizer(std::size_t size, int device, cudaStream_t stream, std::vector<std::string> names)
      : size_(size), stream_(stream), device_(device), names_(std::move(names)) {
    // The moments live on the replica's device, whatever device is current.
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    int sm_count = 0;
    DDP_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device_));
    max_blocks_ = std::max(1, sm_count) * 8;
    for (std::size_t i = 0; i < names_.size(); ++i) {  // the moments start at zero
      auto& moment = *buffers_.emplace_back(std::make_unique<cuda::DeviceArray<float>>());
      moment.ensure(size_);
      if (size_ > 0) DDP_CUDA_CHECK(cudaMemsetAsync(moment.get(), 0, moment.bytes(), stream_));
    }
    // Allocated here, never in a step: a step captured into a CUDA graph must not allocate.
    norm_lanes_.ensure(kNormLanes);
    clip_scale_.ensure(1);
    DDP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  // Counts the step and enqueues the store of its coefficients, computed with `gradient_scale`.
  void prepare(float gradient_scale) {
    ++iterations_;
    gradient_scale_ = gradient_scale;
    if (size_ == 0) return;
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    store();
  }

  // The update on the stored coefficients, clipped to `clip_norm` where it is > 0.
  void enqueue(float* params, const float* grads, double clip_norm) {
    if (size_ == 0) return;
    DDP_CUDA_CHECK(cudaSetDevice(device_));
    const float* scale = nullptr;
    if (clip_norm > 0) {
      squared_norm_lanes<<<static_cast<unsigned int>((kNormLanes + kThreads - 1) / kThreads), kThreads, 0,
                           stream_>>>(grads, size_, norm_lanes_.get());
      DDP_CUDA_CHECK_LAUNCH("squared_norm_lanes");
      clipping_scale_kernel<<<1, 1, 0, stream_>>>(norm_lanes_.get(), clip_norm, clip_scale_.get());
      DDP_CUDA_CHECK_LAUNCH("clipping_scale_kernel");
      scale = clip_scale_.get();
    }
    launch(params, grads, scale);
  }

  // Enqueues the store of this step's coefficients (iterations_ already counts it, gradient_scale_ is its
  // scale) into the device memory launch() reads.
  virtual void store() = 0;
  // Enqueues the update on the stored coefficients; a non-null `scale` on the device replaces their
  // gradient scale.
  virtual void launch(float* params, const float* grads, const float* scale) = 0;

  // Blocks for `items` work items (float4 or floats), at most a few waves.
  unsigned int blocks_for(std::size_t items) const {
    const std::size_t blocks = (items + kThreads - 1) / kThreads;
    return static_cast<unsigned int>(
        std::clamp<std::size_t>(blocks, 1, static_cast<std::size_t>(max_blocks_)));
  }

  std::size_t size_;
  cudaStream_t stream_;
  int device_;
  int64_t iterations_ = 0;
  float gradient_scale_ = 1.0f;  // this step's
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<cuda::DeviceArray<float>>> buffers_;  // one per name, in order
  int max_blocks_ = 1;
  cuda::DeviceArray<double> norm_lanes_;  // clipping: the squared norm's lanes
  cuda::DeviceArray<float> clip_scale_;   // clipping: this step's gradient scale
};

class CudaAdam final : public CudaOptimizer {
 public:
  CudaAdam(const OptimizerSettings& s, std::size_t size, int device, cudaStream_t stream)
      : CudaOptimizer(size, device, stream, {"m", "v"}), s_(s) {
    coefficients_.ensure(1);
  }
  std::string name() const override { return "adam"; }

 protected:
  void store() override {
    store_coefficients<<<1, 1, 0, stream_>>>(adam_coefficients(s_, iterations_, gradient_scale_),
                                             coefficients_.get());
    DDP_CUDA_CHECK_LAUNCH("store_coefficients (adam)");
  }
  void launch(float* params, const float* grads, const float* scale) override {
    float* m = buffers_[0]->get();
    float* v = buffers_[1]->get();
    const bool vec4 = aligned16(params) && aligned16(grads) && aligned16(m) && aligned16(v);
    adam_kernel<<<blocks_for(vec4 ? size_ / 4 + 1 : size_), kThreads, 0, stream_>>>(
        params, grads, m, v, size_, coefficients_.get(), scale, vec4);
    DDP_CUDA_CHECK_LAUNCH("adam_kernel");
  }

 private:
  OptimizerSettings s_;
  cuda::DeviceArray<AdamCoefficients> coefficients_;  // the step's, from store()
};

class CudaSgd final : public CudaOptimizer {
 public:
  CudaSgd(const OptimizerSettings& s, std::size_t size, int device, cudaStream_t stream)
      : CudaOptimizer(size, device, stream, {"velocity"}), s_(s) {
    coefficients_.ensure(1);
  }
  std::string name() const override { return "sgd"; }

 protected:
  void store() override {
    store_coefficients<<<1, 1, 0, stream_>>>(sgd_coefficients(s_, iterations_, gradient_scale_),
                                             coefficients_.get());
    DDP_CUDA_CHECK_LAUNCH("store_coefficients (sgd)");
  }
  void launch(float* params, const float* grads, const float* scale) override {
    float* velocity = buffers_[0]->get();
    const bool vec4 = aligned16(params) && aligned16(grads) && aligned16(velocity);
    sgd_kernel<<<blocks_for(vec4 ? size_ / 4 + 1 : size_), kThreads, 0, stream_>>>(
        params, grads, velocity, size_, coefficients_.get(), scale, vec4);
    DDP_CUDA_CHECK_LAUNCH("sgd_kernel");
  }

 private:
  OptimizerSettings s_;
  cuda::DeviceArray<SgdCoefficients> coefficients_;  // the step's, from store()
};

}  // namespace

std::unique_ptr<Optimizer> make_cuda_optimizer(const OptimizerSettings& settings, std::size_t size,
                                               int device, void* stream) {
  // Settings first: these errors need no GPU.
  if (settings.lazy_update) throw UserError("train.embedding_update = lazy is not supported on the GPU");
  if (settings.name != "adam" && settings.name != "sgd") {
    throw UserError("train.optimizer = " + settings.name + ": expected adam or sgd");
  }
  auto* cuda_stream = static_cast<cudaStream_t>(stream);
  if (settings.name == "adam") return std::make_unique<CudaAdam>(settings, size, device, cuda_stream);
  return std::make_unique<CudaSgd>(settings, size, device, cuda_stream);
}

}  // namespace ddp::optim

#include "models/classifier_kernels.cuh"

#include "engine/base/float16.h"
#include "models/dropout.h"
#include "models/output_math.h"
#include "models/sequence_mask.h"

namespace ddp::models::kernels {

__global__ void fill_int32(int32_t* out, int n, int32_t value) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = value;
}

__global__ void sequence_starts(const int32_t* __restrict__ tokens, int batch, int seq,
                                int32_t* __restrict__ starts, int32_t* __restrict__ lengths) {
  for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < batch; b += gridDim.x * blockDim.x) {
    const int start = masked_start(tokens + static_cast<std::size_t>(b) * seq, seq);
    starts[b] = start;
    lengths[b] = seq - start;
  }
}

__global__ void store_uint64(uint64_t value, uint64_t* to) {
  *to = value;
}

namespace {

constexpr int32_t kNoToken = -1;

// Element i of the time-major x [T, B, E] comes from token (b, t + start_b) of the row-major tokens [B, T]
// (start_b = 0 without starts); kNoToken past the row's end, where a shifted sequence has ended.
__device__ inline int32_t token_of_element(const int32_t* tokens, const int32_t* starts, std::size_t i,
                                           int batch, int seq, int embed) {
  const std::size_t row = i / embed;
  const std::size_t b = row % batch;
  const std::size_t t = row / batch + (starts != nullptr ? static_cast<std::size_t>(starts[b]) : 0);
  return t < static_cast<std::size_t>(seq) ? tokens[b * seq + t] : kNoToken;
}

}  // namespace

// Embedding lookup: tokens [B, T] row-major into x [T, B, E] time-major (row t*B+b is token (b, t)). A token
// outside the vocabulary reads as zeros and raises *bad_token, reported on the host at the next sync.
__global__ void embedding_forward(const int32_t* __restrict__ tokens, const int32_t* __restrict__ starts,
                                  const float* __restrict__ embedding, float* __restrict__ x, int batch,
                                  int seq, int embed, int vocab, unsigned int* __restrict__ bad_token) {
  const std::size_t n = static_cast<std::size_t>(seq) * batch * embed;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::size_t e = i % embed;
    const int32_t token = token_of_element(tokens, starts, i, batch, seq, embed);
    if (token == kNoToken) {
      x[i] = 0.0f;
    } else if (token < 0 || token >= vocab) {
      x[i] = 0.0f;
      atomicOr(bad_token, 1u);
    } else {
      x[i] = embedding[static_cast<std::size_t>(token) * embed + e];
    }
  }
}

// The embedding gradient: row `token` gathers dx of every occurrence. The rows were zeroed before; atomics
// add repeated tokens in whatever order the GPU runs them (float rounding makes that order visible).
__global__ void embedding_backward(const int32_t* __restrict__ tokens, const int32_t* __restrict__ starts,
                                   const float* __restrict__ dx, float* __restrict__ d_embedding, int batch,
                                   int seq, int embed, int vocab) {
  const std::size_t n = static_cast<std::size_t>(seq) * batch * embed;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::size_t e = i % embed;
    const int32_t token = token_of_element(tokens, starts, i, batch, seq, embed);
    if (token >= 0 && token < vocab) {
      atomicAdd(&d_embedding[static_cast<std::size_t>(token) * embed + e], dx[i]);
    }
  }
}

// The dense layer on the top layer's last hidden state h_last [B, H], then sigmoid and BCE, in one block: a
// warp per sample, the block's sums in a fixed order. Optional outputs: probabilities [B]; with labels,
// d_logits [B] = d(mean loss)/dz = (p - y) / B and the running stats (loss in double, as the CPU does).
namespace {

// The dot product of a and b [n] by one warp: lane l adds elements l, l + 32, ..., then the lanes' sums are
// folded by shuffles; lane 0 holds the result. Every lane must call it (the shuffles take the whole warp).
__device__ float warp_dot(const float* a, const float* b, int n, int lane) {
  float sum = 0.0f;
  for (int j = lane; j < n; j += 32) sum += a[j] * b[j];
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  return sum;
}

// The dense kernels' last part: each warp's lane 0 holds its samples' loss and hits; thread 0 adds the
// block's, in warp order, to the running sums (one block, ordered on the stream: a plain read-modify-write
// is safe).
__device__ void add_block_stats(double loss, unsigned long long correct, double* loss_part,
                                unsigned long long* correct_part, DeviceStats* stats) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (lane == 0) {
    loss_part[warp] = loss;
    correct_part[warp] = correct;
  }
  __syncthreads();
  if (threadIdx.x == 0 && stats != nullptr) {
    double block_loss = 0;
    unsigned long long block_correct = 0;
    for (int i = 0; i < kDenseWarps; ++i) {
      block_loss += loss_part[i];
      block_correct += correct_part[i];
    }
    stats->loss_sum += block_loss;
    stats->correct += block_correct;
  }
}

}  // namespace

__global__ void __launch_bounds__(kDenseThreads)
    dense_forward(const float* __restrict__ h_last, const float* __restrict__ w,
                  const float* __restrict__ bias, const float* __restrict__ labels, int batch, int hidden,
                  float* __restrict__ probabilities, float* __restrict__ d_logits,
                  DeviceStats* __restrict__ stats) {
  __shared__ double loss_part[kDenseWarps];
  __shared__ unsigned long long correct_part[kDenseWarps];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss = 0;
  unsigned long long correct = 0;
  // b is the same for the whole warp, so every lane takes part in the shuffles.
  for (int b = warp; b < batch; b += kDenseWarps) {
    const float* h = h_last + static_cast<std::size_t>(b) * hidden;
    const float sum = warp_dot(w, h, hidden, lane);
    if (lane == 0) {
      const double z = static_cast<double>(sum + bias[0]);
      const double p = stable_sigmoid(z);
      if (probabilities != nullptr) probabilities[b] = static_cast<float>(p);
      if (labels != nullptr) {
        const double y = static_cast<double>(labels[b]);
        loss += logistic_loss(z, y);
        if (predicts_label(z, y)) ++correct;
        if (d_logits != nullptr) d_logits[b] = logit_gradient(static_cast<float>(p), labels[b], inv_batch);
      }
    }
  }
  add_block_stats(loss, correct, loss_part, correct_part, stats);
}

// Dense backward: d_w[j] = sum_b dz_b h_b[j] and d_b = sum_b dz_b (each a sum over b in order), and the
// gradient into the LSTM's last output, dy_last [B, H] = dz_b * w. Index i covers H + 1 + B*H items.
__global__ void dense_backward(const float* __restrict__ h_last, const float* __restrict__ d_logits,
                               const float* __restrict__ w, float* __restrict__ d_w, float* __restrict__ d_b,
                               float* __restrict__ dy_last, int batch, int hidden) {
  const std::size_t h = static_cast<std::size_t>(hidden);
  const std::size_t n = h + 1 + static_cast<std::size_t>(batch) * h;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (i < h) {
      float sum = 0.0f;
      for (int b = 0; b < batch; ++b) sum += d_logits[b] * h_last[static_cast<std::size_t>(b) * h + i];
      d_w[i] = sum;
    } else if (i == h) {
      float sum = 0.0f;
      for (int b = 0; b < batch; ++b) sum += d_logits[b];
      *d_b = sum;
    } else {
      const std::size_t k = i - h - 1;
      dy_last[k] = d_logits[k / h] * w[k % h];
    }
  }
}

__global__ void __launch_bounds__(kDenseThreads)
    dense_softmax_forward(const float* __restrict__ h_last, const float* __restrict__ w,
                          const float* __restrict__ bias, const float* __restrict__ labels, int batch,
                          int hidden, int classes, float* __restrict__ probabilities,
                          float* __restrict__ d_logits, DeviceStats* __restrict__ stats) {
  __shared__ double loss_part[kDenseWarps];
  __shared__ unsigned long long correct_part[kDenseWarps];
  __shared__ double logits[kDenseWarps][kMaxClasses];
  __shared__ double p[kDenseWarps][kMaxClasses];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  double loss = 0;
  unsigned long long correct = 0;
  for (int b = warp; b < batch; b += kDenseWarps) {
    const float* h = h_last + static_cast<std::size_t>(b) * hidden;
    for (int k = 0; k < classes; ++k) {
      const float* wk = w + static_cast<std::size_t>(k) * hidden;
      const float sum = warp_dot(wk, h, hidden, lane);
      if (lane == 0) logits[warp][k] = static_cast<double>(sum + bias[k]);
    }
    if (lane == 0) {
      const int label = labels != nullptr ? static_cast<int>(labels[b]) : -1;
      const double sample_loss = softmax_loss(logits[warp], classes, label, p[warp]);
      const std::size_t row = static_cast<std::size_t>(b) * classes;
      if (probabilities != nullptr) {
        for (int k = 0; k < classes; ++k) probabilities[row + k] = static_cast<float>(p[warp][k]);
      }
      if (label >= 0) {
        loss += sample_loss;
        if (predicted_class(logits[warp], classes) == label) ++correct;
        if (d_logits != nullptr) {
          for (int k = 0; k < classes; ++k) {
            d_logits[row + k] =
                logit_gradient(static_cast<float>(p[warp][k]), k == label ? 1.0f : 0.0f, inv_batch);
          }
        }
      }
    }
    __syncwarp();
  }
  add_block_stats(loss, correct, loss_part, correct_part, stats);
}

__global__ void dense_softmax_backward(const float* __restrict__ h_last, const float* __restrict__ d_logits,
                                       const float* __restrict__ w, float* __restrict__ d_w,
                                       float* __restrict__ d_b, float* __restrict__ dy_last, int batch,
                                       int hidden, int classes) {
  const std::size_t h = static_cast<std::size_t>(hidden);
  const std::size_t k_count = static_cast<std::size_t>(classes);
  const std::size_t weights = k_count * h;
  const std::size_t n = weights + k_count + static_cast<std::size_t>(batch) * h;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (i < weights) {
      const std::size_t k = i / h, j = i % h;
      float sum = 0.0f;
      for (int b = 0; b < batch; ++b) {
        sum +=
            d_logits[static_cast<std::size_t>(b) * k_count + k] * h_last[static_cast<std::size_t>(b) * h + j];
      }
      d_w[i] = sum;
    } else if (i < weights + k_count) {
      const std::size_t k = i - weights;
      float sum = 0.0f;
      for (int b = 0; b < batch; ++b) sum += d_logits[static_cast<std::size_t>(b) * k_count + k];
      d_b[k] = sum;
    } else {
      const std::size_t e = i - weights - k_count;
      const std::size_t b = e / h, j = e % h;
      float sum = d_logits[b * k_count] * w[j];
      for (std::size_t k = 1; k < k_count; ++k) sum += d_logits[b * k_count + k] * w[k * h + j];
      dy_last[e] = sum;
    }
  }
}

// Copies every run of the table (blockIdx.y picks the run) between the canonical buffer and cuDNN's weight
// space: canonical -> cuDNN before a forward, cuDNN -> canonical for the weight gradients.
namespace {

__device__ inline float widen(float value, bool /*half*/) {
  return value;
}
__device__ inline float widen(SixteenBits value, bool half) {
  return half ? half_to_float(value) : bfloat16_to_float(value);
}
__device__ inline void narrow(float value, bool /*half*/, float& to) {
  to = value;
}
__device__ inline void narrow(float value, bool half, SixteenBits& to) {
  to = half ? float_to_half(value) : float_to_bfloat16(value);
}

// One run of a weight table per blockIdx.y, each element converted and scaled.
template <typename Source, typename Target>
__device__ void copy_runs(const WeightRun* __restrict__ runs, const Source* __restrict__ source,
                          Target* __restrict__ target, bool to_cudnn, bool half, float scale) {
  const WeightRun run = runs[blockIdx.y];
  const std::size_t from = to_cudnn ? run.canonical : run.cudnn;
  const std::size_t to = to_cudnn ? run.cudnn : run.canonical;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < run.count;
       i += stride) {
    narrow(widen(source[from + i], half) * scale, half, target[to + i]);
  }
}

}  // namespace

__global__ void copy_weight_runs(const WeightRun* __restrict__ runs, const float* __restrict__ source,
                                 float* __restrict__ target, bool to_cudnn) {
  copy_runs(runs, source, target, to_cudnn, false, 1.0f);
}

__global__ void gather_weight_runs_16(const WeightRun* __restrict__ runs, const float* __restrict__ canonical,
                                      SixteenBits* __restrict__ space, bool half) {
  copy_runs(runs, canonical, space, /*to_cudnn=*/true, half, 1.0f);
}

__global__ void scatter_weight_runs_16(const WeightRun* __restrict__ runs,
                                       const SixteenBits* __restrict__ space, float* __restrict__ canonical,
                                       bool half, float scale) {
  copy_runs(runs, space, canonical, /*to_cudnn=*/false, half, scale);
}

__global__ void to_sixteen(const float* __restrict__ from, SixteenBits* __restrict__ to, std::size_t n,
                           bool half, float scale) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    narrow(from[i] * scale, half, to[i]);
  }
}

__global__ void from_sixteen(const SixteenBits* __restrict__ from, float* __restrict__ to, std::size_t n,
                             bool half, float scale) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    to[i] = widen(from[i], half) * scale;
  }
}

__global__ void flag_nonfinite(const float* __restrict__ values, std::size_t n,
                               unsigned int* __restrict__ flag) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if (!isfinite(values[i])) {
      *flag = 1u;  // any writer's 1 will do
      return;
    }
  }
}

__global__ void embedding_dropout(float* __restrict__ values, const int32_t* __restrict__ starts, int batch,
                                  int seq, int embed, const uint64_t* __restrict__ stream_on_device,
                                  double rate) {
  const uint64_t stream = *stream_on_device;
  const std::size_t n = static_cast<std::size_t>(seq) * batch * embed;
  const std::size_t grid_stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += grid_stride) {
    const std::size_t row = i / embed;
    const std::size_t b = row % batch;
    const std::size_t t = row / batch + (starts != nullptr ? static_cast<std::size_t>(starts[b]) : 0);
    if (t >= static_cast<std::size_t>(seq)) continue;
    values[i] *= dropout_mask_value<float>(stream, (t * batch + b) * embed + i % embed, rate);
  }
}

namespace {

// Element i of final_states [B, D*H]: its entry of cuDNN's hy [L*D, B, H], in the top layer.
__device__ inline std::size_t top_layer_state(std::size_t i, int layers, int directions, int batch,
                                              int hidden) {
  const std::size_t width = static_cast<std::size_t>(directions) * hidden;
  const std::size_t b = i / width;
  const std::size_t d = i % width / hidden;
  return ((static_cast<std::size_t>(layers - 1) * directions + d) * batch + b) * hidden + i % hidden;
}

}  // namespace

__global__ void gather_final_states(const float* __restrict__ hy, float* __restrict__ final_states,
                                    int layers, int directions, int batch, int hidden) {
  const std::size_t n = static_cast<std::size_t>(batch) * directions * hidden;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    final_states[i] = hy[top_layer_state(i, layers, directions, batch, hidden)];
  }
}

__global__ void scatter_final_states(const float* __restrict__ d_final, float* __restrict__ dhy, int layers,
                                     int directions, int batch, int hidden) {
  const std::size_t n = static_cast<std::size_t>(batch) * directions * hidden;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dhy[top_layer_state(i, layers, directions, batch, hidden)] = d_final[i];
  }
}

}  // namespace ddp::models::kernels

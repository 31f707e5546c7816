// The CUDA replica's own kernels around cuDNN's recurrent layers (rnn_classifier_cuda.cu launches them): the
// embedding lookup and its gradient, the dense layer with sigmoid and BCE (the output layer's math is
// output_math.h's, shared with the CPU replica and tested on the host), and the copies between the
// canonical parameters and cuDNN's weight space. Grid-stride loops, so any grid covers any size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "models/weight_map.h"

namespace ddp::models::kernels {

constexpr int kThreads = 256;
constexpr int kDenseThreads = 256;
constexpr int kDenseWarps = kDenseThreads / 32;

// Running sums of the batches since the last take_stats(), on the device.
struct DeviceStats {
  double loss_sum;
  unsigned long long correct;
};

using models::WeightRun;

__global__ void fill_int32(int32_t* out, int n, int32_t value);

// Masking: each row's first real step (sequence_mask.h) and its length seq - start, for cuDNN's per-sample
// lengths and the shifted embedding below.
__global__ void sequence_starts(const int32_t* __restrict__ tokens, int batch, int seq,
                                int32_t* __restrict__ starts, int32_t* __restrict__ lengths);

// Embedding lookup: tokens [B, T] row-major into x [T, B, E] time-major (row t*B+b is token (b, t)). A token
// outside the vocabulary reads as zeros and raises *bad_token, reported on the host at the next sync. With
// `starts` (masking), row t*B+b is token (b, t + starts[b]) instead: each sequence begins at time 0, as
// cuDNN's per-sample lengths want, and rows past its end are zeros.
__global__ void embedding_forward(const int32_t* __restrict__ tokens, const int32_t* __restrict__ starts,
                                  const float* __restrict__ embedding, float* __restrict__ x, int batch,
                                  int seq, int embed, int vocab, unsigned int* __restrict__ bad_token);

// The embedding gradient: row `token` gathers dx of every occurrence (shifted by `starts` as the forward).
// The rows were zeroed before; atomics add repeated tokens in whatever order the GPU runs them (float
// rounding makes that order visible).
__global__ void embedding_backward(const int32_t* __restrict__ tokens, const int32_t* __restrict__ starts,
                                   const float* __restrict__ dx, float* __restrict__ d_embedding, int batch,
                                   int seq, int embed, int vocab);

// Embedding dropout (model.embedding_dropout) on x or dx [T, B, E], in place: the CPU replica's mask
// (dropout.h) element for element, under the same draw's `stream`, read from the device (store_uint64'd by
// the step's host part, so that a CUDA graph's replay draws each step's own). With `starts`, x's row t*B+b
// holds time t + starts[b] of the CPU's unshifted rows; rows past a shifted sequence's end are left as
// they are.
__global__ void embedding_dropout(float* __restrict__ values, const int32_t* __restrict__ starts, int batch,
                                  int seq, int embed, const uint64_t* __restrict__ stream, double rate);
// *to = value, on the stream: a kernel argument is copied at the launch, so no host buffer must outlive it.
__global__ void store_uint64(uint64_t value, uint64_t* to);

// The dense layer's input when it reads final states (bidirectional or masked): cuDNN's hy [L*D, B, H]
// (layer-major, directions inner) -> final_states [B, D*H], the top layer's directions side by side (forward
// first), as the CPU replica concatenates them.
__global__ void gather_final_states(const float* __restrict__ hy, float* __restrict__ final_states,
                                    int layers, int directions, int batch, int hidden);

// Its transpose for the backward: d_final [B, D*H] into dhy's top layer; the other layers' entries are left
// as they are (zero).
__global__ void scatter_final_states(const float* __restrict__ d_final, float* __restrict__ dhy, int layers,
                                     int directions, int batch, int hidden);

// The dense kernels' `hidden` is the width of their input, directions x hidden (gather_final_states).
// The dense layer on the top layer's last hidden state h_last [B, H], then sigmoid and BCE, in one block: a
// warp per sample, the block's sums in a fixed order. Optional outputs: probabilities [B]; with labels,
// d_logits [B] = d(mean loss)/dz = (p - y) / B and the running stats (loss in double, as the CPU does).
__global__ void __launch_bounds__(kDenseThreads)
    dense_forward(const float* __restrict__ h_last, const float* __restrict__ w,
                  const float* __restrict__ bias, const float* __restrict__ labels, int batch, int hidden,
                  float* __restrict__ probabilities, float* __restrict__ d_logits,
                  DeviceStats* __restrict__ stats);

// Dense backward: d_w[j] = sum_b dz_b h_b[j] and d_b = sum_b dz_b (each a sum over b in order), and the
// gradient into the LSTM's last output, dy_last [B, H] = dz_b * w. Index i covers H + 1 + B*H items.
__global__ void dense_backward(const float* __restrict__ h_last, const float* __restrict__ d_logits,
                               const float* __restrict__ w, float* __restrict__ d_w, float* __restrict__ d_b,
                               float* __restrict__ dy_last, int batch, int hidden);

// The most classes the softmax kernel takes (labels are one byte).
constexpr int kMaxClasses = 256;

// More than two classes: Dense(K) on h_last [B, H], softmax and categorical cross-entropy, in one block: a
// warp per sample computes its K logits, lane 0 the softmax in double (output_math.h, as the CPU). Optional
// outputs: probabilities [B, K]; with labels (class ids), d_logits [B, K] = (p - onehot) / B and the running
// stats (correct: the most probable class is the label).
__global__ void __launch_bounds__(kDenseThreads)
    dense_softmax_forward(const float* __restrict__ h_last, const float* __restrict__ w,
                          const float* __restrict__ bias, const float* __restrict__ labels, int batch,
                          int hidden, int classes, float* __restrict__ probabilities,
                          float* __restrict__ d_logits, DeviceStats* __restrict__ stats);

// Its backward: d_w[k, j] = sum_b dz[b, k] h_b[j], d_b[k] = sum_b dz[b, k] (sums over b in order) and
// dy_last [B, H] = sum_k dz[b, k] w[k, :]. Index i covers K*H + K + B*H items.
__global__ void dense_softmax_backward(const float* __restrict__ h_last, const float* __restrict__ d_logits,
                                       const float* __restrict__ w, float* __restrict__ d_w,
                                       float* __restrict__ d_b, float* __restrict__ dy_last, int batch,
                                       int hidden, int classes);

// model.precision = bf16 | fp16: cuDNN's recurrent layers read and write 16-bit data, held as its bits
// (engine/base/float16.h's casts, tested on the host): bfloat16, or IEEE half where `half`. The replica's own
// kernels and buffers stay float.
using SixteenBits = uint16_t;

// Copies every run of the table (blockIdx.y picks the run) between the canonical buffer and cuDNN's weight
// space: canonical -> cuDNN before a forward, cuDNN -> canonical for the weight gradients. The 16-bit ones
// convert on the way (float -> 16 bits rounds to nearest even; back is exact, then times `scale`: fp16's
// 1 / loss scale).
__global__ void copy_weight_runs(const WeightRun* __restrict__ runs, const float* __restrict__ source,
                                 float* __restrict__ target, bool to_cudnn);
__global__ void gather_weight_runs_16(const WeightRun* __restrict__ runs, const float* __restrict__ canonical,
                                      SixteenBits* __restrict__ space, bool half);
__global__ void scatter_weight_runs_16(const WeightRun* __restrict__ runs,
                                       const SixteenBits* __restrict__ space, float* __restrict__ canonical,
                                       bool half, float scale);

// n elements: to[i] = 16-bit(from[i] x scale) (to nearest even), or to[i] = float(from[i]) x scale. The
// scales are fp16's loss scale and its inverse, powers of two (exact); 1 otherwise.
__global__ void to_sixteen(const float* __restrict__ from, SixteenBits* __restrict__ to, std::size_t n,
                           bool half, float scale);
__global__ void from_sixteen(const SixteenBits* __restrict__ from, float* __restrict__ to, std::size_t n,
                             bool half, float scale);

// *flag becomes nonzero if any of the n values is not finite (fp16's overflow check).
__global__ void flag_nonfinite(const float* __restrict__ values, std::size_t n,
                               unsigned int* __restrict__ flag);

}  // namespace ddp::models::kernels

#include "models/rnn_classifier_cpu.h"
#include "models/sequence_mask.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/base/errors.h"
#include "engine/base/fast_math.h"
#include "engine/base/parallel_loops.h"
#include "engine/base/timeline.h"
#include "models/blas.h"
#include "models/blas_threads.h"
#include "models/dropout.h"
#include "models/fma_rate.h"
#include "models/output_math.h"

namespace ddp::models {
namespace {

// A batch's rows of the embedding (and of its gradient) are scattered over a matrix of megabytes, each a few
// cache lines that no hardware prefetcher sees coming, and a step's other work has evicted them: the loops
// over them ask for the row kRowsAhead tokens on while they copy this one.
constexpr std::size_t kRowsAhead = 8;
// Fewer rows than this per thread are not worth a parallel region's start (a row is a few cache lines).
constexpr std::size_t kMinRowsPerThread = 256;
// The recurrent layers split the batch between the compute threads in blocks of this many rows, at least
// this many each: fewer rows make the recurrent products too thin for the matrix kernels.
constexpr std::size_t kBatchRowsAlign = 4;
constexpr std::size_t kMinBatchRowsPerThread = 8;
// A weight gradient's rows split the same way: whole register tiles of the matrix kernels each.
constexpr std::size_t kProductRowsAlign = 16;
constexpr std::size_t kMinProductRowsPerThread = 64;

// The token of time-major row k (k = t * batch + b) of a [batch, seq] row-major token matrix.
int32_t token_of_row(const int32_t* tokens, std::size_t k, int batch, int seq) {
  const auto b = k % static_cast<std::size_t>(batch), t = k / static_cast<std::size_t>(batch);
  return tokens[b * static_cast<std::size_t>(seq) + t];
}

// About how many batch rows each compute thread takes in the recurrent layers (parallel_ranges' split).
int rows_per_thread(int batch) {
  const int threads = std::max(1, std::min(loop_threads(), batch / static_cast<int>(kMinBatchRowsPerThread)));
  return (batch + threads - 1) / threads;
}

template <typename Scalar>
void prefetch_row(const Scalar* row, std::size_t width) {
  for (std::size_t j = 0; j < width; j += 64 / sizeof(Scalar)) __builtin_prefetch(row + j);
}

std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

// The gate nonlinearities: the vectorizable ones of fast_math.h in float, the standard library's in double,
// which stays the reference of the gradient checks.
inline float sigmoid(float x) {
  return fast::sigmoid(x);
}
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
inline float activation_tanh(float x) {
  return fast::tanh(x);
}
inline double activation_tanh(double x) {
  return std::tanh(x);
}

template <typename Scalar>
void grow(std::vector<Scalar>& buffer, std::size_t size) {
  if (buffer.size() < size) buffer.resize(size);
}

// One batch row of one time step, forward, in one pass over the H units: the gate pre-activations (i, f,
// g, o, each H wide) become their activations, then c = f*c_prev + i*g, tanh(c) and h = o*tanh(c).
template <typename Scalar>
DDP_VECTOR_CLONES void cell_forward(Scalar* __restrict gi, Scalar* __restrict gf, Scalar* __restrict gg,
                                    Scalar* __restrict go, const Scalar* __restrict c_prev,
                                    Scalar* __restrict c, Scalar* __restrict c_tanh, Scalar* __restrict h,
                                    std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    const Scalar i = sigmoid(gi[j]);
    const Scalar f = sigmoid(gf[j]);
    const Scalar g = activation_tanh(gg[j]);
    const Scalar o = sigmoid(go[j]);
    gi[j] = i;
    gf[j] = f;
    gg[j] = g;
    go[j] = o;
    const Scalar cj = f * c_prev[j] + i * g;
    const Scalar tc = activation_tanh(cj);
    c[j] = cj;
    c_tanh[j] = tc;
    h[j] = o * tc;
  }
}

// One batch row of one time step, backward: from the gradient into h (dy from above, if kHasDy, plus dh
// through the recurrence) and into c (dc, updated in place to the gradient into c_prev) to the gradients
// before the activations (di, df, dg, d_o), which the bias gradient (db_*) also accumulates.
template <bool kHasDy, typename Scalar>
DDP_VECTOR_CLONES void cell_backward(const Scalar* __restrict gi, const Scalar* __restrict gf,
                                     const Scalar* __restrict gg, const Scalar* __restrict go,
                                     const Scalar* __restrict c_prev, const Scalar* __restrict c_tanh,
                                     const Scalar* __restrict dy, const Scalar* __restrict dh,
                                     Scalar* __restrict dc, Scalar* __restrict di, Scalar* __restrict df,
                                     Scalar* __restrict dg, Scalar* __restrict d_o, Scalar* __restrict db_i,
                                     Scalar* __restrict db_f, Scalar* __restrict db_g,
                                     Scalar* __restrict db_o, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    Scalar dh_total = dh[j];
    if constexpr (kHasDy) dh_total += dy[j];
    const Scalar i = gi[j];
    const Scalar f = gf[j];
    const Scalar g = gg[j];
    const Scalar o = go[j];
    const Scalar tc = c_tanh[j];
    const Scalar dc_total = dc[j] + dh_total * o * (Scalar(1) - tc * tc);
    // Derivatives before the activations: sigmoid' = s(1-s), tanh' = 1-t^2.
    const Scalar d_i = dc_total * g * i * (Scalar(1) - i);
    const Scalar d_f = dc_total * c_prev[j] * f * (Scalar(1) - f);
    const Scalar d_g = dc_total * i * (Scalar(1) - g * g);
    const Scalar d_out = dh_total * tc * o * (Scalar(1) - o);
    di[j] = d_i;
    df[j] = d_f;
    dg[j] = d_g;
    d_o[j] = d_out;
    db_i[j] += d_i;
    db_f[j] += d_f;
    db_g[j] += d_g;
    db_o[j] += d_out;
    dc[j] = dc_total * f;
  }
}

// GRU, one batch row of one time step, forward: from the input side's pre-activations (r, z, n, each H wide;
// W_i x + b_i) and the recurrent side's (W_h h_prev + b_h) to the gates' activations (in place) and h, as
// cuDNN and PyTorch compute it: n = tanh(x_n + r * (W_hn h + b_hn)), h = (1 - z) n + z h_prev. Keeps the
// recurrent side of n, which backward needs.
template <typename Scalar>
DDP_VECTOR_CLONES void gru_cell_forward(Scalar* __restrict gr, Scalar* __restrict gz, Scalar* __restrict gn,
                                        const Scalar* __restrict rr, const Scalar* __restrict rz,
                                        const Scalar* __restrict rn, Scalar* __restrict kept_rn,
                                        const Scalar* __restrict h_prev, Scalar* __restrict h,
                                        std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    const Scalar r = sigmoid(gr[j] + rr[j]);
    const Scalar z = sigmoid(gz[j] + rz[j]);
    const Scalar c = activation_tanh(gn[j] + r * rn[j]);
    gr[j] = r;
    gz[j] = z;
    gn[j] = c;
    kept_rn[j] = rn[j];
    h[j] = (Scalar(1) - z) * c + z * h_prev[j];
  }
}

// GRU, one batch row of one time step, backward: from the gradient into h (dy from above, if kHasDy, plus dh
// through the recurrence) to the gradients before the activations on the input side (dx_*) and on the
// recurrent side (dh_*: n's is multiplied by r), which the biases' gradients accumulate, and the part of the
// gradient into h_prev that does not pass through W_hh (written over dh).
template <bool kHasDy, typename Scalar>
DDP_VECTOR_CLONES void gru_cell_backward(const Scalar* __restrict gr, const Scalar* __restrict gz,
                                         const Scalar* __restrict gn, const Scalar* __restrict rn,
                                         const Scalar* __restrict h_prev, const Scalar* __restrict dy,
                                         Scalar* __restrict dh, Scalar* __restrict dx_r,
                                         Scalar* __restrict dx_z, Scalar* __restrict dx_n,
                                         Scalar* __restrict dh_r, Scalar* __restrict dh_z,
                                         Scalar* __restrict dh_n, Scalar* __restrict db_ih,
                                         Scalar* __restrict db_hh, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) {
    Scalar dh_total = dh[j];
    if constexpr (kHasDy) dh_total += dy[j];
    const Scalar r = gr[j];
    const Scalar z = gz[j];
    const Scalar c = gn[j];
    const Scalar d_n = dh_total * (Scalar(1) - z) * (Scalar(1) - c * c);
    const Scalar d_z = dh_total * (h_prev[j] - c) * z * (Scalar(1) - z);
    const Scalar d_r = d_n * rn[j] * r * (Scalar(1) - r);
    const Scalar d_rn = d_n * r;
    dx_r[j] = d_r;
    dx_z[j] = d_z;
    dx_n[j] = d_n;
    dh_r[j] = d_r;
    dh_z[j] = d_z;
    dh_n[j] = d_rn;
    db_ih[j] += d_r;
    db_ih[n + j] += d_z;
    db_ih[2 * n + j] += d_n;
    db_hh[j] += d_r;
    db_hh[n + j] += d_z;
    db_hh[2 * n + j] += d_rn;
    dh[j] = dh_total * z;
  }
}

}  // namespace

template <typename Scalar>
CpuRnnClassifier<Scalar>::CpuRnnClassifier(const ModelShape& shape, const ModelOptions& options)
    : layout_(shape), options_(options), params_(layout_.total_size()), grads_(layout_.total_size()) {
  if (!(options.dropout >= 0 && options.dropout < 1) ||
      !(options.embedding_dropout >= 0 && options.embedding_dropout < 1)) {
    throw std::invalid_argument("CpuRnnClassifier: dropout rates must lie in [0, 1)");
  }
  embedding_offset_ = layout_.tensor("embedding").offset;
  dense_w_offset_ = layout_.tensor("dense.w").offset;
  dense_b_offset_ = layout_.tensor("dense.b").offset;
  layers_.resize(to_size(shape.layers));
  for (int l = 0; l < shape.layers; ++l) {
    Layer& layer = layers_[to_size(l)];
    layer.in = l == 0 ? shape.embedding_dim : shape.output_width();
    layer.directions.resize(to_size(shape.directions()));
    for (int d = 0; d < shape.directions(); ++d) {
      const std::string prefix = shape.tensor_prefix(l, d) + ".";
      Direction& direction = layer.directions[to_size(d)];
      direction.w_ih = layout_.tensor(prefix + "w_ih").offset;
      direction.w_hh = layout_.tensor(prefix + "w_hh").offset;
      direction.b_ih = layout_.tensor(prefix + "b_ih").offset;
      direction.b_hh = layout_.tensor(prefix + "b_hh").offset;
      direction.reverse = d == 1;
    }
  }
  row_seen_.assign(to_size(shape.vocab_size), 0);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::use_onednn() {
  if constexpr (!std::is_same_v<Scalar, float>) {
    throw std::runtime_error("CpuRnnClassifier: oneDNN runs the float path only");
  } else {
    const ModelShape& shape = layout_.shape();
    onednn_.clear();
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      for (int d = 0; d < shape.directions(); ++d) onednn_.push_back(make_onednn_layer(shape.cell, d == 1));
    }
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::use_onednn_products() {
  if constexpr (!std::is_same_v<Scalar, float>) {
    throw std::runtime_error("CpuRnnClassifier: oneDNN's sgemm runs the float path only");
  } else {
    if (!onednn_missing().empty()) throw std::runtime_error("CpuRnnClassifier: " + onednn_missing());
    onednn_products_ = true;
    onednn_weight_gradients_ = onednn_runs_avx512();
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::use_packed_recurrent() {
  if constexpr (!std::is_same_v<Scalar, float>) {
    throw std::runtime_error("CpuRnnClassifier: the packed products run the float path only");
  } else {
    if (!packed_gemm_missing().empty())
      throw std::runtime_error("CpuRnnClassifier: " + packed_gemm_missing());
    packed_recurrent_ = true;
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::pack_recurrent_weights(Direction& dir, bool transposed, int rows) {
  if constexpr (std::is_same_v<Scalar, float>) {
    if (!packed_recurrent_) return;
    const int hidden = layout_.shape().hidden, gate_width = layout_.shape().gates() * hidden;
    // The forward pass multiplies by W_hh^T [H, G*H], backward by W_hh [G*H, H]; both read W_hh [G*H, H].
    dir.packed_w_hh.pack(transposed, transposed ? hidden : gate_width, transposed ? gate_width : hidden,
                         params_.data() + dir.w_hh, hidden, rows);
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::recurrent_product(const Direction& dir, bool transposed, int m, int n, int k,
                                                 const Scalar* a, const Scalar* w_hh, bool accumulate,
                                                 Scalar* c) const {
  if constexpr (std::is_same_v<Scalar, float>) {
    if (packed_recurrent_) {
      packed_gemm(false, m, a, k, dir.packed_w_hh, accumulate, c, n);
      return;
    }
  }
  product(Trans::kNo, transposed ? Trans::kYes : Trans::kNo, m, n, k, Scalar(1), a, k, w_hh,
          layout_.shape().hidden, accumulate ? Scalar(1) : Scalar(0), c, n);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::product(Trans trans_a, Trans trans_b, int m, int n, int k, Scalar alpha,
                                       const Scalar* a, int lda, const Scalar* b, int ldb, Scalar beta,
                                       Scalar* c, int ldc) const {
  if constexpr (std::is_same_v<Scalar, float>) {
    if (onednn_products_ && trans_a == Trans::kNo) {
      onednn_sgemm(false, trans_b == Trans::kYes, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    }
    if (onednn_products_ || packed_recurrent_) {
      // The compute threads each take a block of C's rows, every entry's sum over k on one thread whatever
      // their number (so no thread count changes a bit), the library on one thread inside the parallel
      // region: the weight gradients (A transposed), on oneDNN's sgemm where it runs AVX-512 and on the BLAS
      // where oneDNN runs AVX2 (each the faster there, gemm_library_bench), and with the packed tiles in a
      // build without oneDNN every product.
      const bool on_onednn = onednn_weight_gradients_ && trans_a == Trans::kYes;
      parallel_ranges(to_size(m), kProductRowsAlign, kMinProductRowsPerThread,
                      [&](std::size_t r0, std::size_t r1) {
                        const Scalar* a_rows = trans_a == Trans::kYes ? a + r0 : a + r0 * to_size(lda);
                        const int rows = static_cast<int>(r1 - r0);
                        Scalar* c_rows = c + r0 * to_size(ldc);
                        if (on_onednn) {
                          onednn_sgemm(true, trans_b == Trans::kYes, rows, n, k, alpha, a_rows, lda, b, ldb,
                                       beta, c_rows, ldc);
                        } else {
                          gemm(trans_a, trans_b, rows, n, k, alpha, a_rows, lda, b, ldb, beta, c_rows, ldc);
                        }
                      });
      return;
    }
  }
  gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// oneDNN has no per-sample lengths. With masking the forward direction runs on rows shifted left by their
// padding (real tokens from time 0, zeros after them, whose steps come after the last real one and so change
// nothing before it), the reverse direction on the rows as they are, from the last step back to the first
// real one (the padding's steps come after it); what the builtin kernels keep at padded steps (the carried
// state) is put back afterwards, so the layer's outputs are theirs.
template <typename Scalar>
void CpuRnnClassifier<Scalar>::shift_rows(const Scalar* from, Scalar* to, std::size_t width, int batch,
                                          int seq, bool left) const {
  const auto b_count = to_size(batch);
  for (std::size_t b = 0; b < b_count; ++b) {
    const auto start = to_size(starts_[b]);
    for (std::size_t t = 0; t < to_size(seq); ++t) {
      Scalar* out = to + (t * b_count + b) * width;
      // left: to[t] = from[t + start] (zero past the sample's length); right: to[t] = from[t - start].
      const bool inside = left ? t + start < to_size(seq) : t >= start;
      if (!inside) {
        std::fill_n(out, width, Scalar(0));
        continue;
      }
      const std::size_t source = left ? t + start : t - start;
      std::copy_n(from + (source * b_count + b) * width, width, out);
    }
  }
}

template <typename Scalar>
LstmLayerBuffers CpuRnnClassifier<Scalar>::onednn_buffers(int layer, int direction, int batch, int seq) {
  LstmLayerBuffers b;
  if constexpr (std::is_same_v<Scalar, float>) {
    Layer& l = layers_[to_size(layer)];
    Direction& t = l.directions[to_size(direction)];
    const int hidden = layout_.shape().hidden;
    const auto step_states = to_size(batch) * to_size(hidden);
    const bool shifted = options_.mask_padding && !t.reverse;
    b.batch = batch;
    b.seq = seq;
    b.input = l.in;
    b.hidden = hidden;
    b.x = shifted ? onednn_x_.data() : layer_input(layer, batch);
    // Forward: the states after each time, blocks 1..T (block 0 the initial zeros), or a shifted copy;
    // reverse: blocks 0..T-1 (block T the initial zeros).
    b.h = shifted ? onednn_y_.data() : t.states.data() + (t.reverse ? 0 : step_states);
    b.w_ih = params_.data() + t.w_ih;
    b.w_hh = params_.data() + t.w_hh;
    b.b_ih = params_.data() + t.b_ih;
    b.b_hh = params_.data() + t.b_hh;
  }
  return b;
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::forward_layer_onednn(int layer, int batch, int seq) {
  if constexpr (std::is_same_v<Scalar, float>) {
    const ModelShape& shape = layout_.shape();
    Layer& l = layers_[to_size(layer)];
    const auto hidden = to_size(shape.hidden);
    const auto b_count = to_size(batch);
    const std::size_t step_states = b_count * hidden;
    for (int d = 0; d < shape.directions(); ++d) {
      Direction& dir = l.directions[to_size(d)];
      Scalar* states = dir.states.data();
      const std::size_t initial_block = dir.reverse ? to_size(seq) : 0;
      std::fill_n(states + initial_block * step_states, step_states, Scalar(0));
      const bool shifted = options_.mask_padding && !dir.reverse;
      if (shifted) shift_rows(layer_input(layer, batch), onednn_x_.data(), to_size(l.in), batch, seq, true);
      onednn_[to_size(layer * shape.directions() + d)]->forward(onednn_buffers(layer, d, batch, seq));
      if (shifted) shift_rows(onednn_y_.data(), states + step_states, hidden, batch, seq, false);
      if (options_.mask_padding && dir.reverse) {
        // At padded steps the state carries the one after the first real token.
        for (std::size_t b = 0; b < b_count; ++b) {
          const auto start = to_size(starts_[b]);
          for (std::size_t t = 0; t < start; ++t) {
            std::copy_n(states + start * step_states + b * hidden, hidden,
                        states + t * step_states + b * hidden);
          }
        }
      }
    }
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::backward_layer_onednn(int layer, int batch, int seq, bool dy_every_step) {
  if constexpr (std::is_same_v<Scalar, float>) {
    const ModelShape& shape = layout_.shape();
    const Layer& l = layers_[to_size(layer)];
    const auto hidden = to_size(shape.hidden);
    const auto width = to_size(shape.output_width());
    const auto b_count = to_size(batch);
    const std::size_t rows = b_count * to_size(seq);
    // Each direction's output gradient, [T*B, H], gathered before the input gradients overwrite d_output_
    // (the layer below's): every row, or the top layer's final step only (forward: time T-1, reverse: time
    // 0, which with masking is the carried state of the first real step).
    for (int d = 0; d < shape.directions(); ++d) {
      const Direction& dir = l.directions[to_size(d)];
      Scalar* dy = onednn_dy_[to_size(d)].data();
      std::fill_n(dy, rows * hidden, Scalar(0));
      const Scalar* source = d_output_.data() + to_size(d) * hidden;
      for (std::size_t t = 0; t < to_size(seq); ++t) {
        const bool final_time = dir.reverse ? t == 0 : t + 1 == to_size(seq);
        if (!dy_every_step && !final_time) continue;
        for (std::size_t b = 0; b < b_count; ++b) {
          // Masked, the reverse direction's padded steps are copies of its state at the first real step.
          const std::size_t at = options_.mask_padding && dir.reverse ? std::max(t, to_size(starts_[b])) : t;
          const Scalar* from = source + (t * b_count + b) * width;
          Scalar* to = dy + (at * b_count + b) * hidden;
          for (std::size_t j = 0; j < hidden; ++j) to[j] += from[j];
        }
      }
      if (options_.mask_padding && !dir.reverse) {
        shift_rows(dy, onednn_x_.data(), hidden, batch, seq, true);  // onednn_x_ as scratch
        std::copy_n(onednn_x_.data(), rows * hidden, dy);
      }
    }
    // Backward of each direction, then the sum of their input gradients into the layer below's outputs (or
    // the embedding's).
    Scalar* d_input = layer > 0 ? d_output_.data() : d_embedded_.data();
    const std::size_t input_size = rows * to_size(l.in);
    for (int d = 0; d < shape.directions(); ++d) {
      const Direction& dir = l.directions[to_size(d)];
      const bool shifted = options_.mask_padding && !dir.reverse;
      LstmLayerBuffers buffers = onednn_buffers(layer, d, batch, seq);
      if (shifted) {
        // The forward's shifted input and outputs again (the input buffer served as scratch).
        shift_rows(layer_input(layer, batch), onednn_x_.data(), to_size(l.in), batch, seq, true);
        shift_rows(dir.states.data() + b_count * hidden, onednn_y_.data(), hidden, batch, seq, true);
      }
      // The first direction's input gradient goes straight to its place, unless it comes back shifted.
      const bool dx_in_place = d == 0 && !shifted;
      LstmLayerGradients g;
      g.dh = onednn_dy_[to_size(d)].data();
      g.dx = dx_in_place ? d_input : onednn_dx_.data();
      g.dw_ih = grads_.data() + dir.w_ih;
      g.dw_hh = grads_.data() + dir.w_hh;
      g.db_ih = grads_.data() + dir.b_ih;
      g.db_hh = grads_.data() + dir.b_hh;
      onednn_[to_size(layer * shape.directions() + d)]->backward(buffers, g);
      const Scalar* dx = onednn_dx_.data();
      if (shifted) {
        shift_rows(onednn_dx_.data(), onednn_y_.data(), to_size(l.in), batch, seq, false);
        dx = onednn_y_.data();
      }
      if (d > 0) {
        for (std::size_t i = 0; i < input_size; ++i) d_input[i] += dx[i];
      } else if (!dx_in_place) {
        std::copy_n(dx, input_size, d_input);
      }
    }
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::resize_workspace(int batch, int seq) {
  const ModelShape& shape = layout_.shape();
  const std::size_t rows = to_size(batch) * to_size(seq);
  const std::size_t rows_with_initial = rows + to_size(batch);
  const auto embed = to_size(shape.embedding_dim);
  const auto hidden = to_size(shape.hidden);
  const auto gate_width = to_size(shape.gates()) * hidden;
  const auto width = to_size(shape.output_width());
  const bool lstm = shape.cell == Cell::kLstm;
  grow(embedded_, rows * embed);
  if (options_.embedding_dropout > 0) {
    grow(embedded_dropped_, rows * embed);
    grow(embedding_mask_, rows * embed);
  }
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    Layer& layer = layers_[l];
    for (Direction& d : layer.directions) {
      grow(d.gates, rows * gate_width);
      grow(d.states, rows_with_initial * hidden);
      grow(d.d_gates, rows * gate_width);
      if (lstm) {
        grow(d.cell, rows_with_initial * hidden);
        grow(d.cell_tanh, rows * hidden);
      } else {
        grow(d.recurrent, rows * hidden);
        grow(d.d_gates_h, rows * gate_width);
      }
    }
    if (shape.bidirectional) grow(layer.output, rows * width);
    if (options_.dropout > 0 && l + 1 < layers_.size()) {
      grow(layer.dropped, rows * width);
      grow(layer.dropout_mask, rows * width);
    }
  }
  if (!lstm) grow(recurrent_, to_size(batch) * gate_width);
  starts_.resize(std::max(starts_.size(), to_size(batch)));
  grow(top_, to_size(batch) * width);
  grow(logits_, to_size(batch) * to_size(shape.outputs()));
  grow(logit_row_, to_size(shape.outputs()));
  grow(probability_row_, to_size(shape.outputs()));
  grow(d_logits_, to_size(batch) * to_size(shape.outputs()));
  grow(d_top_, to_size(batch) * width);
  grow(d_output_, rows * width);
  grow(d_h_, to_size(batch) * hidden);
  grow(d_c_, to_size(batch) * hidden);
  grow(db_rows_, to_size(batch) * 2 * gate_width);
  grow(d_embedded_, rows * embed);
  if (uses_onednn()) {
    const std::size_t widest = std::max({embed, width, hidden});
    grow(onednn_x_, rows * widest);
    grow(onednn_y_, rows * widest);
    grow(onednn_dx_, rows * widest);
    for (auto& dy : onednn_dy_) grow(dy, rows * hidden);
  }
  // At most one entry per token of the batch: push_back never allocates during a step.
  touched_.reserve(rows);
  next_touched_.reserve(rows);
}

template <typename Scalar>
const Scalar* CpuRnnClassifier<Scalar>::layer_output(int layer, int batch) const {
  const Layer& l = layers_[to_size(layer)];
  if (layout_.shape().bidirectional) return l.output.data();
  // Skip row block 0 (the initial state).
  return l.directions[0].states.data() + to_size(batch) * to_size(layout_.shape().hidden);
}

template <typename Scalar>
const Scalar* CpuRnnClassifier<Scalar>::layer_input(int layer, int batch) const {
  if (layer == 0)
    return dropping_ && options_.embedding_dropout > 0 ? embedded_dropped_.data() : embedded_.data();
  if (dropping_ && options_.dropout > 0) return layers_[to_size(layer - 1)].dropped.data();
  return layer_output(layer - 1, batch);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::apply_dropout(double rate, const Scalar* in, Scalar* out, Scalar* mask,
                                             std::size_t n) {
  const uint64_t stream = dropout_stream(dropout_key_, ++dropout_draws_);
  for (std::size_t i = 0; i < n; ++i) {
    mask[i] = dropout_mask_value<Scalar>(stream, i, rate);
    out[i] = in[i] * mask[i];
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::find_starts(const int32_t* tokens, int batch, int seq) {
  for (int b = 0; b < batch; ++b) {
    starts_[to_size(b)] = options_.mask_padding ? masked_start(tokens + to_size(b) * to_size(seq), seq) : 0;
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::forward(const int32_t* tokens, int batch, int seq, bool training) {
  if (tokens == nullptr || batch <= 0 || seq <= 0) {
    throw std::invalid_argument(
        "CpuRnnClassifier: a batch needs tokens, batch >= 1 and seq >= 1 (got batch " +
        std::to_string(batch) + ", seq " + std::to_string(seq) + ")");
  }
  const ModelShape& shape = layout_.shape();
  const int vocab = shape.vocab_size;
  const std::size_t count = to_size(batch) * to_size(seq);
  for (std::size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw BatchValueOutOfRange("token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                 std::to_string(vocab) + ")");
    }
  }
  resize_workspace(batch, seq);
  find_starts(tokens, batch, seq);
  dropping_ = training && (options_.dropout > 0 || options_.embedding_dropout > 0);

  // Embedding lookup into time-major rows: row t*B+b is token (b, t).
  std::optional<timeline::Span> part(std::in_place, "embedding lookup");
  const auto embed = to_size(shape.embedding_dim);
  const Scalar* embedding = params_.data() + embedding_offset_;
  parallel_ranges(count, /*align=*/1, kMinRowsPerThread, [&](std::size_t begin, std::size_t end) {
    for (std::size_t k = begin; k < end; ++k) {
      if (k + kRowsAhead < end)
        prefetch_row(
            embedding + static_cast<std::size_t>(token_of_row(tokens, k + kRowsAhead, batch, seq)) * embed,
            embed);
      const Scalar* source =
          embedding + static_cast<std::size_t>(token_of_row(tokens, k, batch, seq)) * embed;
      std::copy(source, source + embed, embedded_.data() + k * embed);
    }
  });
  if (dropping_ && options_.embedding_dropout > 0) {
    apply_dropout(options_.embedding_dropout, embedded_.data(), embedded_dropped_.data(),
                  embedding_mask_.data(), count * embed);
  }

  const auto hidden = to_size(shape.hidden);
  const auto width = to_size(shape.output_width());
  part.emplace("recurrent layers");
  for (int l = 0; l < shape.layers; ++l) {
    Layer& layer = layers_[to_size(l)];
    if (uses_onednn()) {
      forward_layer_onednn(l, batch, seq);
    } else {
      for (int d = 0; d < shape.directions(); ++d) forward_direction(l, d, batch, seq);
    }
    if (shape.bidirectional) {
      // Side by side: the forward direction's state after time t, then the reverse one's.
      const Scalar* forward_states = layer.directions[0].states.data() + to_size(batch) * hidden;
      const Scalar* reverse_states = layer.directions[1].states.data();
      for (std::size_t r = 0; r < count; ++r) {
        std::copy_n(forward_states + r * hidden, hidden, layer.output.data() + r * width);
        std::copy_n(reverse_states + r * hidden, hidden, layer.output.data() + r * width + hidden);
      }
    }
    if (dropping_ && options_.dropout > 0 && l + 1 < shape.layers) {
      apply_dropout(options_.dropout, layer_output(l, batch), layer.dropped.data(), layer.dropout_mask.data(),
                    count * width);
    }
  }

  // The dense layer reads the top layer's last step forward and (reverse) its first.
  part.emplace("dense layer");
  const Layer& top = layers_.back();
  const std::size_t last_block = to_size(seq) * to_size(batch) * hidden;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    std::copy_n(top.directions[0].states.data() + last_block + b * hidden, hidden, top_.data() + b * width);
    if (shape.bidirectional)
      std::copy_n(top.directions[1].states.data() + b * hidden, hidden, top_.data() + b * width + hidden);
  }
  const Scalar* dense_w = params_.data() + dense_w_offset_;
  const Scalar* dense_b = params_.data() + dense_b_offset_;
  const auto outputs = to_size(shape.outputs());
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    const Scalar* h = top_.data() + b * width;
    for (std::size_t k = 0; k < outputs; ++k) {
      const Scalar* w = dense_w + k * width;
      Scalar z = 0;
      for (std::size_t j = 0; j < width; ++j) z += w[j] * h[j];
      logits_[b * outputs + k] = z + dense_b[k];
    }
  }
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::forward_direction(int layer, int direction, int batch, int seq) {
  const ModelShape& shape = layout_.shape();
  const Layer& l = layers_[to_size(layer)];
  Direction& dir = layers_[to_size(layer)].directions[to_size(direction)];
  const bool lstm = shape.cell == Cell::kLstm;
  const int hidden = shape.hidden;
  const int gate_width = shape.gates() * hidden;
  const auto h_size = to_size(hidden);
  const auto g_size = to_size(gate_width);
  const auto rows = to_size(batch) * to_size(seq);
  const Scalar* w_ih = params_.data() + dir.w_ih;
  const Scalar* w_hh = params_.data() + dir.w_hh;
  const Scalar* b_ih = params_.data() + dir.b_ih;
  const Scalar* b_hh = params_.data() + dir.b_hh;
  Scalar* gates = dir.gates.data();
  Scalar* states = dir.states.data();

  // The biases in every row (an LSTM's both; a GRU's recurrent bias stays on the recurrent side, inside
  // r * (...)), then the input projection of the whole sequence accumulates on top of them.
  for (std::size_t j = 0; j < g_size; ++j) gates[j] = lstm ? b_ih[j] + b_hh[j] : b_ih[j];
  for (std::size_t r = 1; r < rows; ++r) std::copy(gates, gates + g_size, gates + r * g_size);
  product(Trans::kNo, Trans::kYes, static_cast<int>(rows), gate_width, l.in, Scalar(1),
          layer_input(layer, batch), l.in, w_ih, l.in, Scalar(1), gates, gate_width);

  const std::size_t step_states = to_size(batch) * h_size;
  const std::size_t initial_block = dir.reverse ? to_size(seq) : 0;
  std::fill(states + initial_block * step_states, states + (initial_block + 1) * step_states, Scalar(0));
  if (lstm) {
    Scalar* cell = dir.cell.data();
    std::fill(cell + initial_block * step_states, cell + (initial_block + 1) * step_states, Scalar(0));
  }
  // Samples are independent through time: each compute thread runs the whole sequence for its own rows of
  // the batch, its recurrent products included, with no barrier between the time steps.
  const auto rows_forward = [&](std::size_t b0, std::size_t b1) {
    const int m = static_cast<int>(b1 - b0);
    for (int s = 0; s < seq; ++s) {
      const int t = dir.reverse ? seq - 1 - s : s;
      // The state before time t is block t (forward) or t+1 (reverse); after it, t+1 or t.
      const std::size_t prev_block = dir.reverse ? to_size(t) + 1 : to_size(t);
      const std::size_t next_block = dir.reverse ? to_size(t) : to_size(t) + 1;
      Scalar* g_t = gates + to_size(t) * to_size(batch) * g_size;
      const Scalar* h_prev = states + prev_block * step_states;
      Scalar* h_t = states + next_block * step_states;
      if (lstm) {
        const Scalar* c_prev = dir.cell.data() + prev_block * step_states;
        Scalar* c_t = dir.cell.data() + next_block * step_states;
        Scalar* tanh_t = dir.cell_tanh.data() + to_size(t) * step_states;
        // The initial state is 0: the first step has no recurrent term.
        if (s > 0) {
          recurrent_product(dir, true, m, gate_width, hidden, h_prev + b0 * h_size, w_hh, true,
                            g_t + b0 * g_size);
        }
        for (std::size_t b = b0; b < b1; ++b) {
          const std::size_t s_row = b * h_size;
          if (t < starts_[b]) {  // padding: the state carries over
            std::copy_n(h_prev + s_row, h_size, h_t + s_row);
            std::copy_n(c_prev + s_row, h_size, c_t + s_row);
            continue;
          }
          Scalar* row = g_t + b * g_size;
          cell_forward(row, row + h_size, row + 2 * h_size, row + 3 * h_size, c_prev + s_row, c_t + s_row,
                       tanh_t + s_row, h_t + s_row, h_size);
        }
      } else {
        Scalar* recurrent = recurrent_.data();
        for (std::size_t b = b0; b < b1; ++b) std::copy_n(b_hh, g_size, recurrent + b * g_size);
        if (s > 0) {
          recurrent_product(dir, true, m, gate_width, hidden, h_prev + b0 * h_size, w_hh, true,
                            recurrent + b0 * g_size);
        }
        Scalar* kept = dir.recurrent.data() + to_size(t) * step_states;
        for (std::size_t b = b0; b < b1; ++b) {
          const std::size_t s_row = b * h_size;
          if (t < starts_[b]) {
            std::copy_n(h_prev + s_row, h_size, h_t + s_row);
            continue;
          }
          Scalar* row = g_t + b * g_size;
          const Scalar* rec = recurrent + b * g_size;
          gru_cell_forward(row, row + h_size, row + 2 * h_size, rec, rec + h_size, rec + 2 * h_size,
                           kept + s_row, h_prev + s_row, h_t + s_row, h_size);
        }
      }
    }
  };
  pack_recurrent_weights(dir, true, rows_per_thread(batch));
  parallel_ranges(to_size(batch), kBatchRowsAlign, kMinBatchRowsPerThread, rows_forward);
}

template <typename Scalar>
BatchStats CpuRnnClassifier<Scalar>::loss_and_stats(const Scalar* labels, int batch,
                                                    std::span<Scalar> probabilities) {
  // Prediction needs no labels (and adds nothing to the stats); training and evaluation do.
  if (labels == nullptr && probabilities.empty())
    throw std::invalid_argument("CpuRnnClassifier: a batch needs labels");
  const int classes = layout_.shape().classes;
  const int outputs = layout_.shape().outputs();
  BatchStats stats;
  std::vector<double>& z = logit_row_;
  std::vector<double>& p = probability_row_;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    // In double: the sum over ranks and batches should not lose the float model's small losses.
    for (int k = 0; k < outputs; ++k)
      z[to_size(k)] = static_cast<double>(logits_[b * to_size(outputs) + to_size(k)]);
    if (outputs == 1) {
      if (!probabilities.empty()) probabilities[b] = static_cast<Scalar>(stable_sigmoid(z[0]));
      if (labels == nullptr) continue;
      const double y = static_cast<double>(labels[b]);
      if (!(y >= 0 && y <= 1)) {
        throw BatchValueOutOfRange("label " + fmt::format("{}", y) + " is outside the classes [0, 2)");
      }
      stats.loss_sum += logistic_loss(z[0], y);
      if (predicts_label(z[0], y)) ++stats.correct;
      continue;
    }
    const int label = labels == nullptr ? -1 : static_cast<int>(labels[b]);
    if (labels != nullptr && (label < 0 || label >= classes)) {
      throw BatchValueOutOfRange("label " + std::to_string(label) + " is outside the classes [0, " +
                                 std::to_string(classes) + ")");
    }
    const double loss = softmax_loss(z.data(), outputs, label, p.data());
    if (!probabilities.empty()) {
      for (int k = 0; k < outputs; ++k)
        probabilities[b * to_size(outputs) + to_size(k)] = static_cast<Scalar>(p[to_size(k)]);
    }
    if (labels == nullptr) continue;
    stats.loss_sum += loss;
    if (predicted_class(z.data(), outputs) == label) ++stats.correct;
  }
  stats.count = labels == nullptr ? 0 : batch;
  return stats;
}

template <typename Scalar>
BatchStats CpuRnnClassifier<Scalar>::evaluate(const int32_t* tokens, const Scalar* labels, int batch, int seq,
                                              std::span<Scalar> probabilities) {
  const std::size_t expected = to_size(batch) * to_size(layout_.shape().outputs());
  if (!probabilities.empty() && probabilities.size() != expected) {
    throw std::invalid_argument("CpuRnnClassifier::evaluate: probabilities holds " +
                                std::to_string(probabilities.size()) + " entries for " +
                                std::to_string(expected));
  }
  forward(tokens, batch, seq, /*training=*/false);
  BatchStats stats = loss_and_stats(labels, batch, probabilities);
  if (labels == nullptr) return stats;
  // The confusion counts, from the logits as loss_and_stats judges them.
  const int classes = layout_.shape().classes;
  const auto outputs = to_size(layout_.shape().outputs());
  stats.confusion.assign(to_size(classes) * to_size(classes), 0);
  std::vector<double>& z = logit_row_;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    for (std::size_t k = 0; k < outputs; ++k) z[k] = static_cast<double>(logits_[b * outputs + k]);
    const int truth = outputs == 1 ? (labels[b] >= Scalar(0.5) ? 1 : 0) : static_cast<int>(labels[b]);
    const int predicted =
        outputs == 1 ? (z[0] >= 0 ? 1 : 0) : predicted_class(z.data(), static_cast<int>(outputs));
    ++stats.confusion[to_size(truth) * to_size(classes) + to_size(predicted)];
  }
  return stats;
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::dense_backward(const Scalar* labels, int batch) {
  const ModelShape& shape = layout_.shape();
  const auto width = to_size(shape.output_width());
  const auto outputs = to_size(shape.outputs());
  const Scalar inv_batch = Scalar(1) / static_cast<Scalar>(batch);
  if (outputs == 1) {
    // d(mean loss)/dz = (p - y) / B.
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      const auto p = static_cast<Scalar>(stable_sigmoid(static_cast<double>(logits_[b])));
      d_logits_[b] = logit_gradient(p, labels[b], inv_batch);
    }
  } else {
    // d(mean loss)/dz_k = (p_k - [k = y]) / B.
    std::vector<double>& z = logit_row_;
    std::vector<double>& p = probability_row_;
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      for (std::size_t k = 0; k < outputs; ++k) z[k] = static_cast<double>(logits_[b * outputs + k]);
      softmax_loss(z.data(), static_cast<int>(outputs), -1, p.data());
      const auto label = static_cast<std::size_t>(labels[b]);
      for (std::size_t k = 0; k < outputs; ++k) {
        d_logits_[b * outputs + k] =
            logit_gradient(static_cast<Scalar>(p[k]), k == label ? Scalar(1) : Scalar(0), inv_batch);
      }
    }
  }
  const Scalar* dense_w = params_.data() + dense_w_offset_;
  Scalar* d_dense_w = grads_.data() + dense_w_offset_;
  Scalar* d_dense_b = grads_.data() + dense_b_offset_;
  std::fill(d_dense_w, d_dense_w + outputs * width, Scalar(0));
  for (std::size_t k = 0; k < outputs; ++k) {
    Scalar db = 0;
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      const Scalar* h = top_.data() + b * width;
      const Scalar dz = d_logits_[b * outputs + k];
      for (std::size_t j = 0; j < width; ++j) d_dense_w[k * width + j] += dz * h[j];
      db += dz;
    }
    d_dense_b[k] = db;
  }
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    Scalar* d_top = d_top_.data() + b * width;
    for (std::size_t j = 0; j < width; ++j) d_top[j] = d_logits_[b * outputs] * dense_w[j];
    for (std::size_t k = 1; k < outputs; ++k) {
      for (std::size_t j = 0; j < width; ++j) d_top[j] += d_logits_[b * outputs + k] * dense_w[k * width + j];
    }
  }
}

template <typename Scalar>
BatchStats CpuRnnClassifier<Scalar>::train_step(const int32_t* tokens, const Scalar* labels, int batch,
                                                int seq, const GradientReadyFn& on_ready) {
  BatchStats stats;
  {
    timeline::Span span("forward");
    forward(tokens, batch, seq, /*training=*/true);
    stats = loss_and_stats(labels, batch, {});
  }
  timeline::Span backward_span("backward");
  const ModelShape& shape = layout_.shape();
  const auto& segments = layout_.segments();
  const int layers = shape.layers;
  const auto hidden = to_size(shape.hidden);
  const auto width = to_size(shape.output_width());
  const std::size_t rows = to_size(batch) * to_size(seq);
  auto ready = [&](std::size_t segment) {
    if (on_ready) on_ready(segments[segment]);
  };

  dense_backward(labels, batch);
  ready(segments.size() - 1);

  // Only the top layer's last step (forward) and first step (reverse) feed the dense layer: its backward
  // reads only these rows of d_output_.
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    std::copy_n(d_top_.data() + b * width, hidden, d_output_.data() + (rows - to_size(batch) + b) * width);
    if (shape.bidirectional)
      std::copy_n(d_top_.data() + b * width + hidden, hidden, d_output_.data() + b * width + hidden);
  }

  if (uses_onednn()) {
    std::optional<timeline::Span> part(std::in_place, "recurrent layers backward");
    for (int l = layers - 1; l >= 0; --l) {
      backward_layer_onednn(l, batch, seq, /*dy_every_step=*/l + 1 < layers);
      undo_input_dropout(l, batch, seq);
      if (l > 0) ready(to_size(l) + 1);
    }
    part.emplace("embedding gradient");
    accumulate_embedding_gradient(tokens, batch, seq);
    part.reset();
    ready(0);
    ready(1);
    return stats;
  }
  std::optional<timeline::Span> part(std::in_place, "recurrent layers backward");
  for (int l = layers - 1; l > 0; --l) {
    for (int d = 0; d < shape.directions(); ++d) backward_direction(l, d, batch, seq, l + 1 < layers);
    for (int d = 0; d < shape.directions(); ++d) weight_gradients(l, d, batch, seq);
    ready(to_size(l) + 1);
    input_gradient(l, batch, seq);
  }
  // The first layer hands over the embedding before its own weight gradients: the embedding's exchange is
  // the largest, and it travels while those GEMMs run.
  for (int d = 0; d < shape.directions(); ++d) backward_direction(0, d, batch, seq, layers > 1);
  input_gradient(0, batch, seq);
  part.emplace("embedding gradient");
  accumulate_embedding_gradient(tokens, batch, seq);
  part.reset();
  ready(0);
  part.emplace("recurrent layers backward");
  for (int d = 0; d < shape.directions(); ++d) weight_gradients(0, d, batch, seq);
  part.reset();
  ready(1);
  return stats;
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::input_gradient(int layer, int batch, int seq) {
  // dX = sum over directions of dG * w_ih: into the outputs of the layer below (d_output_ is consumed by
  // now) or the embedding, then through the dropout mask that made the input.
  const ModelShape& shape = layout_.shape();
  const Layer& l = layers_[to_size(layer)];
  Scalar* d_input = layer > 0 ? d_output_.data() : d_embedded_.data();
  const int gate_width = shape.gates() * shape.hidden;
  for (std::size_t d = 0; d < l.directions.size(); ++d) {
    product(Trans::kNo, Trans::kNo, batch * seq, l.in, gate_width, Scalar(1), l.directions[d].d_gates.data(),
            gate_width, params_.data() + l.directions[d].w_ih, l.in, d == 0 ? Scalar(0) : Scalar(1), d_input,
            l.in);
  }
  undo_input_dropout(layer, batch, seq);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::undo_input_dropout(int layer, int batch, int seq) {
  if (!dropping_) return;
  const Scalar* mask = nullptr;
  if (layer > 0 && options_.dropout > 0) mask = layers_[to_size(layer - 1)].dropout_mask.data();
  if (layer == 0 && options_.embedding_dropout > 0) mask = embedding_mask_.data();
  if (mask == nullptr) return;
  Scalar* d_input = layer > 0 ? d_output_.data() : d_embedded_.data();
  const std::size_t n = to_size(batch) * to_size(seq) * to_size(layers_[to_size(layer)].in);
  for (std::size_t i = 0; i < n; ++i) d_input[i] *= mask[i];
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::weight_gradients(int layer, int direction, int batch, int seq) {
  // Of the whole sequence, one GEMM each: time t's gates against the state before it (block t forward,
  // t+1 reverse) and the layer's input at t.
  const ModelShape& shape = layout_.shape();
  const Layer& l = layers_[to_size(layer)];
  const Direction& dir = l.directions[to_size(direction)];
  const int hidden = shape.hidden;
  const int gate_width = shape.gates() * hidden;
  const int rows = batch * seq;
  const Scalar* d_gates_h = shape.cell == Cell::kLstm ? dir.d_gates.data() : dir.d_gates_h.data();
  const Scalar* h_prev = dir.states.data() + (dir.reverse ? to_size(batch) * to_size(hidden) : 0);
  product(Trans::kYes, Trans::kNo, gate_width, hidden, rows, Scalar(1), d_gates_h, gate_width, h_prev, hidden,
          Scalar(0), grads_.data() + dir.w_hh, hidden);
  product(Trans::kYes, Trans::kNo, gate_width, l.in, rows, Scalar(1), dir.d_gates.data(), gate_width,
          layer_input(layer, batch), l.in, Scalar(0), grads_.data() + dir.w_ih, l.in);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::accumulate_embedding_gradient(const int32_t* tokens, int batch, int seq) {
  // A token's row gathers the gradients of all its occurrences. Only rows of this batch's tokens and of the
  // last batch's are written: the first occurrence of a token copies into its row, later ones add, and rows
  // the last batch touched but this one does not go back to zero. Every other row is zero already.
  const auto embed = to_size(layout_.shape().embedding_dim);
  Scalar* d_embedding = grads_.data() + embedding_offset_;
  uint8_t* seen = row_seen_.data();
  next_touched_.clear();
  const std::size_t rows = to_size(batch) * to_size(seq);
  grow(first_use_, rows);
  for (std::size_t k = 0; k < rows; ++k) {
    const int32_t token = token_of_row(tokens, k, batch, seq);
    first_use_[k] = seen[token] == 0 ? 1 : 0;
    if (seen[token] == 0) next_touched_.push_back(token);
    seen[token] = 1;
  }
  // The compute threads split the tokens (token mod parts), so each row's occurrences add in the same order
  // as on one thread, and each thread waits for the memory of its own rows only.
  const std::size_t parts = std::min<std::size_t>(to_size(loop_threads()), rows / kMinRowsPerThread + 1);
  const auto gather_part = [&](std::size_t part) {
    const auto mine = [&](int32_t token) { return static_cast<std::size_t>(token) % parts == part; };
    for (std::size_t k = 0; k < rows; ++k) {
      if (k + kRowsAhead < rows) {
        const int32_t ahead = token_of_row(tokens, k + kRowsAhead, batch, seq);
        if (mine(ahead)) prefetch_row(d_embedding + static_cast<std::size_t>(ahead) * embed, embed);
      }
      const int32_t token = token_of_row(tokens, k, batch, seq);
      if (!mine(token)) continue;
      const Scalar* __restrict source = d_embedded_.data() + k * embed;
      Scalar* __restrict target = d_embedding + static_cast<std::size_t>(token) * embed;
      if (first_use_[k] != 0) {
        std::copy(source, source + embed, target);
      } else {
        for (std::size_t j = 0; j < embed; ++j) target[j] += source[j];
      }
    }
    for (const int32_t token : touched_) {
      if (seen[token] == 0 && mine(token))
        std::fill_n(d_embedding + static_cast<std::size_t>(token) * embed, embed, Scalar(0));
    }
  };
  parallel_ranges(parts, /*align=*/1, /*min_per_thread=*/1, [&](std::size_t begin, std::size_t end) {
    for (std::size_t part = begin; part < end; ++part) gather_part(part);
  });
  for (const int32_t token : next_touched_) seen[token] = 0;
  std::sort(next_touched_.begin(), next_touched_.end());
  touched_.swap(next_touched_);
}

template <typename Scalar>
void CpuRnnClassifier<Scalar>::backward_direction(int layer, int direction, int batch, int seq,
                                                  bool dy_every_step) {
  const ModelShape& shape = layout_.shape();
  Direction& dir = layers_[to_size(layer)].directions[to_size(direction)];
  const bool lstm = shape.cell == Cell::kLstm;
  const int hidden = shape.hidden;
  const int gate_width = shape.gates() * hidden;
  const auto h_size = to_size(hidden);
  const auto g_size = to_size(gate_width);
  const auto width = to_size(shape.output_width());
  const std::size_t step_states = to_size(batch) * h_size;
  const Scalar* w_hh = params_.data() + dir.w_hh;
  Scalar* d_h = d_h_.data();
  Scalar* d_c = d_c_.data();
  // The bias gradients are the sums of the gate gradients over all rows: each batch row accumulates its own
  // through time as they are computed (db_rows_: the input side's, then for a GRU the recurrent side's), and
  // the rows are summed in order after, so the result does not depend on how the rows were split.
  const std::size_t db_width = lstm ? g_size : 2 * g_size;
  Scalar* db_rows = db_rows_.data();
  // Whether the gradient into h_prev has a part that bypasses W_hh (GRU's z h_prev; a padded step's carry):
  // then the recurrent product adds onto it.
  const bool direct_path = !lstm || options_.mask_padding;
  const int final_time = dir.reverse ? 0 : seq - 1;

  // As forward: each compute thread runs back through time for its own rows of the batch.
  const auto rows_backward = [&](std::size_t b0, std::size_t b1) {
    const int m = static_cast<int>(b1 - b0);
    std::fill(d_h + b0 * h_size, d_h + b1 * h_size, Scalar(0));
    std::fill(d_c + b0 * h_size, d_c + b1 * h_size, Scalar(0));
    std::fill(db_rows + b0 * db_width, db_rows + b1 * db_width, Scalar(0));
    for (int s = seq - 1; s >= 0; --s) {
      const int t = dir.reverse ? seq - 1 - s : s;
      const std::size_t prev_block = dir.reverse ? to_size(t) + 1 : to_size(t);
      const std::size_t gate_row0 = to_size(t) * to_size(batch) * g_size;
      const Scalar* g_t = dir.gates.data() + gate_row0;
      Scalar* dg_t = dir.d_gates.data() + gate_row0;
      Scalar* dgh_t = lstm ? dg_t : dir.d_gates_h.data() + gate_row0;
      const Scalar* d_out =
          d_output_.data() + to_size(t) * to_size(batch) * width + to_size(direction) * h_size;
      const bool has_dy = dy_every_step || t == final_time;
      for (std::size_t b = b0; b < b1; ++b) {
        const Scalar* g_row = g_t + b * g_size;
        Scalar* dg_row = dg_t + b * g_size;
        Scalar* dgh_row = dgh_t + b * g_size;
        Scalar* db_ih = db_rows + b * db_width;
        Scalar* db_hh = db_ih + g_size;
        const std::size_t s_row = b * h_size;
        const Scalar* dy = d_out + b * width;
        if (t < starts_[b]) {
          // Padding: the state carried over, so does its gradient; the step's gates had none.
          if (has_dy) {
            for (std::size_t j = 0; j < h_size; ++j) d_h[s_row + j] += dy[j];
          }
          std::fill_n(dg_row, g_size, Scalar(0));
          if (!lstm) std::fill_n(dgh_row, g_size, Scalar(0));
          continue;
        }
        if (lstm) {
          const Scalar* c_prev = dir.cell.data() + prev_block * step_states;
          const Scalar* tanh_t = dir.cell_tanh.data() + to_size(t) * step_states;
          const auto cell_step = [&](auto has_dy_tag) {
            cell_backward<decltype(has_dy_tag)::value>(
                g_row, g_row + h_size, g_row + 2 * h_size, g_row + 3 * h_size, c_prev + s_row, tanh_t + s_row,
                dy, d_h + s_row, d_c + s_row, dg_row, dg_row + h_size, dg_row + 2 * h_size,
                dg_row + 3 * h_size, db_ih, db_ih + h_size, db_ih + 2 * h_size, db_ih + 3 * h_size, h_size);
          };
          if (has_dy) {
            cell_step(std::true_type{});
          } else {
            cell_step(std::false_type{});
          }
          // The gradient into h_prev passes through W_hh alone.
          if (direct_path) std::fill_n(d_h + s_row, h_size, Scalar(0));
        } else {
          const Scalar* h_prev = dir.states.data() + prev_block * step_states + s_row;
          const Scalar* rn = dir.recurrent.data() + to_size(t) * step_states + s_row;
          const auto cell_step = [&](auto has_dy_tag) {
            gru_cell_backward<decltype(has_dy_tag)::value>(g_row, g_row + h_size, g_row + 2 * h_size, rn,
                                                           h_prev, dy, d_h + s_row, dg_row, dg_row + h_size,
                                                           dg_row + 2 * h_size, dgh_row, dgh_row + h_size,
                                                           dgh_row + 2 * h_size, db_ih, db_hh, h_size);
          };
          if (has_dy) {
            cell_step(std::true_type{});
          } else {
            cell_step(std::false_type{});
          }
        }
      }
      // dh_{t-1} through the recurrent weights; the initial state is a constant, so the first step needs
      // none.
      if (s > 0) {
        recurrent_product(dir, false, m, hidden, gate_width, dgh_t + b0 * g_size, w_hh, direct_path,
                          d_h + b0 * h_size);
      }
    }
  };
  pack_recurrent_weights(dir, false, rows_per_thread(batch));
  parallel_ranges(to_size(batch), kBatchRowsAlign, kMinBatchRowsPerThread, rows_backward);

  Scalar* db_ih = grads_.data() + dir.b_ih;
  Scalar* db_hh = grads_.data() + dir.b_hh;
  std::copy_n(db_rows, g_size, db_ih);
  if (!lstm) std::copy_n(db_rows + g_size, g_size, db_hh);
  for (std::size_t b = 1; b < to_size(batch); ++b) {
    const Scalar* row = db_rows + b * db_width;
    for (std::size_t j = 0; j < g_size; ++j) db_ih[j] += row[j];
    if (!lstm) {
      for (std::size_t j = 0; j < g_size; ++j) db_hh[j] += row[g_size + j];
    }
  }
  if (lstm) std::copy(db_ih, db_ih + g_size, db_hh);
}

template class CpuRnnClassifier<float>;
template class CpuRnnClassifier<double>;

namespace {

class CpuReplica final : public Replica {
 public:
  CpuReplica(const ModelShape& shape, CpuKernels kernels, const ModelOptions& options)
      : model_(shape, options) {
    if (kernels == CpuKernels::kOnednn) model_.use_onednn();
    if (kernels == CpuKernels::kOnednnGemm) model_.use_onednn_products();
    if (kernels == CpuKernels::kPacked) {
      model_.use_packed_recurrent();
      if (onednn_missing().empty()) model_.use_onednn_products();
    }
  }

  std::string recurrent_kernels() const override {
    const std::string cell = model_.layout().shape().cell == Cell::kGru ? "GRU" : "LSTM";
    if (model_.uses_onednn()) return cell + " on " + onednn_description();
    // Where the weight gradients run when the rest is on oneDNN's sgemm.
    const std::string weight_gradients = model_.uses_onednn_products() && !model_.weight_gradients_on_onednn()
                                             ? " (the weight gradients on " + blas_description() + ")"
                                             : "";
    if (model_.uses_packed_recurrent()) {
      return cell + " cells over packed " + packed_tiles_name(best_packed_tiles()) +
             " tiles for each time step's products and " +
             (model_.uses_onednn_products() ? "the sgemm of " + onednn_description() : blas_description()) +
             " for the whole sequence's" + weight_gradients;
    }
    if (model_.uses_onednn_products()) {
      return cell + " cells over the sgemm of " + onednn_description() + weight_gradients;
    }
    return cell + " cells over " + blas_description();
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  DeviceKind device() const override { return DeviceKind::kCpu; }
  std::span<float> params() override { return model_.params(); }
  std::span<float> grads() override { return model_.grads(); }
  void copy_params_to_host(std::span<float> host) override {
    check_size(host.size());
    std::copy(model_.params().begin(), model_.params().end(), host.begin());
  }
  void copy_params_from_host(std::span<const float> host) override {
    check_size(host.size());
    std::copy(host.begin(), host.end(), model_.params().begin());
  }
  void copy_grads_to_host(std::span<float> host) override {
    check_size(host.size());
    std::copy(model_.grads().begin(), model_.grads().end(), host.begin());
  }

  void set_dropout_key(uint64_t key) override { model_.set_dropout_key(key); }
  void train_step(const BatchView& batch, const GradientReadyFn& on_ready) override {
    stats_ += model_.train_step(batch.tokens, batch.labels, batch.batch, batch.seq, on_ready);
  }
  void evaluate(const BatchView& batch) override {
    stats_ += model_.evaluate(batch.tokens, batch.labels, batch.batch, batch.seq, {});
  }
  void predict(const BatchView& batch, std::span<float> probabilities) override {
    const BatchStats stats =
        model_.evaluate(batch.tokens, batch.labels, batch.batch, batch.seq, probabilities);
    if (batch.labels != nullptr) stats_ += stats;
  }
  BatchStats take_stats() override { return std::exchange(stats_, BatchStats{}); }

  std::span<const int32_t> touched_embedding_rows() const override { return model_.touched_embedding_rows(); }
  void clear_embedding_gradient_rows(std::span<const int32_t> rows) override {
    const ParamTensor& embedding = layout().tensor("embedding");
    const auto width = static_cast<std::size_t>(embedding.shape[1]);
    float* grads = model_.grads().data() + embedding.offset;
    for (const int32_t row : rows) std::fill_n(grads + static_cast<std::size_t>(row) * width, width, 0.0f);
  }
  void clear_embedding_gradient() override {
    const ParamTensor& embedding = layout().tensor("embedding");
    std::fill_n(model_.grads().data() + embedding.offset, embedding.size(), 0.0f);
  }

 private:
  void check_size(std::size_t n) const {
    if (n != layout().total_size()) throw std::invalid_argument("CpuReplica: host buffer of the wrong size");
  }

  CpuRnnClassifier<float> model_;
  BatchStats stats_;
};

}  // namespace

CpuKernels fastest_cpu_kernels(const KernelFacts& facts) {
  if (facts.have_packed && facts.have_onednn) {
    const bool primitive_ahead = facts.avx512 && facts.wide_fma_units && facts.threads <= 1;
    return primitive_ahead ? CpuKernels::kOnednn : CpuKernels::kPacked;
  }
  if (facts.avx512) return facts.have_onednn ? CpuKernels::kOnednn : CpuKernels::kBuiltin;
  if (facts.have_packed) return CpuKernels::kPacked;
  return facts.have_onednn ? CpuKernels::kOnednnGemm : CpuKernels::kBuiltin;
}

CpuKernels parse_cpu_kernels(const std::string& name, const ModelShape& /*shape*/,
                             const ModelOptions& /*options*/, int threads) {
  // Every kind runs every variant: LSTM and GRU cells, both directions, masking (forward_layer_onednn).
  if (name == "builtin") return CpuKernels::kBuiltin;
  if (name == "auto") {
    KernelFacts facts;
    facts.have_onednn = onednn_missing().empty();
    facts.avx512 = facts.have_onednn ? onednn_runs_avx512() : cpu_has_avx512();
    facts.have_packed = packed_gemm_missing().empty();
    facts.threads = threads;
    // Measured (a few ms, once per process) only where the answer can change the choice.
    if (facts.have_onednn && facts.have_packed && facts.avx512 && threads <= 1) {
      facts.wide_fma_units = avx512_fma_outpaces_avx2();
    }
    return fastest_cpu_kernels(facts);
  }
  if (name == "onednn" || name == "onednn_gemm") {
    if (!onednn_missing().empty()) throw UserError("model.cpu_kernels = " + name + ": " + onednn_missing());
    return name == "onednn" ? CpuKernels::kOnednn : CpuKernels::kOnednnGemm;
  }
  if (name == "packed") {
    if (!packed_gemm_missing().empty())
      throw UserError("model.cpu_kernels = packed: " + packed_gemm_missing());
    return CpuKernels::kPacked;
  }
  throw UserError("model.cpu_kernels = " + name + ": expected auto, builtin, onednn, onednn_gemm or packed");
}

std::unique_ptr<Replica> make_cpu_replica(const ModelShape& shape, CpuKernels kernels,
                                          const ModelOptions& options) {
  return std::make_unique<CpuReplica>(shape, kernels, options);
}

}  // namespace ddp::models

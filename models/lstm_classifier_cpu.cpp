#include "models/lstm_classifier_cpu.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "models/blas.h"
#include "models/fast_math.h"
#include "models/output_math.h"

namespace ddp::models {
namespace {

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

}  // namespace

template <typename Scalar>
CpuLstmClassifier<Scalar>::CpuLstmClassifier(const ModelShape& shape)
    : layout_(shape), params_(layout_.total_size()), grads_(layout_.total_size()) {
  embedding_offset_ = layout_.tensor("embedding").offset;
  dense_w_offset_ = layout_.tensor("dense.w").offset;
  dense_b_offset_ = layout_.tensor("dense.b").offset;
  for (int l = 0; l < shape.layers; ++l) {
    const std::string prefix = "lstm.l" + std::to_string(l) + ".";
    LayerTensors t;
    t.w_ih = layout_.tensor(prefix + "w_ih").offset;
    t.w_hh = layout_.tensor(prefix + "w_hh").offset;
    t.b_ih = layout_.tensor(prefix + "b_ih").offset;
    t.b_hh = layout_.tensor(prefix + "b_hh").offset;
    t.in = l == 0 ? shape.embedding_dim : shape.hidden;
    layers_.push_back(t);
  }
  const auto layers = to_size(shape.layers);
  gates_.resize(layers);
  cell_.resize(layers);
  cell_tanh_.resize(layers);
  hidden_.resize(layers);
  row_seen_.assign(to_size(shape.vocab_size), 0);
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::use_onednn() {
  if constexpr (!std::is_same_v<Scalar, float>) {
    throw std::runtime_error("CpuLstmClassifier: oneDNN's LSTM runs the float path only");
  } else {
    onednn_.clear();
    for (std::size_t l = 0; l < layers_.size(); ++l) onednn_.push_back(make_onednn_lstm_layer());
  }
}

template <typename Scalar>
LstmLayerBuffers CpuLstmClassifier<Scalar>::onednn_buffers(int layer, int batch, int seq) {
  LstmLayerBuffers b;
  if constexpr (std::is_same_v<Scalar, float>) {
    const LayerTensors& t = layers_[to_size(layer)];
    const int hidden = layout_.shape().hidden;
    b.batch = batch;
    b.seq = seq;
    b.input = t.in;
    b.hidden = hidden;
    b.x = layer_input(layer, batch);
    // Row block 0 of hidden_ is h_{-1} = 0; oneDNN writes the steps' outputs after it.
    b.h = hidden_[to_size(layer)].data() + to_size(batch) * to_size(hidden);
    b.w_ih = params_.data() + t.w_ih;
    b.w_hh = params_.data() + t.w_hh;
    b.b_ih = params_.data() + t.b_ih;
    b.b_hh = params_.data() + t.b_hh;
  }
  return b;
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::forward_layer_onednn(int layer, int batch, int seq) {
  if constexpr (std::is_same_v<Scalar, float>) {
    Scalar* states = hidden_[to_size(layer)].data();
    std::fill(states, states + to_size(batch) * to_size(layout_.shape().hidden), Scalar(0));
    onednn_[to_size(layer)]->forward(onednn_buffers(layer, batch, seq));
  }
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::backward_layer_onednn(int layer, int batch, int seq) {
  if constexpr (std::is_same_v<Scalar, float>) {
    const LayerTensors& t = layers_[to_size(layer)];
    const auto hidden = to_size(layout_.shape().hidden);
    const std::size_t rows = to_size(batch) * to_size(seq);
    if (layer + 1 == layout_.shape().layers) {
      // The top layer's output gradient is the last step's alone (the dense layer reads only that step).
      std::fill(d_hidden_.data(), d_hidden_.data() + (rows - to_size(batch)) * hidden, Scalar(0));
    }
    LstmLayerGradients g;
    g.dh = d_hidden_.data();
    g.dx = layer > 0 ? d_input_.data() : d_embedded_.data();
    g.dw_ih = grads_.data() + t.w_ih;
    g.dw_hh = grads_.data() + t.w_hh;
    g.db_ih = grads_.data() + t.b_ih;
    g.db_hh = grads_.data() + t.b_hh;
    onednn_[to_size(layer)]->backward(onednn_buffers(layer, batch, seq), g);
    if (layer > 0) d_hidden_.swap(d_input_);  // the gradient into the layer below's outputs
  }
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::resize_workspace(int batch, int seq) {
  const std::size_t rows = to_size(batch) * to_size(seq);
  const std::size_t rows_with_initial = rows + to_size(batch);
  const auto embed = to_size(layout_.shape().embedding_dim);
  const auto hidden = to_size(layout_.shape().hidden);
  grow(embedded_, rows * embed);
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    grow(gates_[l], rows * 4 * hidden);
    grow(cell_[l], rows_with_initial * hidden);
    grow(cell_tanh_[l], rows * hidden);
    grow(hidden_[l], rows_with_initial * hidden);
  }
  grow(logits_, to_size(batch));
  grow(d_logits_, to_size(batch));
  grow(d_gates_, rows * 4 * hidden);
  grow(d_hidden_, rows * hidden);
  grow(d_h_, to_size(batch) * hidden);
  grow(d_c_, to_size(batch) * hidden);
  grow(d_embedded_, rows * embed);
  if (uses_onednn()) {
    d_input_.resize(d_hidden_.size());  // swapped with d_hidden_: the two stay the same size
  }
  // At most one entry per token of the batch: push_back never allocates during a step.
  touched_.reserve(rows);
  next_touched_.reserve(rows);
}

template <typename Scalar>
const Scalar* CpuLstmClassifier<Scalar>::layer_input(int layer, int batch) const {
  if (layer == 0) return embedded_.data();
  // Skip row block 0 (h_{-1}) of the layer below.
  return hidden_[to_size(layer - 1)].data() + to_size(batch) * to_size(layout_.shape().hidden);
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::forward(const int32_t* tokens, int batch, int seq) {
  if (tokens == nullptr || batch <= 0 || seq <= 0) {
    throw std::invalid_argument(
        "CpuLstmClassifier: a batch needs tokens, batch >= 1 and seq >= 1 (got batch " +
        std::to_string(batch) + ", seq " + std::to_string(seq) + ")");
  }
  const int vocab = layout_.shape().vocab_size;
  const std::size_t count = to_size(batch) * to_size(seq);
  for (std::size_t i = 0; i < count; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) {
      throw TokenOutsideVocabulary("token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " +
                                   std::to_string(vocab) + ")");
    }
  }
  resize_workspace(batch, seq);

  // Embedding lookup into time-major rows: row t*B+b is token (b, t).
  const auto embed = to_size(layout_.shape().embedding_dim);
  const Scalar* embedding = params_.data() + embedding_offset_;
  for (int t = 0; t < seq; ++t) {
    for (int b = 0; b < batch; ++b) {
      const auto token = static_cast<std::size_t>(tokens[to_size(b) * to_size(seq) + to_size(t)]);
      const Scalar* source = embedding + token * embed;
      std::copy(source, source + embed,
                embedded_.data() + (to_size(t) * to_size(batch) + to_size(b)) * embed);
    }
  }

  for (int l = 0; l < layout_.shape().layers; ++l) {
    if (uses_onednn()) {
      forward_layer_onednn(l, batch, seq);
    } else {
      forward_layer(l, batch, seq);
    }
  }

  // The logit reads the top layer's last hidden state.
  const auto hidden = to_size(layout_.shape().hidden);
  const Scalar* last = hidden_.back().data() + to_size(seq) * to_size(batch) * hidden;
  const Scalar* dense_w = params_.data() + dense_w_offset_;
  const Scalar dense_b = params_[dense_b_offset_];
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    const Scalar* h = last + b * hidden;
    Scalar z = 0;
    for (std::size_t j = 0; j < hidden; ++j) z += dense_w[j] * h[j];
    logits_[b] = z + dense_b;
  }
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::forward_layer(int layer, int batch, int seq) {
  const LayerTensors& tensors = layers_[to_size(layer)];
  const int hidden = layout_.shape().hidden;
  const int gate_width = 4 * hidden;
  const auto h_size = to_size(hidden);
  const auto g_size = to_size(gate_width);
  const auto rows = to_size(batch) * to_size(seq);
  const Scalar* w_ih = params_.data() + tensors.w_ih;
  const Scalar* w_hh = params_.data() + tensors.w_hh;
  const Scalar* b_ih = params_.data() + tensors.b_ih;
  const Scalar* b_hh = params_.data() + tensors.b_hh;
  Scalar* gates = gates_[to_size(layer)].data();
  Scalar* cell = cell_[to_size(layer)].data();
  Scalar* cell_tanh = cell_tanh_[to_size(layer)].data();
  Scalar* hidden_states = hidden_[to_size(layer)].data();

  // Both biases in every row, then the input projection of the whole sequence accumulates on top of them.
  for (std::size_t j = 0; j < g_size; ++j) gates[j] = b_ih[j] + b_hh[j];
  for (std::size_t r = 1; r < rows; ++r) std::copy(gates, gates + g_size, gates + r * g_size);
  gemm(Trans::kNo, Trans::kYes, static_cast<int>(rows), gate_width, tensors.in, Scalar(1),
       layer_input(layer, batch), tensors.in, w_ih, tensors.in, Scalar(1), gates, gate_width);

  const std::size_t step_states = to_size(batch) * h_size;
  std::fill(cell, cell + step_states, Scalar(0));
  std::fill(hidden_states, hidden_states + step_states, Scalar(0));
  for (int t = 0; t < seq; ++t) {
    Scalar* g_t = gates + to_size(t) * to_size(batch) * g_size;
    const Scalar* h_prev = hidden_states + to_size(t) * step_states;
    Scalar* h_t = hidden_states + to_size(t + 1) * step_states;
    const Scalar* c_prev = cell + to_size(t) * step_states;
    Scalar* c_t = cell + to_size(t + 1) * step_states;
    Scalar* tanh_t = cell_tanh + to_size(t) * step_states;
    // h_{-1} = 0: the first step has no recurrent term.
    if (t > 0) {
      gemm(Trans::kNo, Trans::kYes, batch, gate_width, hidden, Scalar(1), h_prev, hidden, w_hh, hidden,
           Scalar(1), g_t, gate_width);
    }
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      Scalar* row = g_t + b * g_size;
      const std::size_t s_row = b * h_size;
      cell_forward(row, row + h_size, row + 2 * h_size, row + 3 * h_size, c_prev + s_row, c_t + s_row,
                   tanh_t + s_row, h_t + s_row, h_size);
    }
  }
}

template <typename Scalar>
BatchStats CpuLstmClassifier<Scalar>::loss_and_stats(const Scalar* labels, int batch,
                                                     std::span<Scalar> probabilities) {
  // Prediction needs no labels (and adds nothing to the stats); training and evaluation do.
  if (labels == nullptr && probabilities.empty())
    throw std::invalid_argument("CpuLstmClassifier: a batch needs labels");
  BatchStats stats;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    // In double: the sum over ranks and batches should not lose the float model's small losses.
    const double z = static_cast<double>(logits_[b]);
    if (!probabilities.empty()) probabilities[b] = static_cast<Scalar>(stable_sigmoid(z));
    if (labels == nullptr) continue;
    const double y = static_cast<double>(labels[b]);
    stats.loss_sum += logistic_loss(z, y);
    if (predicts_label(z, y)) ++stats.correct;
  }
  stats.count = labels == nullptr ? 0 : batch;
  return stats;
}

template <typename Scalar>
BatchStats CpuLstmClassifier<Scalar>::evaluate(const int32_t* tokens, const Scalar* labels, int batch,
                                               int seq, std::span<Scalar> probabilities) {
  if (!probabilities.empty() && probabilities.size() != to_size(batch)) {
    throw std::invalid_argument("CpuLstmClassifier::evaluate: probabilities holds " +
                                std::to_string(probabilities.size()) + " entries for a batch of " +
                                std::to_string(batch));
  }
  forward(tokens, batch, seq);
  return loss_and_stats(labels, batch, probabilities);
}

template <typename Scalar>
BatchStats CpuLstmClassifier<Scalar>::train_step(const int32_t* tokens, const Scalar* labels, int batch,
                                                 int seq, const GradientReadyFn& on_ready) {
  BatchStats stats;
  {
    timeline::Span span("forward");
    forward(tokens, batch, seq);
    stats = loss_and_stats(labels, batch, {});
  }
  timeline::Span backward_span("backward");
  const auto& segments = layout_.segments();
  const int layers = layout_.shape().layers;
  const auto hidden = to_size(layout_.shape().hidden);
  const std::size_t rows = to_size(batch) * to_size(seq);
  auto ready = [&](std::size_t segment) {
    if (on_ready) on_ready(segments[segment]);
  };

  // Dense: d(mean loss)/dz = (p - y) / B.
  const Scalar inv_batch = Scalar(1) / static_cast<Scalar>(batch);
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    const auto p = static_cast<Scalar>(stable_sigmoid(static_cast<double>(logits_[b])));
    d_logits_[b] = logit_gradient(p, labels[b], inv_batch);
  }
  const Scalar* last = hidden_.back().data() + to_size(seq) * to_size(batch) * hidden;
  const Scalar* dense_w = params_.data() + dense_w_offset_;
  Scalar* d_dense_w = grads_.data() + dense_w_offset_;
  std::fill(d_dense_w, d_dense_w + hidden, Scalar(0));
  Scalar d_dense_b = 0;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    const Scalar* h = last + b * hidden;
    for (std::size_t j = 0; j < hidden; ++j) d_dense_w[j] += d_logits_[b] * h[j];
    d_dense_b += d_logits_[b];
  }
  grads_[dense_b_offset_] = d_dense_b;
  ready(segments.size() - 1);

  // Only the last step's output feeds the dense layer: the top layer's backward reads only this block of
  // d_hidden_ (the others would be zero).
  Scalar* d_last = d_hidden_.data() + (rows - to_size(batch)) * hidden;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    for (std::size_t j = 0; j < hidden; ++j) d_last[b * hidden + j] = d_logits_[b] * dense_w[j];
  }

  if (uses_onednn()) {
    for (int l = layers - 1; l >= 0; --l) {
      backward_layer_onednn(l, batch, seq);
      if (l > 0) ready(to_size(l) + 1);
    }
    accumulate_embedding_gradient(tokens, batch, seq);
    ready(0);
    ready(1);
    return stats;
  }
  for (int l = layers - 1; l > 0; --l) {
    backward_through_time(l, batch, seq, /*dy_every_step=*/l + 1 < layers);
    weight_gradients(l, batch, seq);
    ready(to_size(l) + 1);
    input_gradient(l, batch, seq);
  }
  // The first layer hands over the embedding before its own weight gradients: the embedding's exchange is
  // the largest, and it travels while those two GEMMs run.
  backward_through_time(0, batch, seq, /*dy_every_step=*/layers > 1);
  input_gradient(0, batch, seq);
  accumulate_embedding_gradient(tokens, batch, seq);
  ready(0);
  weight_gradients(0, batch, seq);
  ready(1);
  return stats;
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::input_gradient(int layer, int batch, int seq) {
  // dX = dG * w_ih: into the outputs of the layer below (d_hidden_ is consumed by now) or the embedding.
  const LayerTensors& tensors = layers_[to_size(layer)];
  Scalar* d_input = layer > 0 ? d_hidden_.data() : d_embedded_.data();
  const int gate_width = 4 * layout_.shape().hidden;
  gemm(Trans::kNo, Trans::kNo, batch * seq, tensors.in, gate_width, Scalar(1), d_gates_.data(), gate_width,
       params_.data() + tensors.w_ih, tensors.in, Scalar(0), d_input, tensors.in);
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::weight_gradients(int layer, int batch, int seq) {
  // Of the whole sequence, one GEMM each; hidden_ row blocks 0..T-1 are h_{t-1}.
  const LayerTensors& tensors = layers_[to_size(layer)];
  const int hidden = layout_.shape().hidden;
  const int gate_width = 4 * hidden;
  const int rows = batch * seq;
  gemm(Trans::kYes, Trans::kNo, gate_width, hidden, rows, Scalar(1), d_gates_.data(), gate_width,
       hidden_[to_size(layer)].data(), hidden, Scalar(0), grads_.data() + tensors.w_hh, hidden);
  gemm(Trans::kYes, Trans::kNo, gate_width, tensors.in, rows, Scalar(1), d_gates_.data(), gate_width,
       layer_input(layer, batch), tensors.in, Scalar(0), grads_.data() + tensors.w_ih, tensors.in);
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::accumulate_embedding_gradient(const int32_t* tokens, int batch, int seq) {
  // A token's row gathers the gradients of all its occurrences. Only rows of this batch's tokens and of the
  // last batch's are written: the first occurrence of a token copies into its row, later ones add, and rows
  // the last batch touched but this one does not go back to zero. Every other row is zero already.
  const auto embed = to_size(layout_.shape().embedding_dim);
  Scalar* d_embedding = grads_.data() + embedding_offset_;
  uint8_t* seen = row_seen_.data();
  next_touched_.clear();
  for (int t = 0; t < seq; ++t) {
    for (int b = 0; b < batch; ++b) {
      const int32_t token = tokens[to_size(b) * to_size(seq) + to_size(t)];
      const Scalar* __restrict source =
          d_embedded_.data() + (to_size(t) * to_size(batch) + to_size(b)) * embed;
      Scalar* __restrict target = d_embedding + static_cast<std::size_t>(token) * embed;
      if (seen[token] == 0) {
        seen[token] = 1;
        next_touched_.push_back(token);
        std::copy(source, source + embed, target);
      } else {
        for (std::size_t j = 0; j < embed; ++j) target[j] += source[j];
      }
    }
  }
  for (const int32_t token : touched_) {
    if (seen[token] == 0) {
      Scalar* target = d_embedding + static_cast<std::size_t>(token) * embed;
      std::fill(target, target + embed, Scalar(0));
    }
  }
  for (const int32_t token : next_touched_) seen[token] = 0;
  std::sort(next_touched_.begin(), next_touched_.end());
  touched_.swap(next_touched_);
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::backward_through_time(int layer, int batch, int seq, bool dy_every_step) {
  const LayerTensors& tensors = layers_[to_size(layer)];
  const int hidden = layout_.shape().hidden;
  const int gate_width = 4 * hidden;
  const auto h_size = to_size(hidden);
  const auto g_size = to_size(gate_width);
  const std::size_t step_states = to_size(batch) * h_size;
  const Scalar* w_hh = params_.data() + tensors.w_hh;
  const Scalar* gates = gates_[to_size(layer)].data();
  const Scalar* cell = cell_[to_size(layer)].data();
  const Scalar* cell_tanh = cell_tanh_[to_size(layer)].data();
  Scalar* d_gates = d_gates_.data();
  Scalar* d_h = d_h_.data();
  Scalar* d_c = d_c_.data();
  std::fill(d_h, d_h + step_states, Scalar(0));
  std::fill(d_c, d_c + step_states, Scalar(0));
  // The bias gradient is the sum of d_gates over all rows, accumulated as they are computed.
  Scalar* d_b = grads_.data() + tensors.b_ih;
  std::fill(d_b, d_b + g_size, Scalar(0));

  for (int t = seq - 1; t >= 0; --t) {
    const std::size_t gate_row0 = to_size(t) * to_size(batch) * g_size;
    const Scalar* g_t = gates + gate_row0;
    Scalar* dg_t = d_gates + gate_row0;
    const Scalar* c_prev = cell + to_size(t) * step_states;
    const Scalar* tanh_t = cell_tanh + to_size(t) * step_states;
    const Scalar* d_out = d_hidden_.data() + to_size(t) * step_states;
    const bool has_dy = dy_every_step || t == seq - 1;
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      const Scalar* g_row = g_t + b * g_size;
      Scalar* dg_row = dg_t + b * g_size;
      const std::size_t s_row = b * h_size;
      const auto cell_step = [&](auto has_dy_tag) {
        cell_backward<decltype(has_dy_tag)::value>(
            g_row, g_row + h_size, g_row + 2 * h_size, g_row + 3 * h_size, c_prev + s_row, tanh_t + s_row,
            d_out + s_row, d_h + s_row, d_c + s_row, dg_row, dg_row + h_size, dg_row + 2 * h_size,
            dg_row + 3 * h_size, d_b, d_b + h_size, d_b + 2 * h_size, d_b + 3 * h_size, h_size);
      };
      if (has_dy) {
        cell_step(std::true_type{});
      } else {
        cell_step(std::false_type{});
      }
    }
    // dh_{t-1} through the recurrent weights; h_{-1} is a constant, so the first step needs none.
    if (t > 0) {
      gemm(Trans::kNo, Trans::kNo, batch, hidden, gate_width, Scalar(1), dg_t, gate_width, w_hh, hidden,
           Scalar(0), d_h, hidden);
    }
  }

  std::copy(d_b, d_b + g_size, grads_.data() + tensors.b_hh);
}

template class CpuLstmClassifier<float>;
template class CpuLstmClassifier<double>;

namespace {

class CpuReplica final : public Replica {
 public:
  CpuReplica(const ModelShape& shape, CpuKernels kernels) : model_(shape) {
    if (kernels == CpuKernels::kOnednn) model_.use_onednn();
  }

  std::string lstm_kernels() const override {
    return model_.uses_onednn() ? "LSTM on " + onednn_description() : "";
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

  void train_step(const BatchView& batch, const GradientReadyFn& on_ready) override {
    stats_ += model_.train_step(batch.tokens, batch.labels, batch.batch, batch.seq, on_ready);
  }
  void evaluate(const BatchView& batch) override {
    stats_ += model_.evaluate(batch.tokens, batch.labels, batch.batch, batch.seq, {});
  }
  void predict(const BatchView& batch, std::span<float> probabilities) override {
    model_.evaluate(batch.tokens, batch.labels, batch.batch, batch.seq, probabilities);
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

  CpuLstmClassifier<float> model_;
  BatchStats stats_;
};

}  // namespace

CpuKernels parse_cpu_kernels(const std::string& name) {
  if (name == "builtin") return CpuKernels::kBuiltin;
  if (name == "auto") return onednn_missing().empty() ? CpuKernels::kOnednn : CpuKernels::kBuiltin;
  if (name == "onednn") {
    if (!onednn_missing().empty()) throw UserError("model.cpu_kernels = onednn: " + onednn_missing());
    return CpuKernels::kOnednn;
  }
  throw UserError("model.cpu_kernels = " + name + ": expected auto, builtin or onednn");
}

std::unique_ptr<Replica> make_cpu_replica(const ModelShape& shape, CpuKernels kernels) {
  return std::make_unique<CpuReplica>(shape, kernels);
}

}  // namespace ddp::models

#include "models/lstm_classifier_cpu.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "models/blas.h"

namespace ddp::models {
namespace {

std::size_t to_size(int v) {
  return static_cast<std::size_t>(v);
}

template <typename Scalar>
Scalar sigmoid(Scalar x) {
  return Scalar(1) / (Scalar(1) + std::exp(-x));
}

// p = sigmoid(z) without overflow for either sign of z.
double stable_sigmoid(double z) {
  if (z >= 0) return 1.0 / (1.0 + std::exp(-z));
  const double e = std::exp(z);
  return e / (1.0 + e);
}

template <typename Scalar>
void grow(std::vector<Scalar>& buffer, std::size_t size) {
  if (buffer.size() < size) buffer.resize(size);
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
      throw std::out_of_range("CpuLstmClassifier: token " + std::to_string(tokens[i]) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
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

  for (int l = 0; l < layout_.shape().layers; ++l) forward_layer(l, batch, seq);

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
      Scalar* gi = row;
      Scalar* gf = row + h_size;
      Scalar* gg = row + 2 * h_size;
      Scalar* go = row + 3 * h_size;
      for (std::size_t j = 0; j < 2 * h_size; ++j) row[j] = sigmoid(row[j]);  // i and f
      for (std::size_t j = 0; j < h_size; ++j) gg[j] = std::tanh(gg[j]);
      for (std::size_t j = 0; j < h_size; ++j) go[j] = sigmoid(go[j]);
      const Scalar* cp = c_prev + b * h_size;
      Scalar* c = c_t + b * h_size;
      Scalar* tc = tanh_t + b * h_size;
      Scalar* h = h_t + b * h_size;
      for (std::size_t j = 0; j < h_size; ++j) c[j] = gf[j] * cp[j] + gi[j] * gg[j];
      for (std::size_t j = 0; j < h_size; ++j) tc[j] = std::tanh(c[j]);
      for (std::size_t j = 0; j < h_size; ++j) h[j] = go[j] * tc[j];
    }
  }
}

template <typename Scalar>
BatchStats CpuLstmClassifier<Scalar>::loss_and_stats(const Scalar* labels, int batch,
                                                     std::span<Scalar> probabilities) {
  if (labels == nullptr) throw std::invalid_argument("CpuLstmClassifier: a batch needs labels");
  BatchStats stats;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    // In double: the sum over ranks and batches should not lose the float model's small losses.
    const double z = static_cast<double>(logits_[b]);
    const double y = static_cast<double>(labels[b]);
    stats.loss_sum += std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::abs(z)));
    if ((z >= 0) == (y >= 0.5)) ++stats.correct;
    if (!probabilities.empty()) probabilities[b] = static_cast<Scalar>(stable_sigmoid(z));
  }
  stats.count = batch;
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
  forward(tokens, batch, seq);
  const BatchStats stats = loss_and_stats(labels, batch, {});
  const auto& segments = layout_.segments();
  const int layers = layout_.shape().layers;
  const auto hidden = to_size(layout_.shape().hidden);
  const auto embed = to_size(layout_.shape().embedding_dim);
  const std::size_t rows = to_size(batch) * to_size(seq);
  auto ready = [&](std::size_t segment) {
    if (on_ready) on_ready(segments[segment]);
  };

  // Dense: d(mean loss)/dz = (p - y) / B.
  const Scalar inv_batch = Scalar(1) / static_cast<Scalar>(batch);
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    const auto p = static_cast<Scalar>(stable_sigmoid(static_cast<double>(logits_[b])));
    d_logits_[b] = (p - labels[b]) * inv_batch;
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

  // Only the last step's output feeds the dense layer.
  std::fill(d_hidden_.data(), d_hidden_.data() + rows * hidden, Scalar(0));
  Scalar* d_last = d_hidden_.data() + (rows - to_size(batch)) * hidden;
  for (std::size_t b = 0; b < to_size(batch); ++b) {
    for (std::size_t j = 0; j < hidden; ++j) d_last[b * hidden + j] = d_logits_[b] * dense_w[j];
  }

  for (int l = layers - 1; l >= 0; --l) {
    backward_layer(l, batch, seq);
    ready(to_size(l) + 1);
    // dX = dG * w_ih: into the outputs of the layer below (d_hidden_ is consumed by now) or the embedding.
    const LayerTensors& tensors = layers_[to_size(l)];
    Scalar* d_input = l > 0 ? d_hidden_.data() : d_embedded_.data();
    const int gate_width = 4 * layout_.shape().hidden;
    gemm(Trans::kNo, Trans::kNo, static_cast<int>(rows), tensors.in, gate_width, Scalar(1), d_gates_.data(),
         gate_width, params_.data() + tensors.w_ih, tensors.in, Scalar(0), d_input, tensors.in);
  }

  // Embedding: a token's row gathers the gradients of all its occurrences.
  Scalar* d_embedding = grads_.data() + embedding_offset_;
  std::fill(d_embedding, d_embedding + to_size(layout_.shape().vocab_size) * embed, Scalar(0));
  for (int t = 0; t < seq; ++t) {
    for (int b = 0; b < batch; ++b) {
      const auto token = static_cast<std::size_t>(tokens[to_size(b) * to_size(seq) + to_size(t)]);
      const Scalar* source = d_embedded_.data() + (to_size(t) * to_size(batch) + to_size(b)) * embed;
      Scalar* target = d_embedding + token * embed;
      for (std::size_t j = 0; j < embed; ++j) target[j] += source[j];
    }
  }
  ready(0);
  return stats;
}

template <typename Scalar>
void CpuLstmClassifier<Scalar>::backward_layer(int layer, int batch, int seq) {
  const LayerTensors& tensors = layers_[to_size(layer)];
  const int hidden = layout_.shape().hidden;
  const int gate_width = 4 * hidden;
  const auto h_size = to_size(hidden);
  const auto g_size = to_size(gate_width);
  const int rows = batch * seq;
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

  for (int t = seq - 1; t >= 0; --t) {
    const std::size_t gate_row0 = to_size(t) * to_size(batch) * g_size;
    const Scalar* g_t = gates + gate_row0;
    Scalar* dg_t = d_gates + gate_row0;
    const Scalar* c_prev = cell + to_size(t) * step_states;
    const Scalar* tanh_t = cell_tanh + to_size(t) * step_states;
    const Scalar* d_out = d_hidden_.data() + to_size(t) * step_states;
    for (std::size_t b = 0; b < to_size(batch); ++b) {
      const Scalar* gi = g_t + b * g_size;
      const Scalar* gf = gi + h_size;
      const Scalar* gg = gi + 2 * h_size;
      const Scalar* go = gi + 3 * h_size;
      Scalar* di = dg_t + b * g_size;
      Scalar* df = di + h_size;
      Scalar* dg = di + 2 * h_size;
      Scalar* d_o = di + 3 * h_size;
      const Scalar* cp = c_prev + b * h_size;
      const Scalar* tc = tanh_t + b * h_size;
      const Scalar* dy = d_out + b * h_size;
      Scalar* dh = d_h + b * h_size;
      Scalar* dc = d_c + b * h_size;
      for (std::size_t j = 0; j < h_size; ++j) {
        const Scalar dh_total = dy[j] + dh[j];
        const Scalar dc_total = dc[j] + dh_total * go[j] * (Scalar(1) - tc[j] * tc[j]);
        // Derivatives before the activations: sigmoid' = s(1-s), tanh' = 1-t^2.
        di[j] = dc_total * gg[j] * gi[j] * (Scalar(1) - gi[j]);
        df[j] = dc_total * cp[j] * gf[j] * (Scalar(1) - gf[j]);
        dg[j] = dc_total * gi[j] * (Scalar(1) - gg[j] * gg[j]);
        d_o[j] = dh_total * tc[j] * go[j] * (Scalar(1) - go[j]);
        dc[j] = dc_total * gf[j];
      }
    }
    // dh_{t-1} through the recurrent weights; h_{-1} is a constant, so the first step needs none.
    if (t > 0) {
      gemm(Trans::kNo, Trans::kNo, batch, hidden, gate_width, Scalar(1), dg_t, gate_width, w_hh, hidden,
           Scalar(0), d_h, hidden);
    }
  }

  // Weight gradients of the whole sequence, one GEMM each; hidden_ row blocks 0..T-1 are h_{t-1}.
  gemm(Trans::kYes, Trans::kNo, gate_width, hidden, rows, Scalar(1), d_gates, gate_width,
       hidden_[to_size(layer)].data(), hidden, Scalar(0), grads_.data() + tensors.w_hh, hidden);
  gemm(Trans::kYes, Trans::kNo, gate_width, tensors.in, rows, Scalar(1), d_gates, gate_width,
       layer_input(layer, batch), tensors.in, Scalar(0), grads_.data() + tensors.w_ih, tensors.in);
  Scalar* d_b_ih = grads_.data() + tensors.b_ih;
  std::fill(d_b_ih, d_b_ih + g_size, Scalar(0));
  for (std::size_t r = 0; r < to_size(rows); ++r) {
    const Scalar* row = d_gates + r * g_size;
    for (std::size_t j = 0; j < g_size; ++j) d_b_ih[j] += row[j];
  }
  std::copy(d_b_ih, d_b_ih + g_size, grads_.data() + tensors.b_hh);
}

template class CpuLstmClassifier<float>;
template class CpuLstmClassifier<double>;

namespace {

class CpuReplica final : public Replica {
 public:
  explicit CpuReplica(const ModelShape& shape) : model_(shape) {}

  const ParamLayout& layout() const override { return model_.layout(); }
  std::span<float> params() override { return model_.params(); }
  std::span<float> grads() override { return model_.grads(); }

  BatchStats train_step(const BatchView& batch, const GradientReadyFn& on_ready) override {
    return model_.train_step(batch.tokens, batch.labels, batch.batch, batch.seq, on_ready);
  }
  BatchStats evaluate(const BatchView& batch, std::span<float> probabilities) override {
    return model_.evaluate(batch.tokens, batch.labels, batch.batch, batch.seq, probabilities);
  }

 private:
  CpuLstmClassifier<float> model_;
};

}  // namespace

std::unique_ptr<Replica> make_cpu_replica(const ModelShape& shape) {
  return std::make_unique<CpuReplica>(shape);
}

}  // namespace ddp::models

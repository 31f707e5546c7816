// The classifier on the CPU, templated on the scalar so that the same code runs in float for training and in
// double as the reference for gradient checks. Time-major internally: the input projection of the whole
// sequence is one GEMM per layer, each time step one GEMM with the recurrent weights, and backward through
// time accumulates the weight gradients of the whole sequence in one GEMM each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/onednn_lstm.h"
#include "models/param_layout.h"
#include "models/replica.h"

namespace ddp::models {

template <typename Scalar>
class CpuLstmClassifier {
 public:
  explicit CpuLstmClassifier(const ModelShape& shape);

  // Runs the LSTM layers on oneDNN (onednn_lstm.h) from now on: float only, in a build with oneDNN (throws
  // std::runtime_error otherwise). The embedding, dense layer and loss stay this class's.
  void use_onednn();
  bool uses_onednn() const { return !onednn_.empty(); }

  const ParamLayout& layout() const { return layout_; }
  std::span<Scalar> params() { return params_; }
  std::span<Scalar> grads() { return grads_; }

  // tokens [batch, seq] row-major; labels [batch]. grads() = d(mean BCE)/d(params).
  BatchStats train_step(const int32_t* tokens, const Scalar* labels, int batch, int seq,
                        const GradientReadyFn& on_ready);
  // The embedding rows (token ids, sorted, unique) of the last train_step's batch; empty before the first.
  // Every other row of the embedding gradient is exactly zero after train_step, provided that nothing but
  // train_step writes into grads(): a step writes only the rows of its own batch and of the last step's
  // batch (which it zeroes), so a row written from outside (say, averaged with other replicas' rows) stays
  // as it is until the caller zeroes it.
  std::span<const int32_t> touched_embedding_rows() const { return touched_; }
  // probabilities may be empty or hold `batch` entries.
  BatchStats evaluate(const int32_t* tokens, const Scalar* labels, int batch, int seq,
                      std::span<Scalar> probabilities);

 private:
  // Offsets of one layer's tensors in the flat buffers.
  struct LayerTensors {
    std::size_t w_ih = 0;
    std::size_t w_hh = 0;
    std::size_t b_ih = 0;
    std::size_t b_hh = 0;
    int in = 0;
  };

  void forward(const int32_t* tokens, int batch, int seq);
  void forward_layer(int layer, int batch, int seq);
  // Backward through time of one layer, from d_hidden_ (gradient into its outputs) to d_gates_ and the bias
  // gradients. Unless dy_every_step (every layer but the top one, whose only output with a gradient is the
  // last step's), it reads d_hidden_'s last row block only.
  void backward_through_time(int layer, int batch, int seq, bool dy_every_step);
  // From d_gates_: the layer's weight gradients, and the gradient into its input (d_hidden_ of the layer
  // below, or d_embedded_).
  void weight_gradients(int layer, int batch, int seq);
  void input_gradient(int layer, int batch, int seq);
  // The embedding gradient from d_embedded_, touching only the rows of this batch and the last one.
  void accumulate_embedding_gradient(const int32_t* tokens, int batch, int seq);
  BatchStats loss_and_stats(const Scalar* labels, int batch, std::span<Scalar> probabilities);
  void resize_workspace(int batch, int seq);
  // The input of `layer`, [T*B, in]: the embedded tokens for layer 0, the outputs of the layer below
  // otherwise.
  const Scalar* layer_input(int layer, int batch) const;
  // The same layer's forward and backward (into d_hidden_ of the layer below or d_embedded_, and the
  // layer's weight and bias gradients) on oneDNN.
  void forward_layer_onednn(int layer, int batch, int seq);
  void backward_layer_onednn(int layer, int batch, int seq);
  LstmLayerBuffers onednn_buffers(int layer, int batch, int seq);

  ParamLayout layout_;
  std::vector<Scalar> params_;
  std::vector<Scalar> grads_;
  std::size_t embedding_offset_ = 0;
  std::size_t dense_w_offset_ = 0;
  std::size_t dense_b_offset_ = 0;
  std::vector<LayerTensors> layers_;

  // Workspace, kept between steps so a step allocates nothing once shapes are stable. It only grows: a
  // smaller batch (the last one of an evaluation) uses a prefix of each buffer.
  std::vector<Scalar> embedded_;                // [T*B, E] time-major: row t*B+b = embedding of token (b, t)
  std::vector<std::vector<Scalar>> gates_;      // per layer: [T*B, 4H] activations i, f, g, o
  std::vector<std::vector<Scalar>> cell_;       // per layer: [(T+1)*B, H], row block 0 = c_{-1} = 0
  std::vector<std::vector<Scalar>> cell_tanh_;  // per layer: [T*B, H] tanh(c_t), kept for backward
  std::vector<std::vector<Scalar>> hidden_;     // per layer: [(T+1)*B, H], row block 0 = h_{-1} = 0
  std::vector<Scalar> logits_;                  // [B]
  std::vector<Scalar> d_logits_;                // [B]
  std::vector<Scalar> d_gates_;                 // [T*B, 4H] before the activations
  std::vector<Scalar> d_hidden_;                // [T*B, H] gradient flowing into a layer's outputs
  std::vector<Scalar> d_h_;                     // [B, H] recurrent part of dh_{t-1}
  std::vector<Scalar> d_c_;                     // [B, H]
  std::vector<Scalar> d_embedded_;              // [T*B, E]
  std::vector<int32_t> touched_;                // sorted token ids of the last train_step's batch
  std::vector<int32_t> next_touched_;           // the step's ids as they are found, then swapped in
  std::vector<uint8_t> row_seen_;               // [V], 1 while a step has found the token; 0 between steps
  std::vector<std::unique_ptr<OnednnLstmLayer>> onednn_;  // per layer, when the layers run on oneDNN
  std::vector<Scalar> d_input_;                           // oneDNN: [T*B, H], a layer's input gradient
};

extern template class CpuLstmClassifier<float>;
extern template class CpuLstmClassifier<double>;

}  // namespace ddp::models

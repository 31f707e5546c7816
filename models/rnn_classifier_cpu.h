// The classifier on the CPU, templated on the scalar so that the same code runs in float for training and in
// double as the reference for gradient checks. Every variant of the canonical layout (param_layout.h): LSTM
// or GRU cells, one or two directions, any number of layers, two or more classes; with masking of the left
// padding and dropout (ModelOptions). Time-major internally: the input projection of the whole sequence is
// one GEMM per layer and direction, each time step one GEMM with the recurrent weights, and backward through
// time accumulates the weight gradients of the whole sequence in one GEMM each. Samples are independent
// through time, so on more than one compute thread (parallel_loops.h) each thread runs the time steps of its
// own rows of the batch, recurrent products included. The products run on the BLAS, on oneDNN's sgemm
// (use_onednn_products), or the recurrent layers on oneDNN's primitives whole (use_onednn).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/blas.h"
#include "models/onednn_lstm.h"
#include "models/packed_gemm.h"
#include "models/param_layout.h"
#include "models/replica.h"

namespace ddp::models {

template <typename Scalar>
class CpuRnnClassifier {
 public:
  explicit CpuRnnClassifier(const ModelShape& shape, const ModelOptions& options = {});

  // Runs the recurrent layers on oneDNN (onednn_lstm.h) from now on: float only, in a build with oneDNN
  // (throws std::runtime_error otherwise). The embedding, dropout, dense layer and loss stay this class's.
  void use_onednn();
  bool uses_onednn() const { return !onednn_.empty(); }
  // Runs the builtin kernels' float matrix products on oneDNN's sgemm (onednn_lstm.h) instead of the BLAS:
  // float only, in a build with oneDNN (throws std::runtime_error otherwise). The weight gradients (A
  // transposed) too where oneDNN runs AVX-512, and on the BLAS where it runs AVX2: each is the faster there
  // (gemm_library_bench, benchmarks/RESULTS.md).
  void use_onednn_products();
  bool uses_onednn_products() const { return onednn_products_; }
  bool weight_gradients_on_onednn() const { return onednn_weight_gradients_; }
  // Runs the recurrent products of every time step on packed_gemm.h's register tiles, the recurrent weights
  // packed once a layer's pass: float only, on a CPU with AVX2 and FMA (throws std::runtime_error otherwise).
  void use_packed_recurrent();
  bool uses_packed_recurrent() const { return packed_recurrent_; }

  const ParamLayout& layout() const { return layout_; }
  const ModelOptions& options() const { return options_; }
  std::span<Scalar> params() { return params_; }
  std::span<Scalar> grads() { return grads_; }

  // The dropout masks of the following train_steps derive from `key` (and a counter the call resets), so
  // that a resumed run draws the masks of the uninterrupted one.
  void set_dropout_key(uint64_t key) {
    dropout_key_ = key;
    dropout_draws_ = 0;
  }

  // tokens [batch, seq] row-major; labels [batch] (0/1, or class ids). grads() = d(mean loss)/d(params).
  BatchStats train_step(const int32_t* tokens, const Scalar* labels, int batch, int seq,
                        const GradientReadyFn& on_ready);
  // The embedding rows (token ids, sorted, unique) of the last train_step's batch; empty before the first.
  // Every other row of the embedding gradient is exactly zero after train_step, provided that nothing but
  // train_step writes into grads(): a step writes only the rows of its own batch and of the last step's
  // batch (which it zeroes), so a row written from outside (say, averaged with other replicas' rows) stays
  // as it is until the caller zeroes it.
  std::span<const int32_t> touched_embedding_rows() const { return touched_; }
  // probabilities may be empty or hold batch x shape.outputs() entries (p(positive) for two classes, each
  // class's probability otherwise). No dropout.
  BatchStats evaluate(const int32_t* tokens, const Scalar* labels, int batch, int seq,
                      std::span<Scalar> probabilities);

 private:
  // One direction of one layer: offsets of its tensors in the flat buffers, and what forward keeps for
  // backward. States are time-ordered with one extra block for the initial state: forward, block t+1 is the
  // state after time t and block 0 the initial one; reverse, block t is the state after time t and block T
  // the initial one.
  struct Direction {
    std::size_t w_ih = 0, w_hh = 0, b_ih = 0, b_hh = 0;
    bool reverse = false;
    std::vector<Scalar> gates;      // [T*B, G*H] time order: the gates' activations
    std::vector<Scalar> recurrent;  // GRU: [T*B, H] W_hn h + b_hn, which the reset gate multiplied
    std::vector<Scalar> cell;       // LSTM: [(T+1)*B, H]
    std::vector<Scalar> cell_tanh;  // LSTM: [T*B, H] tanh(c_t)
    std::vector<Scalar> states;     // [(T+1)*B, H]
    std::vector<Scalar> d_gates;    // [T*B, G*H] gradient before the activations (input side)
    std::vector<Scalar> d_gates_h;  // GRU: [T*B, G*H] the same on the recurrent side (n's block times r)
    PackedMatrix packed_w_hh;       // use_packed_recurrent: W_hh^T for the forward pass, W_hh for backward
  };
  struct Layer {
    int in = 0;
    std::vector<Direction> directions;
    std::vector<Scalar> output;        // bidirectional: [T*B, 2H], both directions' outputs side by side
    std::vector<Scalar> dropped;       // with dropout below the top layer: output * mask, the next input
    std::vector<Scalar> dropout_mask;  // [T*B, D] 0 or 1/(1-p)
  };

  void forward(const int32_t* tokens, int batch, int seq, bool training);
  void forward_direction(int layer, int direction, int batch, int seq);
  // Backward through time of one direction, from the gradient into its outputs (d_output_, a column block
  // of D) to its d_gates (and d_gates_h) and bias gradients. Unless dy_every_step (every layer but the top
  // one, whose only output with a gradient is its last step), it reads only the final step's rows.
  void backward_direction(int layer, int direction, int batch, int seq, bool dy_every_step);
  void weight_gradients(int layer, int direction, int batch, int seq);
  // The gradient into the layer's input (d_output_ of the layer below, or d_embedded_), summed over
  // directions.
  void input_gradient(int layer, int batch, int seq);
  // C = alpha op(A) op(B) + beta C on the BLAS, or on oneDNN's sgemm after use_onednn_products().
  void product(Trans trans_a, Trans trans_b, int m, int n, int k, Scalar alpha, const Scalar* a, int lda,
               const Scalar* b, int ldb, Scalar beta, Scalar* c, int ldc) const;
  // One time step's recurrent product of `m` batch rows, C = A op(W_hh) (+ C when `accumulate`): on the
  // packed tiles (dir.packed_w_hh, packed by pack_recurrent_weights) after use_packed_recurrent, else on
  // product() with W_hh at w_hh, transposed when `transposed`.
  void recurrent_product(const Direction& dir, bool transposed, int m, int n, int k, const Scalar* a,
                         const Scalar* w_hh, bool accumulate, Scalar* c) const;
  // Packs W_hh (transposed, for the forward pass) into dir.packed_w_hh for products of about `rows` rows;
  // nothing unless use_packed_recurrent.
  void pack_recurrent_weights(Direction& dir, bool transposed, int rows);
  // Multiplies the gradient into the layer's input by the dropout mask that made that input, if any.
  void undo_input_dropout(int layer, int batch, int seq);
  // The embedding gradient from d_embedded_, touching only the rows of this batch and the last one.
  void accumulate_embedding_gradient(const int32_t* tokens, int batch, int seq);
  BatchStats loss_and_stats(const Scalar* labels, int batch, std::span<Scalar> probabilities);
  // d(mean loss)/d(logits) into d_logits_, then the dense layer's gradients and d_top_.
  void dense_backward(const Scalar* labels, int batch);
  void resize_workspace(int batch, int seq);
  // The input of `layer`, [T*B, in]: the (dropped) embedded tokens for layer 0, the (dropped) outputs of
  // the layer below otherwise.
  const Scalar* layer_input(int layer, int batch) const;
  // A layer's output [T*B, D] before dropout: the forward states' blocks 1..T when unidirectional.
  const Scalar* layer_output(int layer, int batch) const;
  // Draws a dropout mask of n entries (0 or 1/(1-rate)) and applies it: out = in * mask.
  void apply_dropout(double rate, const Scalar* in, Scalar* out, Scalar* mask, std::size_t n);
  // The first real time step of each sample (the count of its leading padding tokens, at most seq-1), or
  // all 0 without masking.
  void find_starts(const int32_t* tokens, int batch, int seq);
  // The same layer's forward and backward on oneDNN (each direction its own layer; masking by shifting the
  // forward direction's rows, shift_rows).
  void forward_layer_onednn(int layer, int batch, int seq);
  void backward_layer_onednn(int layer, int batch, int seq, bool dy_every_step);
  LstmLayerBuffers onednn_buffers(int layer, int direction, int batch, int seq);
  // Time-major rows of `width` floats, each sample moved by its padding: `left`, to[t] = from[t + start]
  // (zeros past its length); else to[t] = from[t - start] (zeros before start).
  void shift_rows(const Scalar* from, Scalar* to, std::size_t width, int batch, int seq, bool left) const;

  ParamLayout layout_;
  ModelOptions options_;
  std::vector<Scalar> params_;
  std::vector<Scalar> grads_;
  std::size_t embedding_offset_ = 0;
  std::size_t dense_w_offset_ = 0;
  std::size_t dense_b_offset_ = 0;
  std::vector<Layer> layers_;
  bool onednn_products_ = false;
  bool onednn_weight_gradients_ = false;
  bool packed_recurrent_ = false;
  uint64_t dropout_key_ = 0;
  uint64_t dropout_draws_ = 0;  // masks drawn since the key was set
  bool dropping_ = false;       // this forward is a training step's and some dropout rate is not 0

  // Workspace, kept between steps so a step allocates nothing once shapes are stable. It only grows: a
  // smaller batch (the last one of an evaluation) uses a prefix of each buffer.
  std::vector<Scalar> embedded_;          // [T*B, E] time-major: row t*B+b = embedding of token (b, t)
  std::vector<Scalar> embedded_dropped_;  // [T*B, E] with embedding dropout
  std::vector<Scalar> embedding_mask_;    // [T*B, E]
  std::vector<int> starts_;               // [B]
  std::vector<Scalar> recurrent_;         // GRU: [B, G*H] one step's h_prev W_hh^T + b_hh
  std::vector<Scalar> top_;               // [B, D] the dense layer's input
  std::vector<Scalar> logits_;            // [B, outputs]
  std::vector<Scalar> d_logits_;          // [B, outputs]
  std::vector<double> logit_row_;         // [outputs] one sample's logits in double, for its loss
  std::vector<double> probability_row_;   // [outputs]
  std::vector<Scalar> d_top_;             // [B, D]
  std::vector<Scalar> d_output_;          // [T*B, D] gradient flowing into a layer's outputs
  std::vector<Scalar> d_h_;               // [B, H] recurrent part of dh_{t-1}
  std::vector<Scalar> d_c_;               // [B, H]
  std::vector<Scalar> db_rows_;           // [B, 2 * G*H] each batch row's bias gradients through time
  std::vector<Scalar> d_embedded_;        // [T*B, E]
  std::vector<int32_t> touched_;          // sorted token ids of the last train_step's batch
  std::vector<int32_t> next_touched_;     // the step's ids as they are found, then swapped in
  std::vector<uint8_t> row_seen_;         // [V], 1 while a step has found the token; 0 between steps
  std::vector<uint8_t> first_use_;        // [T*B], 1 where a step's row is its token's first occurrence
  // oneDNN: a layer per layer and direction (l * directions + d), and the rows they read and write where ours
  // do not serve as they are: shifted inputs and outputs, each direction's output gradient, an input
  // gradient.
  std::vector<std::unique_ptr<OnednnLstmLayer>> onednn_;
  std::vector<Scalar> onednn_x_, onednn_y_, onednn_dx_;
  std::vector<Scalar> onednn_dy_[2];
};

extern template class CpuRnnClassifier<float>;
extern template class CpuRnnClassifier<double>;

}  // namespace ddp::models

// One recurrent layer's training step in one direction on oneDNN's RNN primitives (Debian's libdnnl-dev), for
// the CPU replica's float path: its LSTM, and its linear-before-reset GRU (make_onednn_layer); the library
// PyTorch and TensorFlow use for the CPU's deep-learning kernels, whose LSTM step beats the hand-written
// layer over OpenBLAS (benchmarks/RESULTS.md, "Against oneDNN's LSTM"). CMake compiles onednn_lstm.cpp where
// it finds oneDNN, else onednn_lstm_none.cpp, whose layer cannot be made.
//
// The LSTM's mapping (the GRU's is at make_onednn_layer), checked against the double reference in the tests:
// oneDNN's gate order (i, f, c~, o) is ours;
// our [4H, in] weights are its ldgoi layout, reordered each step into the formats its forward and backward
// want; it has one bias per gate row, which is b_ih + b_hh, and whose gradient is both of theirs; weight and
// bias gradients accumulate, so they are zeroed before each backward; the initial states are passed as
// explicit zeros (omitted, oneDNN 2.6 pairs the gate gradients with h_t instead of h_{t-1} in the recurrent
// weights' gradient).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "models/param_layout.h"

namespace ddp::models {

// Where a layer's tensors live: time-major activations, the canonical layout's parameters and gradients.
struct LstmLayerBuffers {
  int batch = 0, seq = 0, input = 0, hidden = 0;
  const float* x = nullptr;     // [T*B, input], row t*B+b
  float* h = nullptr;           // [T*B, hidden]: every step's output
  const float* w_ih = nullptr;  // [4H, input]
  const float* w_hh = nullptr;  // [4H, H]
  const float* b_ih = nullptr;  // [4H]
  const float* b_hh = nullptr;  // [4H]
};

struct LstmLayerGradients {
  const float* dh = nullptr;  // [T*B, hidden]: the gradient into every step's output (zeros where none)
  float* dx = nullptr;        // [T*B, input]; must not overlap dh
  float* dw_ih = nullptr;     // [4H, input], overwritten
  float* dw_hh = nullptr;     // [4H, H], overwritten
  float* db_ih = nullptr;     // [4H], overwritten
  float* db_hh = nullptr;     // [4H], overwritten
};

class OnednnLstmLayer {
 public:
  virtual ~OnednnLstmLayer() = default;
  // Forward for training: fills buffers.h and keeps what backward needs (oneDNN's workspace) for the same
  // buffers' shapes.
  virtual void forward(const LstmLayerBuffers& buffers) = 0;
  // Backward of the last forward (the same buffers).
  virtual void backward(const LstmLayerBuffers& buffers, const LstmLayerGradients& gradients) = 0;
};

// Whether this build has oneDNN, and if not, why ("" when it has).
std::string onednn_missing();
// "oneDNN 2.6.3 (AVX-512, 2 threads)" for the start log.
std::string onednn_description();
// Whether oneDNN runs its AVX-512 kernels on this CPU (false without oneDNN).
bool onednn_runs_avx512();
// Sets the threads oneDNN's OpenMP runs on (the rank's train.threads). No-op without oneDNN.
void set_onednn_threads(int threads);
// A layer of `cell`s (the GRU: oneDNN's linear-before-reset GRU, which is cuDNN's and ours; its gates u, r,
// o are our z, r, n, its four biases u, r, o, u' our b_iz + b_hz, b_ir + b_hr, b_in and b_hn), running
// from the first time step to the last, or with `reverse` from the last to the first (h[t] is then the state
// after time t, having seen t..T-1). Throws std::runtime_error in a build without oneDNN.
std::unique_ptr<OnednnLstmLayer> make_onednn_layer(Cell cell, bool reverse = false);

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, row-major, on oneDNN's sgemm: on OpenMP's threads,
// or on the calling thread alone inside a parallel region. Throws std::runtime_error in a build without
// oneDNN, and where oneDNN refuses the arguments. Like the layers above, it holds asynchronous signals back
// from the calling thread while oneDNN runs (onednn_lstm.cpp says why): every call into oneDNN must.
void onednn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc);

}  // namespace ddp::models

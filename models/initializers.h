// Keras's initializers for the imdb_lstm model, written into the canonical layout:
//   embedding  uniform(-0.05, 0.05)
//   w_ih       glorot_uniform over Keras's kernel [in, 4H]: limit sqrt(6 / (in + 4H))
//   w_hh       orthogonal over Keras's recurrent kernel [H, 4H] (gain 1), stored transposed as [4H, H]
//   b_ih       zero except the forget gate, 1 (Keras unit_forget_bias); b_hh zero, so f's bias sums to 1
//   dense.w    glorot_uniform over [H, 1]; dense.b zero
// Deterministic from the seed and independent of the BLAS or the number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "models/param_layout.h"

namespace ddp::models {

// `progress` is called as the work proceeds (after each tensor, and within an orthogonal matrix every million
// draws and after each slice of rows of a block of columns): a large hidden size takes seconds. Up to
// `parallel` orthogonal matrices are drawn at once, each on a thread of its own and with two double copies of
// itself; the result is the same.
void initialize_keras(const ParamLayout& layout, std::span<float> params, uint64_t seed,
                      const std::function<void()>& progress = {}, int parallel = 1);

// `a` (row-major, rows >= cols) becomes the q of its QR with a positive diagonal of r: orthonormal columns,
// column j in the span of a's first j + 1 columns, on the side of a's column j. Deterministic, as above.
void orthonormal_columns(std::vector<double>& a, std::size_t rows, std::size_t cols,
                         const std::function<void()>& progress = {});

}  // namespace ddp::models

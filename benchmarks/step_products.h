// The matrix products of one CPU training step of the recurrent layers, in the shapes and with the
// transposes the hand-written replica issues them: the one list cpu_step_bench's GEMM floor and
// gemm_library_bench time.
#pragma once

#include <vector>

// C[m, n] = op(A)[m, k] * op(B)[k, n], row-major, leading dimensions packed.
struct Product {
  int m, n, k;
  bool trans_a, trans_b;
};

struct StepProduct {
  Product shape;
  int count;  // calls per step
  const char* what;
};

struct StepShapes {
  int batch, seq, embed, hidden, layers, gates, directions;  // gates: 4 for an LSTM, 3 for a GRU
};

inline std::vector<StepProduct> step_products(const StepShapes& s) {
  const int rows = s.batch * s.seq, g = s.gates * s.hidden, h = s.hidden;
  std::vector<StepProduct> list;
  for (int l = 0; l < s.layers; ++l) {
    const int in = l == 0 ? s.embed : s.directions * h;
    for (int d = 0; d < s.directions; ++d) {
      list.push_back({{rows, g, in, false, true}, 1, "input projection"});  // the whole sequence at once
      list.push_back({{s.batch, g, h, false, true}, s.seq, "recurrent, forward"});
      list.push_back({{s.batch, h, g, false, false}, s.seq, "recurrent, backward"});  // d h
      list.push_back({{g, h, rows, true, false}, 1, "d w_hh"});
      list.push_back({{g, in, rows, true, false}, 1, "d w_ih"});
      list.push_back({{rows, in, g, false, false}, 1, "d input"});
    }
  }
  return list;
}

inline double step_flops(const std::vector<StepProduct>& list) {
  double flops = 0;
  for (const StepProduct& p : list) flops += 2.0 * p.shape.m * p.shape.n * p.shape.k * p.count;
  return flops;
}

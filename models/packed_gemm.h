// Single-precision matrix products for the CPU replica's float step, on the core's FMA units directly:
// register tiles of 12 vector accumulators (AVX2 + FMA) that read A where it lies and B from column panels in
// the tiles' order, packed once and kept for the many products that reuse it (the recurrent weights, for
// every time step of a pass). The libraries' general sgemm pack the weights again on each of those calls,
// which weighs most where the products are thinnest: at 16 rows per thread (a batch of 32 on two threads) the
// tiles ran the recurrent products 1.1-1.3x faster than oneDNN's sgemm (benchmarks/RESULTS.md, "Our own
// tiles"). CMake compiles packed_gemm_avx2.cpp for x86-64 with OpenMP, else packed_gemm_none.cpp; the kernels
// also need the CPU to have AVX2 and FMA (packed_gemm_missing).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::models {

// Why the packed products cannot run here ("" when they can): no x86-64 build, or no AVX2/FMA on this CPU.
std::string packed_gemm_missing();
// Whether this CPU has AVX-512: the tiles are AVX2 code, measured against the libraries on AVX2 CPUs only, so
// that is where model.cpu_kernels = auto takes them.
bool cpu_has_avx512();

// op(B)[k, n] (B row-major with leading dimension ldb, transposed when `trans`) copied into column panels
// of the register tile's width, in blocks of k, ready for packed_gemm. `rows` is the m of the products it
// will serve, which chooses the tile. Reused by products with the same B until packed again.
class PackedMatrix {
 public:
  void pack(bool trans, int k, int n, const float* b, int ldb, int rows);
  int k() const { return k_; }
  int n() const { return n_; }

  // Layout: for each block of kc rows of op(B) starting at row p, panels of `panel_width` columns, each kc x
  // panel_width row-major (zero past column n), at offset p * padded_n + panel * kc * panel_width.
  int panel_width() const { return panel_width_; }
  int padded_n() const { return padded_n_; }
  const float* data() const { return data_.data(); }

 private:
  std::vector<float> data_;
  int k_ = 0, n_ = 0, panel_width_ = 0, padded_n_ = 0;
};

// C[m, n] = op(A)[m, k] * B (+ C when `accumulate`), C row-major with leading dimension ldc; A row-major
// with leading dimension lda, transposed when `trans_a`. Runs on the calling thread.
void packed_gemm(bool trans_a, int m, const float* a, int lda, const PackedMatrix& b, bool accumulate,
                 float* c, int ldc);

}  // namespace ddp::models

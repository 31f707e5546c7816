// Single-precision matrix products for the CPU replica's float step, on the core's FMA units directly:
// register tiles of 12-16 vector accumulators (AVX2 + FMA, or AVX-512) that read A where it lies and B from
// column panels in the tiles' order, packed once and kept for the many products that reuse it (the recurrent
// weights, for every time step of a pass). The libraries' general sgemm pack the weights again on each of
// those calls, which weighs most where the products are thinnest: at 16 rows per thread (a batch of 32 on two
// threads) the tiles ran the recurrent products faster than oneDNN's sgemm (benchmarks/RESULTS.md, "Our own
// tiles"). CMake compiles packed_gemm_x86.cpp for x86-64 with OpenMP, else packed_gemm_none.cpp; the
// kernels also need the CPU to have AVX2 and FMA (packed_gemm_missing).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ddp::models {

// Why the packed products cannot run here ("" when they can): no x86-64 build, or no AVX2/FMA on this CPU.
std::string packed_gemm_missing();
// Whether this CPU has AVX-512 (AVX-512F, with the operating system's support for its registers).
bool cpu_has_avx512();

// Which register tiles a PackedMatrix is laid out for: AVX2 + FMA, or AVX-512 where the CPU has it (its
// taller tiles load less per FMA; best_packed_tiles takes them wherever they run).
enum class PackedTiles { kAvx2, kAvx512 };
PackedTiles best_packed_tiles();
inline const char* packed_tiles_name(PackedTiles tiles) {
  return tiles == PackedTiles::kAvx512 ? "AVX-512" : "AVX2";
}

// op(B)[k, n] (B row-major with leading dimension ldb, transposed when `trans`) copied into column panels
// of the register tile's width, in blocks of k, ready for packed_gemm. `rows` is the m of the products it
// will serve, which chooses the tile among `tiles`' shapes. Reused by products with the same B until packed
// again.
class PackedMatrix {
 public:
  void pack(bool trans, int k, int n, const float* b, int ldb, int rows,
            PackedTiles tiles = best_packed_tiles());
  int k() const { return k_; }
  int n() const { return n_; }

  // Layout: for each block of kc rows (kc from the panel width) of op(B) starting at row p, panels of
  // `panel_width` columns, each kc x panel_width row-major (zero past column n), at offset p * padded_n +
  // panel * kc * panel_width.
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

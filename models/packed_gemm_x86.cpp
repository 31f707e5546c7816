// The packed products on x86-64: register tiles in AVX2 + FMA and in AVX-512 (a target attribute on the
// kernels alone, so that nothing else of this file, and no inline function it shares with other files, needs
// the instructions), each used only where the CPU reports it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "engine/base/parallel_loops.h"
#include "models/packed_gemm.h"

namespace ddp::models {
namespace {

// Rows of op(B) per block: a panel's block (24 KB, 256 rows of 24 columns) stays in the 32 KB L1 while the
// strips of A pass.
int block_k(int panel_width) {
  return 6144 / panel_width;
}
// Rows of A that every panel of a block passes over before the next rows (a multiple of every tile's
// height): 120 KB of A at 256 rows of k, which stays in the L2 while the panels take turns.
constexpr int kBlockM = 120;

// The kernel of one tile: C[MR, ncols] (+)= A[MR, kc] times the packed panel of B [kc][NV vectors], A's
// element (i, p) at a[i * row_stride + p * col_stride], read in place, as either stride streams through the
// cache. The tail of the panel's columns goes through a buffer.
using TileFn = void (*)(int kc, const float* a, long row_stride, long col_stride, const float* b, float* c,
                        long ldc, bool accumulate, int ncols);

// AVX2 + FMA: 4 rows x 3 vectors (24 columns) or 6 rows x 2 (16 columns), 12 accumulators each, which hide
// the FMA's latency on two FMA units (latency 4-5 cycles: at least 8-10 independent sums) and leave, of the
// 16 registers, room for one row of B and a broadcast.
template <int MR, int NV>
__attribute__((target("avx2,fma"))) void tile_avx2(int kc, const float* a, long row_stride, long col_stride,
                                                   const float* b, float* c, long ldc, bool accumulate,
                                                   int ncols) {
  constexpr int kLanes = 8;
  __m256 sum[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) sum[i][v] = _mm256_setzero_ps();
  }
  for (int p = 0; p < kc; ++p) {
    __m256 row[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) row[v] = _mm256_loadu_ps(b + p * NV * kLanes + v * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m256 a_ip = _mm256_broadcast_ss(a + i * row_stride + p * col_stride);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) sum[i][v] = _mm256_fmadd_ps(a_ip, row[v], sum[i][v]);
    }
  }
  alignas(32) float buffer[NV * kLanes];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* out = c + i * ldc;
    if (ncols == NV * kLanes) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm256_storeu_ps(out + v * kLanes, accumulate
                                               ? _mm256_add_ps(sum[i][v], _mm256_loadu_ps(out + v * kLanes))
                                               : sum[i][v]);
      }
      continue;
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm256_store_ps(buffer + v * kLanes, sum[i][v]);
    for (int j = 0; j < ncols; ++j) out[j] = accumulate ? out[j] + buffer[j] : buffer[j];
  }
}

// AVX-512: 4 rows x 3 vectors (48 columns, 12 accumulators) or 8 rows x 2 (32 columns, 16 accumulators).
// Its 32 registers hold the taller tile with its row of B and a broadcast, so each B vector loaded feeds 8
// FMAs instead of 4-6, and each instruction does twice the work: on cores that run a 512-bit FMA as two
// 256-bit halves (AMD's Zen 4) the FMA rate is the same as AVX2's, and the AVX2 tiles are held back by the
// loads; on cores with two 512-bit FMA units (Intel's Xeons) the rate doubles.
template <int MR, int NV>
__attribute__((target("avx512f"))) void tile_avx512(int kc, const float* a, long row_stride, long col_stride,
                                                    const float* b, float* c, long ldc, bool accumulate,
                                                    int ncols) {
  constexpr int kLanes = 16;
  __m512 sum[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) sum[i][v] = _mm512_setzero_ps();
  }
  for (int p = 0; p < kc; ++p) {
    __m512 row[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) row[v] = _mm512_loadu_ps(b + p * NV * kLanes + v * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const __m512 a_ip = _mm512_set1_ps(a[i * row_stride + p * col_stride]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) sum[i][v] = _mm512_fmadd_ps(a_ip, row[v], sum[i][v]);
    }
  }
  alignas(64) float buffer[NV * kLanes];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* out = c + i * ldc;
    if (ncols == NV * kLanes) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        _mm512_storeu_ps(out + v * kLanes, accumulate
                                               ? _mm512_add_ps(sum[i][v], _mm512_loadu_ps(out + v * kLanes))
                                               : sum[i][v]);
      }
      continue;
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm512_store_ps(buffer + v * kLanes, sum[i][v]);
    for (int j = 0; j < ncols; ++j) out[j] = accumulate ? out[j] + buffer[j] : buffer[j];
  }
}

// A tile shape: its kernels for 1 to `rows` rows (the tail of m runs the same width with fewer rows), and
// what the cycle model needs. Widths differ between all shapes, so a panel's width names its kernels.
struct TileShape {
  PackedTiles isa;
  int width, rows, vectors;
  double fmas_per_cycle;  // vector FMAs a cycle: two units of 256 bits; one 512-bit FMA on the slower cores
  const TileFn* kernels;  // kernels[r - 1] for r rows
};

constexpr TileFn kAvx2Wide[] = {tile_avx2<1, 3>, tile_avx2<2, 3>, tile_avx2<3, 3>, tile_avx2<4, 3>};
constexpr TileFn kAvx2Narrow[] = {tile_avx2<1, 2>, tile_avx2<2, 2>, tile_avx2<3, 2>,
                                  tile_avx2<4, 2>, tile_avx2<5, 2>, tile_avx2<6, 2>};
constexpr TileFn kAvx512Wide[] = {tile_avx512<1, 3>, tile_avx512<2, 3>, tile_avx512<3, 3>, tile_avx512<4, 3>};
constexpr TileFn kAvx512Narrow[] = {tile_avx512<1, 2>, tile_avx512<2, 2>, tile_avx512<3, 2>,
                                    tile_avx512<4, 2>, tile_avx512<5, 2>, tile_avx512<6, 2>,
                                    tile_avx512<7, 2>, tile_avx512<8, 2>};

constexpr TileShape kShapes[] = {
    {PackedTiles::kAvx2, 24, 4, 3, 2.0, kAvx2Wide},
    {PackedTiles::kAvx2, 16, 6, 2, 2.0, kAvx2Narrow},
    {PackedTiles::kAvx512, 48, 4, 3, 1.0, kAvx512Wide},
    {PackedTiles::kAvx512, 32, 8, 2, 1.0, kAvx512Narrow},
};

const TileShape& shape_of(int panel_width) {
  for (const TileShape& shape : kShapes) {
    if (shape.width == panel_width) return shape;
  }
  throw std::logic_error("packed_gemm: no tile of width " + std::to_string(panel_width));
}

// Cycles per k of a tile of mr rows: the FMAs, the loads on two ports, or the FMA's latency (5 cycles on
// the slowest cores) when too few sums are independent.
double tile_cycles(const TileShape& shape, int mr) {
  return std::max({mr * shape.vectors / shape.fmas_per_cycle, (mr + shape.vectors) / 2.0, 5.0});
}

// The panel width of the given tiles that covers [rows, n] in the fewest cycles.
int best_panel_width(PackedTiles isa, int rows, int n) {
  double best_cycles = 0;
  int best = 0;
  for (const TileShape& shape : kShapes) {
    if (shape.isa != isa) continue;
    const int panels = (n + shape.width - 1) / shape.width, tail = rows % shape.rows;
    const double cycles = panels * ((rows / shape.rows) * tile_cycles(shape, shape.rows) +
                                    (tail > 0 ? tile_cycles(shape, tail) : 0));
    if (best == 0 || cycles < best_cycles) {
      best_cycles = cycles;
      best = shape.width;
    }
  }
  return best;
}

}  // namespace

std::string packed_gemm_missing() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "";
  return "this CPU has no AVX2 and FMA, which the packed products' kernels need";
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

PackedTiles best_packed_tiles() {
  return cpu_has_avx512() ? PackedTiles::kAvx512 : PackedTiles::kAvx2;
}

void PackedMatrix::pack(bool trans, int k, int n, const float* b, int ldb, int rows, PackedTiles tiles) {
  if (k <= 0 || n <= 0 || rows <= 0) throw std::invalid_argument("PackedMatrix: empty matrix");
  if (tiles == PackedTiles::kAvx512 && !cpu_has_avx512())
    throw std::invalid_argument("PackedMatrix: this CPU has no AVX-512");
  k_ = k;
  n_ = n;
  panel_width_ = best_panel_width(tiles, rows, n);
  const int block = block_k(panel_width_);
  const int panels = (n + panel_width_ - 1) / panel_width_;
  padded_n_ = panels * panel_width_;
  data_.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(padded_n_));
  // A panel per task: its blocks of k, each kc x width with zeros past column n.
  parallel_ranges(static_cast<std::size_t>(panels), 1, 4, [&](std::size_t first, std::size_t last) {
    for (int p0 = 0; p0 < k; p0 += block) {
      const int kc = std::min(block, k - p0);
      for (auto panel = static_cast<int>(first); panel < static_cast<int>(last); ++panel) {
        const int j0 = panel * panel_width_, width = std::min(panel_width_, n - j0);
        float* out = data_.data() + static_cast<std::ptrdiff_t>(p0) * padded_n_ +
                     static_cast<std::ptrdiff_t>(panel) * kc * panel_width_;
        if (width < panel_width_) std::fill_n(out, static_cast<std::size_t>(kc) * panel_width_, 0.0f);
        for (int j = 0; j < width && trans; ++j) {  // op(B)[p, j] = b[j, p]
          const float* from = b + static_cast<std::ptrdiff_t>(j0 + j) * ldb + p0;
          for (int p = 0; p < kc; ++p) out[p * panel_width_ + j] = from[p];
        }
        for (int p = 0; p < kc && !trans; ++p) {
          std::memcpy(out + p * panel_width_, b + static_cast<std::ptrdiff_t>(p0 + p) * ldb + j0,
                      static_cast<std::size_t>(width) * sizeof(float));
        }
      }
    }
  });
}

void packed_gemm(bool trans_a, int m, const float* a, int lda, const PackedMatrix& b, bool accumulate,
                 float* c, int ldc) {
  const TileShape& shape = shape_of(b.panel_width());
  const int width = shape.width, mr = shape.rows, k = b.k(), n = b.n(), block = block_k(width);
  const int panels = b.padded_n() / width;
  const long row_stride = trans_a ? 1 : lda, col_stride = trans_a ? lda : 1;
  for (int p0 = 0; p0 < k; p0 += block) {
    const int kc = std::min(block, k - p0);
    const bool add = accumulate || p0 > 0;  // later blocks of k add onto the first's
    for (int i0 = 0; i0 < m; i0 += kBlockM) {
      const int rows = std::min(kBlockM, m - i0);
      for (int panel = 0; panel < panels; ++panel) {
        const float* b_panel = b.data() + static_cast<std::ptrdiff_t>(p0) * b.padded_n() +
                               static_cast<std::ptrdiff_t>(panel) * kc * width;
        const int j0 = panel * width, ncols = std::min(width, n - j0);
        for (int s = 0; s < rows; s += mr) {
          const int i = i0 + s, height = std::min(mr, rows - s);
          shape.kernels[height - 1](kc, a + i * row_stride + p0 * col_stride, row_stride, col_stride, b_panel,
                                    c + static_cast<std::ptrdiff_t>(i) * ldc + j0, ldc, add, ncols);
        }
      }
    }
  }
}

}  // namespace ddp::models

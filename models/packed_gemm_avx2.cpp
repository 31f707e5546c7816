// The packed products on x86-64: the register tiles are AVX2 + FMA code (a target attribute on the kernels
// alone, so that nothing else of this file, and no inline function it shares with other files, needs the
// instructions), used only where the CPU reports both.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "engine/base/parallel_loops.h"
#include "models/packed_gemm.h"

namespace ddp::models {
namespace {

constexpr int kLanes = 8;  // floats in a 256-bit register
// Rows of op(B) per block: a panel of 24 columns (24 KB) stays in the 32 KB L1 while the strips of A pass.
constexpr int kBlockK = 256;
// Rows of A that every panel of a block passes over before the next rows (a multiple of both tiles'
// heights): 120 KB of A at kBlockK, which stays in the L2 while the panels take turns.
constexpr int kBlockM = 120;

// The tiles: 4 rows x 24 columns or 6 rows x 16, 12 accumulators each, which hide the FMA's latency on two
// FMA units (latency 4-5 cycles: at least 8-10 independent sums) and leave registers for one row of B and a
// broadcast. The tail of m runs the same width with fewer rows.
constexpr int kWideVectors = 3, kWideRows = 4;
constexpr int kNarrowVectors = 2, kNarrowRows = 6;

// C[MR, ncols] (+)= A[MR, kc] times the packed panel of B [kc][NV * 8], A's element (i, p) at
// a[i * row_stride + p * col_stride]: read in place, as either stride streams through the cache.
template <int MR, int NV>
__attribute__((target("avx2,fma"))) void tile(int kc, const float* a, long row_stride, long col_stride,
                                              const float* b, float* c, long ldc, bool accumulate,
                                              int ncols) {
  __m256 sum[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) sum[i][v] = _mm256_setzero_ps();
  }
  for (int p = 0; p < kc; ++p) {
    __m256 row[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) row[v] = _mm256_loadu_ps(b + p * NV * kLanes + v * kLanes);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a_ip = _mm256_broadcast_ss(a + i * row_stride + p * col_stride);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) sum[i][v] = _mm256_fmadd_ps(a_ip, row[v], sum[i][v]);
    }
  }
  if (ncols == NV * kLanes) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* out = c + i * ldc + v * kLanes;
        _mm256_storeu_ps(out, accumulate ? _mm256_add_ps(sum[i][v], _mm256_loadu_ps(out)) : sum[i][v]);
      }
    }
    return;
  }
  // The last panel of a width that is not a multiple of the tile's: through a buffer.
  alignas(32) float buffer[NV * kLanes];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) _mm256_store_ps(buffer + v * kLanes, sum[i][v]);
    float* out = c + i * ldc;
    for (int j = 0; j < ncols; ++j) out[j] = accumulate ? out[j] + buffer[j] : buffer[j];
  }
}

using TileFn = void (*)(int, const float*, long, long, const float*, float*, long, bool, int);

TileFn tile_for(int panel_width, int rows) {
  if (panel_width == kWideVectors * kLanes) {
    static constexpr TileFn kWide[] = {tile<1, 3>, tile<2, 3>, tile<3, 3>, tile<4, 3>};
    return kWide[rows - 1];
  }
  static constexpr TileFn kNarrow[] = {tile<1, 2>, tile<2, 2>, tile<3, 2>,
                                       tile<4, 2>, tile<5, 2>, tile<6, 2>};
  return kNarrow[rows - 1];
}

int tile_rows(int panel_width) {
  return panel_width == kWideVectors * kLanes ? kWideRows : kNarrowRows;
}

// Cycles per k of a tile of mr rows and nv vectors: the FMAs on two units, the loads on two ports, or the
// FMA's latency (5 cycles on the slowest cores) when too few sums are independent.
double tile_cycles(int mr, int nv) {
  return std::max({mr * nv / 2.0, (mr + nv) / 2.0, 5.0});
}

// The panel width whose tiles cover [rows, n] in the fewest cycles.
int best_panel_width(int rows, int n) {
  double best_cycles = 0;
  int best = 0;
  for (const int nv : {kWideVectors, kNarrowVectors}) {
    const int width = nv * kLanes, mr = tile_rows(width);
    const int panels = (n + width - 1) / width, tail = rows % mr;
    const double cycles =
        panels * ((rows / mr) * tile_cycles(mr, nv) + (tail > 0 ? tile_cycles(tail, nv) : 0));
    if (best == 0 || cycles < best_cycles) {
      best_cycles = cycles;
      best = width;
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

void PackedMatrix::pack(bool trans, int k, int n, const float* b, int ldb, int rows) {
  if (k <= 0 || n <= 0 || rows <= 0) throw std::invalid_argument("PackedMatrix: empty matrix");
  k_ = k;
  n_ = n;
  panel_width_ = best_panel_width(rows, n);
  const int panels = (n + panel_width_ - 1) / panel_width_;
  padded_n_ = panels * panel_width_;
  data_.resize(static_cast<std::size_t>(k) * static_cast<std::size_t>(padded_n_));
  // A panel per task: its blocks of k, each kc x width with zeros past column n.
  parallel_ranges(static_cast<std::size_t>(panels), 1, 4, [&](std::size_t first, std::size_t last) {
    for (int p0 = 0; p0 < k; p0 += kBlockK) {
      const int kc = std::min(kBlockK, k - p0);
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
  const int width = b.panel_width(), mr = tile_rows(width), k = b.k(), n = b.n();
  const int panels = b.padded_n() / width;
  const long row_stride = trans_a ? 1 : lda, col_stride = trans_a ? lda : 1;
  for (int p0 = 0; p0 < k; p0 += kBlockK) {
    const int kc = std::min(kBlockK, k - p0);
    const bool add = accumulate || p0 > 0;  // later blocks of k add onto the first's
    for (int i0 = 0; i0 < m; i0 += kBlockM) {
      const int rows = std::min(kBlockM, m - i0);
      for (int panel = 0; panel < panels; ++panel) {
        const float* b_panel = b.data() + static_cast<std::ptrdiff_t>(p0) * b.padded_n() +
                               static_cast<std::ptrdiff_t>(panel) * kc * width;
        const int j0 = panel * width, ncols = std::min(width, n - j0);
        for (int s = 0; s < rows; s += mr) {
          const int i = i0 + s, height = std::min(mr, rows - s);
          tile_for(width, height)(kc, a + i * row_stride + p0 * col_stride, row_stride, col_stride, b_panel,
                                  c + static_cast<std::ptrdiff_t>(i) * ldc + j0, ldc, add, ncols);
        }
      }
    }
  }
}

}  // namespace ddp::models

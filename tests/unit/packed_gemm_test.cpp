// The packed register tiles (models/packed_gemm.h), AVX2 and, where the CPU has it, AVX-512, against a
// product summed in double, over shapes that reach every edge: rows that leave a partial tile, widths that
// leave a partial panel of every tile width, k over several blocks, A transposed or not, leading dimensions
// wider than the matrices, and accumulation onto C.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "models/packed_gemm.h"

namespace ddp::models {
namespace {

struct Case {
  int m, n, k;
  bool trans_a, trans_b, accumulate;
};

// C (ldc = n + 3) after the packed product, and the same in double; returns the largest error relative to
// the sum of |terms| of each entry (the bound float rounding can reach).
double worst_relative_error(const Case& c, int rows_hint, PackedTiles tiles) {
  std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 17 + c.k));
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  // op(A)[m, k], op(B)[k, n], stored with padding past each row.
  const int lda = (c.trans_a ? c.m : c.k) + 5, ldb = (c.trans_b ? c.k : c.n) + 2, ldc = c.n + 3;
  std::vector<float> a(static_cast<std::size_t>(lda) * (c.trans_a ? c.k : c.m));
  std::vector<float> b(static_cast<std::size_t>(ldb) * (c.trans_b ? c.n : c.k));
  std::vector<float> out(static_cast<std::size_t>(ldc) * c.m);
  for (float& v : a) v = uniform(rng);
  for (float& v : b) v = uniform(rng);
  for (float& v : out) v = uniform(rng);
  const std::vector<float> before = out;
  const auto at_a = [&](int i, int p) { return a[c.trans_a ? p * lda + i : i * lda + p]; };
  const auto at_b = [&](int p, int j) { return b[c.trans_b ? j * ldb + p : p * ldb + j]; };

  PackedMatrix packed;
  packed.pack(c.trans_b, c.k, c.n, b.data(), ldb, rows_hint, tiles);
  packed_gemm(c.trans_a, c.m, a.data(), lda, packed, c.accumulate, out.data(), ldc);

  double worst = 0;
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < ldc; ++j) {
      const float got = out[static_cast<std::size_t>(i) * ldc + j];
      const float was = before[static_cast<std::size_t>(i) * ldc + j];
      if (j >= c.n) {  // past the matrix's width: untouched
        EXPECT_EQ(got, was) << "row " << i << " column " << j << " outside C was written";
        continue;
      }
      double sum = c.accumulate ? was : 0.0, magnitude = c.accumulate ? std::fabs(was) : 0.0;
      for (int p = 0; p < c.k; ++p) {
        sum += static_cast<double>(at_a(i, p)) * at_b(p, j);
        magnitude += std::fabs(static_cast<double>(at_a(i, p)) * at_b(p, j));
      }
      worst = std::max(worst, std::fabs(got - sum) / std::max(magnitude, 1e-30));
    }
  }
  return worst;
}

class PackedGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!packed_gemm_missing().empty()) GTEST_SKIP() << "skipped: " << packed_gemm_missing();
    if (cpu_has_avx512()) {
      tiles_.push_back(PackedTiles::kAvx512);
    } else {
      std::printf("the AVX-512 tiles are not tried: this CPU has no AVX-512\n");
    }
  }
  std::vector<PackedTiles> tiles_{PackedTiles::kAvx2};
};

TEST_F(PackedGemm, MatchesADoubleProductAtEveryEdge) {
  // m: partial tiles of 4, 6 and 8 rows and more than a block of rows (120); n: partial panels of 16, 24, 32
  // and 48 columns, narrower than a register; k: one, a partial block and more than a block (128-384).
  const Case cases[] = {
      {32, 512, 128, false, true, true},   {16, 512, 128, false, true, false},
      {32, 128, 512, false, false, false}, {32, 128, 512, false, false, true},
      {7, 37, 300, false, true, false},    {1, 5, 1, false, false, false},
      {13, 200, 257, true, false, true},   {512, 128, 600, true, false, false},
      {250, 96, 64, false, true, true},    {5, 23, 513, true, true, false},
      {3, 8, 17, false, false, true},      {121, 40, 9, true, false, false},
  };
  for (const PackedTiles tiles : tiles_) {
    for (const Case& c : cases) {
      for (const int rows_hint : {c.m, 4, 6, 8}) {  // the hint chooses the tile; every tile must be right
        SCOPED_TRACE(::testing::Message()
                     << (tiles == PackedTiles::kAvx512 ? "AVX-512" : "AVX2") << " m " << c.m << " n " << c.n
                     << " k " << c.k << " trans_a " << c.trans_a << " trans_b " << c.trans_b << " accumulate "
                     << c.accumulate << " rows hint " << rows_hint);
        // float sums of up to 600 terms: a few units of float's rounding (6e-8) times the terms' magnitude.
        EXPECT_LT(worst_relative_error(c, rows_hint, tiles), 1e-5);
      }
    }
  }
}

TEST_F(PackedGemm, ChoosesTheTileByTheRowsItWillServe) {
  // 32 rows of 512 columns: 8 whole tiles of 4 rows x 24 columns (the last panel partial) beat 5 tiles of 6
  // rows and a thin one of 2; 32 rows of 128: 16 columns divide the width, 24 leave a third of a panel idle.
  PackedMatrix packed;
  std::vector<float> b(512 * 128, 1.0f);
  packed.pack(true, 128, 512, b.data(), 128, 32, PackedTiles::kAvx2);
  EXPECT_EQ(packed.panel_width(), 24);
  EXPECT_EQ(packed.padded_n(), 528);
  packed.pack(false, 512, 128, b.data(), 128, 32, PackedTiles::kAvx2);
  EXPECT_EQ(packed.panel_width(), 16);
  EXPECT_EQ(packed.padded_n(), 128);
  EXPECT_THROW(packed.pack(false, 0, 128, b.data(), 128, 32), std::invalid_argument);
  if (!cpu_has_avx512()) {
    EXPECT_THROW(packed.pack(true, 128, 512, b.data(), 128, 32, PackedTiles::kAvx512), std::invalid_argument);
    return;
  }
  // AVX-512, one 512-bit FMA a cycle: 32 rows of 512 columns in 16 panels of 4 tiles of 8 rows x 32 columns
  // (16 FMAs a k each) beat 11 panels of 8 tiles of 4 rows x 48 (12 FMAs, the last panel partial); 32 rows
  // of 48 columns fit one panel of the wide tiles where the narrow ones would take two.
  packed.pack(true, 128, 512, b.data(), 128, 32, PackedTiles::kAvx512);
  EXPECT_EQ(packed.panel_width(), 32);
  EXPECT_EQ(packed.padded_n(), 512);
  packed.pack(false, 128, 48, b.data(), 48, 32, PackedTiles::kAvx512);
  EXPECT_EQ(packed.panel_width(), 48);
  EXPECT_EQ(packed.padded_n(), 48);
}

}  // namespace
}  // namespace ddp::models

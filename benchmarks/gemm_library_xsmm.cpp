// libxsmm's JIT small-matrix kernels over the product in tiles, the way a kernel built on them runs (its
// strength is the small recurrent products). Column-major: the row-major C = A B is C^T = B^T A^T. The tile
// sizes are chosen per shape on the first call by trying them all, so each product gets libxsmm's best.
#include <libxsmm.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>

#include "gemm_libraries.h"

namespace {

struct Tiling {
  int rows_of_ct = 0, cols_of_ct = 0, depth = 0;        // of C^T = B^T A^T: tile m, tile n, k-block
  libxsmm_smmfunction first = nullptr, rest = nullptr;  // beta 0 for the first k-block, 1 after
};

Tiling dispatch(const Product& p, int tm, int tn, int tk) {
  const libxsmm_blasint lda = p.n, ldb = p.k, ldc = p.n;
  const float one = 1, zero = 0;
  Tiling t{tm, tn, tk, nullptr, nullptr};
  t.first = libxsmm_smmdispatch(tm, tn, tk, &lda, &ldb, &ldc, &one, &zero, nullptr, nullptr);
  t.rest = libxsmm_smmdispatch(tm, tn, tk, &lda, &ldb, &ldc, &one, &one, nullptr, nullptr);
  return t;
}

void run_tiled(const Product& p, const Tiling& t, const float* a, const float* b, float* c) {
  for (int j = 0; j < p.m; j += t.cols_of_ct)
    for (int i = 0; i < p.n; i += t.rows_of_ct)
      for (int d = 0; d < p.k; d += t.depth) {
        (d == 0 ? t.first : t.rest)(b + static_cast<std::size_t>(d) * p.n + i,
                                    a + static_cast<std::size_t>(j) * p.k + d,
                                    c + static_cast<std::size_t>(j) * p.n + i);
      }
}

Tiling best_tiling(const Product& p, const float* a, const float* b, float* c) {
  Tiling best;
  double fastest = 1e30;
  // Tiles of powers of two, and the whole dimension (for the small shapes).
  for (int tm : {16, 32, 64, 128, 256, 512, p.n})
    for (int tn : {4, 8, 16, 32, 64, p.m})
      for (int tk : {32, 64, 128, 256, 512, p.k}) {
        if (p.n % tm != 0 || p.m % tn != 0 || p.k % tk != 0) continue;
        const Tiling t = dispatch(p, tm, tn, tk);
        if (t.first == nullptr || t.rest == nullptr) continue;
        run_tiled(p, t, a, b, c);
        const auto start = std::chrono::steady_clock::now();
        for (int r = 0; r < 3; ++r) run_tiled(p, t, a, b, c);
        const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (took < fastest) fastest = took, best = t;
      }
  if (best.first == nullptr) {
    throw std::runtime_error("libxsmm: no tiling of " + std::to_string(p.m) + " x " + std::to_string(p.n) +
                             " x " + std::to_string(p.k));
  }
  return best;
}

}  // namespace

SgemmLibrary libxsmm_library() {
  libxsmm_init();
  auto tilings = std::make_shared<std::map<std::tuple<int, int, int>, Tiling>>();
  return {"libxsmm " LIBXSMM_VERSION,
          "",
          false,
          [tilings](const Product& p, const float* a, const float* b, float* c) {
            auto [at, fresh] = tilings->try_emplace({p.m, p.n, p.k});
            if (fresh) at->second = best_tiling(p, a, b, c);
            run_tiled(p, at->second, a, b, c);
          },
          {}};
}

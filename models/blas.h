// One name for the single and double precision matrix products, so that the templated model code calls
// gemm() whatever its scalar. Row-major, as every buffer of the model is.
#pragma once

#include <cblas.h>

namespace ddp::models {

enum class Trans { kNo, kYes };

inline CBLAS_TRANSPOSE to_cblas(Trans t) {
  return t == Trans::kYes ? CblasTrans : CblasNoTrans;
}

// C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C.
inline void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

inline void gemm(Trans trans_a, Trans trans_b, int m, int n, int k, double alpha, const double* a, int lda,
                 const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, to_cblas(trans_a), to_cblas(trans_b), m, n, k, alpha, a, lda, b, ldb, beta, c,
              ldc);
}

}  // namespace ddp::models

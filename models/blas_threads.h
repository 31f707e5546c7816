// Sets the BLAS's thread count for this process. CMake compiles the file for the BLAS it found.
#pragma once

#include <string>

namespace ddp::models {

// Returns false if this BLAS cannot be told (then its own environment variable, e.g. MKL_NUM_THREADS, rules).
bool set_blas_threads(int threads);
// "OpenBLAS 0.3.21 (pthreads)" or the vendor's name, for the start-up log.
std::string blas_description();

// Advice where the BLAS runs kernels without the CPU's AVX2 and FMA units (OpenBLAS's run-time dispatch falls
// back to its oldest x86-64 kernels on a virtual CPU whose model it does not recognise, several times slower
// than oneDNN's sgemm on one core of such a VM: gemm_library_bench), naming the setting that fixes it;
// empty where the kernels fit the CPU or the BLAS is not OpenBLAS.
std::string blas_kernels_hint();
// The rule alone: `core` as OpenBLAS names its kernels (openblas_get_corename), what the CPU supports, and
// OPENBLAS_CORETYPE's value (empty where unset).
std::string openblas_core_hint(const std::string& core, bool avx2_fma, bool avx512,
                               const std::string& coretype);

}  // namespace ddp::models

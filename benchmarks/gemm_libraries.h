// The CPU libraries an LSTM's matrix products could run on, behind one row-major sgemm signature, so that
// gemm_library_bench can time each on the step's own products. CMake compiles libxsmm's file where Debian's
// libxsmm-dev is installed; oneDNN's and BLIS's sgemm are opened at run time, so the benchmark needs neither.
#pragma once

#include <functional>
#include <string>

#include "step_products.h"

struct SgemmLibrary {
  std::string name;
  std::string missing;     // why it cannot run here; empty where it can
  bool transposes = true;  // false: runs only products with neither operand transposed
  std::function<void(const Product&, const float* a, const float* b, float* c)> run;
  // Called before each product's `count` calls on new operands (may be empty): a library that keeps its B
  // operand packed between calls, as the replica keeps the recurrent weights through a pass, packs again.
  std::function<void()> new_operands;
};

// One thread each: the question is a core's rate. `path` is the shared library to open where it applies.
SgemmLibrary blas_library();  // the BLAS the project links (cblas_sgemm)
SgemmLibrary onednn_library(const std::string& path);
SgemmLibrary blis_library(const std::string& path);
SgemmLibrary libxsmm_library();

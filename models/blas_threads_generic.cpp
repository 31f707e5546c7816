#include "models/blas_threads.h"

namespace ddp::models {

bool set_blas_threads(int) {
  return false;
}

std::string blas_description() {
  return "BLAS (" DDPTRAIN_BLAS_VENDOR ", threads from its environment variable)";
}

// Only OpenBLAS's run-time kernel choice is known to misfire this way.
std::string blas_kernels_hint() {
  return "";
}

}  // namespace ddp::models

#include <cblas.h>

#include "models/blas_threads.h"

namespace ddp::models {

bool set_blas_threads(int threads) {
  openblas_set_num_threads(threads);
  return true;
}

std::string blas_description() {
  return openblas_get_config();
}

}  // namespace ddp::models

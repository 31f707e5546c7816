#include <stdexcept>

#include "models/onednn_lstm.h"

namespace ddp::models {

std::string onednn_missing() {
  return "this build has no oneDNN (install libdnnl-dev and build again)";
}

std::string onednn_description() {
  return "";
}

bool onednn_runs_avx512() {
  return false;
}

void set_onednn_threads(int /*threads*/) {}

std::unique_ptr<OnednnLstmLayer> make_onednn_layer(Cell /*cell*/, bool /*reverse*/) {
  throw std::runtime_error(onednn_missing());
}

void onednn_sgemm(bool /*trans_a*/, bool /*trans_b*/, int /*m*/, int /*n*/, int /*k*/, float /*alpha*/,
                  const float* /*a*/, int /*lda*/, const float* /*b*/, int /*ldb*/, float /*beta*/,
                  float* /*c*/, int /*ldc*/) {
  throw std::runtime_error(onednn_missing());
}

}  // namespace ddp::models

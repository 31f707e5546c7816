#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "models/blas_threads.h"

namespace ddp::models {

std::string openblas_core_hint(const std::string& core, bool avx2_fma, bool avx512,
                               const std::string& coretype) {
  if (!avx2_fma || core.empty()) return "";
  std::string name = core;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  // OpenBLAS's x86-64 kernel sets built on AVX2 and FMA (or wider).
  constexpr std::array<const char*, 6> kAvx2Cores = {"haswell",        "zen",      "skylakex", "cooperlake",
                                                     "sapphirerapids", "excavator"};
  if (std::find(kAvx2Cores.begin(), kAvx2Cores.end(), name) != kAvx2Cores.end()) return "";
  const std::string wanted = avx512 ? "SkylakeX" : "Haswell";
  const std::string why = coretype.empty()
                              ? "it did not recognise the CPU's model, as on some virtual machines"
                              : "OPENBLAS_CORETYPE=" + coretype + " asks for them";
  return "OpenBLAS runs its " + core + " kernels on a CPU with " + (avx512 ? "AVX-512" : "AVX2 and FMA") +
         " (" + why +
         "), so its matrix products run several times slower than they could: set OPENBLAS_CORETYPE=" +
         wanted + " in the job's environment (mpirun -x OPENBLAS_CORETYPE=" + wanted + ")";
}

}  // namespace ddp::models

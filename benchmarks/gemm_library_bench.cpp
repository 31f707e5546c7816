// The LSTM step's matrix products on each CPU library that could run them, one core each: the measurement
// behind the choice of the CPU replica's kernel library. For every product of one training step at the IMDB
// shapes (batch 32, seq 80, E = H = 128; the forward input projection over the whole sequence, the 80
// recurrent products each way, the weight and input gradients) it times the BLAS the project links
// (OpenBLAS), oneDNN's sgemm, BLIS and libxsmm's JIT kernels, twice: with the operands transposed as the
// hand-written replica issues them, and with none transposed (the layout a kernel built around a library
// would choose), and on the project's own packed register tiles (models/packed_gemm.h). Rounds run the
// libraries in turn, so all meet the same load; medians are printed, with the step's sum beside the physical
// floor (the same FLOPs at the core's peak FMA rate, peak_flops.h).
//
//   build/benchmarks/gemm_library_bench [--blis /usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4]
#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gemm_libraries.h"
#include "models/blas_threads.h"
#include "models/onednn_lstm.h"
#include "models/packed_gemm.h"
#include "peak_flops.h"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

SgemmLibrary blas_library() {
  return {ddp::models::blas_description(),
          "",
          true,
          [](const Product& p, const float* a, const float* b, float* c) {
            cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans,
                        p.trans_b ? CblasTrans : CblasNoTrans, p.m, p.n, p.k, 1.0f, a, p.trans_a ? p.m : p.k,
                        b, p.trans_b ? p.k : p.n, 0.0f, c, p.n);
          },
          {}};
}

SgemmLibrary onednn_library(const std::string& path) {
  using Sgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                        int64_t, float, float*, int64_t);
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  auto sgemm = library != nullptr ? reinterpret_cast<Sgemm>(dlsym(library, "dnnl_sgemm")) : nullptr;
  if (sgemm == nullptr) return {"oneDNN sgemm", "cannot open " + path + " (--onednn)", true, {}, {}};
  return {"oneDNN sgemm",
          "",
          true,
          [sgemm](const Product& p, const float* a, const float* b, float* c) {
            sgemm(p.trans_a ? 'T' : 'N', p.trans_b ? 'T' : 'N', p.m, p.n, p.k, 1.0f, a, p.trans_a ? p.m : p.k,
                  b, p.trans_b ? p.k : p.n, 0.0f, c, p.n);
          },
          {}};
}

SgemmLibrary blis_library(const std::string& path) {
  // BLIS's typed API: transposes as trans_t (0 none, 8 transpose), strides per row and column.
  using Sgemm = void (*)(int, int, int64_t, int64_t, int64_t, const float*, const float*, int64_t, int64_t,
                         const float*, int64_t, int64_t, const float*, float*, int64_t, int64_t);
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  auto sgemm = library != nullptr ? reinterpret_cast<Sgemm>(dlsym(library, "bli_sgemm")) : nullptr;
  if (sgemm == nullptr) return {"BLIS", "cannot open " + path + " (--blis; Debian's libblis4)", true, {}, {}};
  return {"BLIS",
          "",
          true,
          [sgemm](const Product& p, const float* a, const float* b, float* c) {
            const float one = 1, zero = 0;
            constexpr int kTranspose = 8;
            sgemm(p.trans_a ? kTranspose : 0, p.trans_b ? kTranspose : 0, p.m, p.n, p.k, &one, a,
                  p.trans_a ? p.m : p.k, 1, b, p.trans_b ? p.k : p.n, 1, &zero, c, p.n, 1);
          },
          {}};
}

// ddptrain's own register tiles (models/packed_gemm.h): B packed on the first call after new operands and
// kept for the product's other calls, as the replica packs the recurrent weights once per pass.
SgemmLibrary packed_library(ddp::models::PackedTiles tiles) {
  const std::string name =
      tiles == ddp::models::PackedTiles::kAvx512 ? "packed AVX-512 tiles" : "packed AVX2 tiles";
  if (const std::string why = ddp::models::packed_gemm_missing(); !why.empty())
    return {name, why, true, {}, {}};
  if (tiles == ddp::models::PackedTiles::kAvx512 && !ddp::models::cpu_has_avx512()) {
    return {name, "this CPU has no AVX-512", true, {}, {}};
  }
  auto packed = std::make_shared<ddp::models::PackedMatrix>();
  auto fresh = std::make_shared<bool>(true);
  return {name, "", true,
          [packed, fresh, tiles](const Product& p, const float* a, const float* b, float* c) {
            if (*fresh) packed->pack(p.trans_b, p.k, p.n, b, p.trans_b ? p.k : p.n, p.m, tiles);
            *fresh = false;
            ddp::models::packed_gemm(p.trans_a, p.m, a, p.trans_a ? p.m : p.k, *packed, false, c, p.n);
          },
          [fresh] { *fresh = true; }};
}

namespace {

// With `as_the_replica` false, the same products with neither operand transposed.
std::vector<StepProduct> lstm_step(int batch, int seq, int embed, int hidden, bool as_the_replica) {
  std::vector<StepProduct> step = step_products({batch, seq, embed, hidden, 1, 4, 1});
  if (!as_the_replica) {
    for (StepProduct& p : step) p.shape.trans_a = p.shape.trans_b = false;
  }
  return step;
}

double flops(const StepProduct& p) {
  return step_flops({p});
}

// Seconds for the product's `count` calls, averaged over as many repetitions as fill `seconds`.
double time_product(const SgemmLibrary& library, const StepProduct& p, const std::vector<float>& a,
                    const std::vector<float>& b, std::vector<float>& c, double seconds) {
  const auto new_operands = [&] {
    if (library.new_operands) library.new_operands();
  };
  new_operands();
  library.run(p.shape, a.data(), b.data(), c.data());
  int repetitions = 0;
  double took = 0;
  const auto start = Clock::now();
  do {
    new_operands();
    for (int i = 0; i < p.count; ++i) library.run(p.shape, a.data(), b.data(), c.data());
    ++repetitions;
    took = std::chrono::duration<double>(Clock::now() - start).count();
  } while (took < seconds);
  return took / repetitions;
}

// A column's title: the name and version, without a BLAS's build options.
std::string short_name(const SgemmLibrary& library) {
  const std::size_t first_space = library.name.find(' ');
  if (first_space == std::string::npos) return library.name;
  return library.name.substr(0, library.name.find(' ', first_space + 1));
}

double median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

}  // namespace

// The tables, once the options are checked.
int run(int batch, int seq, int embed, int hidden, int rounds, double seconds, const std::string& blis_path,
        const std::string& onednn_path);

int main(int argc, char** argv) {
  int batch = 32, seq = 80, embed = 128, hidden = 128, rounds = 5;
  double seconds = 0.1;
  std::string blis_path = "libblis.so.4", onednn_path = "libdnnl.so.2";
  po::options_description options("gemm_library_bench");
  options.add_options()("help", "this help")("batch", po::value(&batch)->default_value(batch), "batch")(
      "seq", po::value(&seq)->default_value(seq), "sequence length")(
      "embed", po::value(&embed)->default_value(embed), "embedding width")(
      "hidden", po::value(&hidden)->default_value(hidden), "LSTM hidden size")(
      "rounds", po::value(&rounds)->default_value(rounds), "rounds, every library in turn; medians printed")(
      "seconds", po::value(&seconds)->default_value(seconds), "least seconds timed per product and round")(
      "blis", po::value(&blis_path)->default_value(blis_path), "BLIS's shared library")(
      "onednn", po::value(&onednn_path)->default_value(onednn_path), "oneDNN's shared library");
  po::variables_map args;
  try {
    po::store(po::parse_command_line(argc, argv, options), args);
    po::notify(args);
  } catch (const po::error& e) {
    std::fprintf(stderr, "gemm_library_bench: %s\n", e.what());
    return 2;
  }
  if (args.count("help") != 0U) {
    std::cout << options;
    return 0;
  }
  if (batch < 1 || seq < 1 || embed < 1 || hidden < 1 || rounds < 1 || !(seconds > 0)) {
    std::fprintf(stderr, "gemm_library_bench: every size, --rounds and --seconds must be positive\n");
    return 2;
  }
  try {
    return run(batch, seq, embed, hidden, rounds, seconds, blis_path, onednn_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gemm_library_bench: %s\n", e.what());
    return 1;
  }
}

int run(int batch, int seq, int embed, int hidden, int rounds, double seconds, const std::string& blis_path,
        const std::string& onednn_path) {
  // One core's rate: every library on one thread (OpenMP's, for oneDNN, set before it starts).
  setenv("OMP_NUM_THREADS", "1", 1);
  ddp::models::set_onednn_threads(1);
  ddp::models::set_blas_threads(1);
  std::vector<SgemmLibrary> libraries = {blas_library(),
                                         onednn_library(onednn_path),
                                         blis_library(blis_path),
                                         libxsmm_library(),
                                         packed_library(ddp::models::PackedTiles::kAvx2),
                                         packed_library(ddp::models::PackedTiles::kAvx512)};
  for (const SgemmLibrary& library : libraries) {
    if (!library.missing.empty()) std::printf("%s: %s\n", library.name.c_str(), library.missing.c_str());
  }
  for (const SgemmLibrary& library : libraries) {
    if (library.missing.empty()) std::printf("%s: one thread\n", library.name.c_str());
  }
  std::erase_if(libraries, [](const SgemmLibrary& library) { return !library.missing.empty(); });

  const std::size_t most = std::max<std::size_t>(
      {static_cast<std::size_t>(batch) * seq * 4 * hidden, static_cast<std::size_t>(batch) * seq * embed,
       static_cast<std::size_t>(4) * hidden * std::max(embed, hidden)});
  std::vector<float> a(most), b(most), c(most);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& x : a) x = uniform(rng);
  for (float& x : b) x = uniform(rng);

  const PeakFlops peak = measure_peak_flops(1, 0.5);
  std::printf(
      "one core: peak %.1f GFLOP/s (an FMA-only %s kernel); batch %d, seq %d, E %d, H %d; median of %d "
      "rounds\n",
      peak.gflops, peak.isa.c_str(), batch, seq, embed, hidden, rounds);
  for (bool as_the_replica : {true, false}) {
    const std::vector<StepProduct> step = lstm_step(batch, seq, embed, hidden, as_the_replica);
    // seconds[library][product][round]
    std::vector<std::vector<std::vector<double>>> took(libraries.size(),
                                                       std::vector<std::vector<double>>(step.size()));
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t l = 0; l < libraries.size(); ++l) {
        if (as_the_replica && !libraries[l].transposes) continue;
        for (std::size_t p = 0; p < step.size(); ++p) {
          took[l][p].push_back(time_product(libraries[l], step[p], a, b, c, seconds));
        }
      }
    }
    std::printf("\n%s\n%-22s",
                as_the_replica ? "operands transposed as the hand-written replica issues them"
                               : "no operand transposed",
                "product (ms, GFLOP/s)");
    for (const SgemmLibrary& library : libraries) std::printf(" | %-24.24s", short_name(library).c_str());
    std::printf("\n");
    std::vector<double> total(libraries.size(), 0.0);
    double step_flops = 0;
    for (std::size_t p = 0; p < step.size(); ++p) {
      step_flops += flops(step[p]);
      std::printf("%-22s", step[p].what);
      for (std::size_t l = 0; l < libraries.size(); ++l) {
        if (took[l][p].empty()) {
          std::printf(" | %-24s", "(no transposes)");
          continue;
        }
        const double s = median(took[l][p]);
        total[l] += s;
        std::printf(" | %8.3f ms %5.1f       ", s * 1e3, flops(step[p]) / s / 1e9);
      }
      std::printf("\n");
    }
    std::printf("%-22s", "step's products");
    for (std::size_t l = 0; l < libraries.size(); ++l) {
      if (total[l] == 0) {
        std::printf(" | %-24s", "");
        continue;
      }
      std::printf(" | %8.2f ms %5.2fx floor", total[l] * 1e3, total[l] / (step_flops / (peak.gflops * 1e9)));
    }
    std::printf("\nphysical floor: %.3f GFLOP at %.1f GFLOP/s = %.2f ms\n", step_flops / 1e9, peak.gflops,
                step_flops / (peak.gflops * 1e9) * 1e3);
  }
  return 0;
}

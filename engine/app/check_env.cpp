// `ddptrain check-env`: what a node offers for training, and whether a training step works there. Every rank
// gathers its own facts (binding, GPUs, library versions) and runs a one-step smoke test; rank 0 prints one
// report per node and a verdict with advice, and every rank exits with the same code.
#include <hdf5.h>
#include <mpi.h>

#include <fmt/format.h>
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/mpi_check.h"
#include "engine/app/commands.h"
#include "engine/base/errors.h"
#include "engine/base/json.h"
#include "engine/command_line.h"
#include "engine/device.h"
#include "engine/optimizer.h"
#include "engine/self_check.h"
#include "engine/topology.h"
#include "models/blas_threads.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/param_layout.h"
#include "models/replica.h"

namespace po = boost::program_options;

namespace ddp::engine {

// The facts of device.h and topology.h that check-env sends to rank 0.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GpuInfo, index, name, pci_bus_id, total_memory_bytes, compute_major,
                                   compute_minor)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GpuSoftwareVersions, driver, cuda_runtime, cudnn, nccl)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CoreCount, online, allowed)

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// The model of the default config (the Keras imdb_lstm), whose shapes the GPU checks use.
const models::ModelShape kImdbShape{20000, 128, 128, 1};

// --- The smoke test -----------------------------------------------------------------------------------

// A tiny model and a fixed batch: one step takes milliseconds on any device.
constexpr int kSmokeVocab = 40;
constexpr int kSmokeBatch = 8;
constexpr int kSmokeSeq = 12;
constexpr uint64_t kSmokeSeed = 7;
// Keras's initializers start the classifier near p = 0.5 for every sample, so the mean BCE is near ln 2.
constexpr double kLossTolerance = 0.05;
constexpr double kGpuCpuTolerance = 1e-4;  // relative, loss of the GPU replica against the CPU one

models::ModelShape smoke_shape() {
  models::ModelShape shape;
  shape.vocab_size = kSmokeVocab;
  shape.embedding_dim = 8;
  shape.hidden = 8;
  shape.layers = 1;
  return shape;
}

struct HostBatch {
  std::vector<int32_t> tokens;
  std::vector<float> labels;
};

// Deterministic tokens (some rows left-padded with 0) and alternating labels.
HostBatch smoke_batch() {
  HostBatch batch;
  for (int b = 0; b < kSmokeBatch; ++b) {
    for (int t = 0; t < kSmokeSeq; ++t) {
      const bool padding = t < b % 3;
      batch.tokens.push_back(padding ? 0 : (b * 7 + t * 3) % (kSmokeVocab - 1) + 1);
    }
    batch.labels.push_back(static_cast<float>(b % 2));
  }
  return batch;
}

// One train_step: the mean loss, and the gradients copied to `grads`.
double one_step(models::Replica& replica, const BatchView& batch, std::vector<float>* grads) {
  replica.train_step(batch, [](const models::ParamSegment&) {});
  const models::BatchStats stats = replica.take_stats();
  grads->assign(replica.layout().total_size(), 0.0f);
  replica.copy_grads_to_host(*grads);
  if (stats.count != batch.batch) {
    throw std::runtime_error("the step counted " + std::to_string(stats.count) + " samples instead of " +
                             std::to_string(batch.batch));
  }
  return stats.loss_sum / static_cast<double>(stats.count);
}

// Throws when the loss is not near ln 2 or a segment's gradient is not finite or all zero.
void check_step(const std::string& where, double loss, const models::ParamLayout& layout,
                const std::vector<float>& grads) {
  if (!std::isfinite(loss)) throw std::runtime_error(where + " loss is " + std::to_string(loss));
  if (std::abs(loss - std::log(2.0)) > kLossTolerance) {
    throw std::runtime_error(where + " loss " + std::to_string(loss) + " is not near ln 2 = 0.6931");
  }
  for (const models::ParamSegment& segment : layout.segments()) {
    double squares = 0;
    for (std::size_t i = segment.offset; i < segment.offset + segment.size; ++i) {
      squares += static_cast<double>(grads[i]) * grads[i];
    }
    if (!std::isfinite(squares))
      throw std::runtime_error(where + " gradient of " + segment.name + " is not finite");
    if (squares == 0) throw std::runtime_error(where + " gradient of " + segment.name + " is all zero");
  }
}

struct SmokeResult {
  bool ok = false;
  std::string device;      // "cpu" or "cuda:N"
  double loss = kNaN;      // on the rank's device
  double cpu_loss = kNaN;  // the CPU replica's on the same parameters, for a GPU rank
  double millis = 0;
  std::string error;
};

// Builds the replica on the rank's device, initializes it, runs one step and checks it. Never throws: a
// failure, a failed CUDA or cuDNN call too, is reported, so that no rank leaves the others waiting.
SmokeResult smoke_test(const Topology& topology) {
  SmokeResult result;
  result.device = topology.device;
  const auto start = std::chrono::steady_clock::now();
  try {
    const ThrowFatalErrors report_instead_of_abort;  // no MPI call in here: no other rank can be left waiting
    const models::ModelShape shape = smoke_shape();
    const models::ParamLayout layout(shape);
    std::vector<float> params(layout.total_size());
    models::initialize_keras(layout, params, kSmokeSeed);
    HostBatch host = smoke_batch();
    const BatchView host_view{host.tokens.data(), host.labels.data(), kSmokeBatch, kSmokeSeq};

    auto cpu = models::make_cpu_replica(shape);
    cpu->copy_params_from_host(params);
    std::vector<float> cpu_grads;
    const double cpu_loss = one_step(*cpu, host_view, &cpu_grads);
    if (topology.gpu < 0) {
      check_step("CPU", cpu_loss, layout, cpu_grads);
      result.loss = cpu_loss;
    } else {
      auto gpu = models::make_cuda_replica(shape, topology.gpu);
      gpu->copy_params_from_host(params);
      const DeviceBuffer tokens(topology.gpu, host.tokens.data(), host.tokens.size() * sizeof(int32_t));
      const DeviceBuffer labels(topology.gpu, host.labels.data(), host.labels.size() * sizeof(float));
      const BatchView device_view{static_cast<const int32_t*>(tokens.data()),
                                  static_cast<const float*>(labels.data()), kSmokeBatch, kSmokeSeq};
      std::vector<float> gpu_grads;
      result.loss = one_step(*gpu, device_view, &gpu_grads);
      result.cpu_loss = cpu_loss;
      check_step("GPU", result.loss, layout, gpu_grads);
      if (std::abs(result.loss - cpu_loss) > kGpuCpuTolerance * std::abs(cpu_loss)) {
        throw std::runtime_error("GPU loss " + std::to_string(result.loss) + " differs from the CPU's " +
                                 std::to_string(cpu_loss) + " on the same parameters");
      }
    }
    result.ok = true;
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  result.millis = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// The trainer's self-check (self_check.h) at the IMDB model's shapes, the default config's: its training
// batch and a short last batch. Never throws.
SelfCheckReport self_check(int gpu) {
  const std::vector<std::pair<int, int>> shapes{{32, 80}, {7, 80}};
  try {
    const ThrowFatalErrors report_instead_of_abort;
    auto replica = models::make_cuda_replica(kImdbShape, gpu);
    for (const auto& [batch, seq] : shapes) replica->settle_shape(batch, seq, replica->try_shape(batch, seq));
    return check_gpu_replica(*replica, gpu, shapes, OptimizerSettings{}, kSmokeSeed);
  } catch (const std::exception& e) {
    SelfCheckReport report;
    report.ok = false;
    report.failure = std::string("the GPU replica could not be made: ") + e.what();
    return report;
  }
}

// Collective over MPI_COMM_WORLD: the GPU ranks whose replica passed its self-check (`ready`) average the
// IMDB model's gradient segments over NCCL, without and with each compression, against the closed form
// (self_check.h). Nothing (ran = false) on other ranks, or where fewer than two GPU ranks are ready.
SelfCheckReport nccl_check(int gpu, bool ready, bool& ran) {
  ran = false;
  MPI_Comm gpus = MPI_COMM_NULL;
  DDP_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, ready ? 0 : MPI_UNDEFINED, 0, &gpus));
  SelfCheckReport report;
  if (gpus == MPI_COMM_NULL) return report;
  int size = 0;
  DDP_CHECK_MPI(MPI_Comm_size(gpus, &size));
  if (size >= 2) {
    ran = true;
    const models::ParamLayout imdb(kImdbShape);
    std::vector<std::size_t> sizes;
    for (const models::ParamSegment& s : imdb.segments()) sizes.push_back(s.size);
    for (const std::string compression : {"none", "fp16", "bf16"}) {
      auto nccl = comm::make_nccl_communicator(gpus, nullptr, compression);
      report.add(check_gpu_communicator(*nccl, gpu, sizes, compression));
    }
  }
  DDP_CHECK_MPI(MPI_Comm_free(&gpus));
  return report;
}

// --- Facts of one rank, and their transport to rank 0 ----------------------------------------------------

struct RankFacts {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  std::string visible_devices;
  std::string device;
  std::string device_reason;
  std::string device_detail;  // the full text behind a brief device_reason (Topology::device_detail)
  std::string bound_gpu;      // "name, bus id" of the GPU the rank would train on
  bool cuda_built = false;
  bool gpus_probed = false;
  std::string why_no_gpu;
  std::string why_no_gpu_brief;
  std::vector<GpuInfo> gpus;
  std::vector<std::string> peer_rows;  // row i, column j: 'Y', 'N', '-' (itself) or '?' (CUDA refused)
  GpuSoftwareVersions versions;
  std::string mpi;
  std::string hdf5;
  std::string blas;
  CoreCount cores;
  std::string cores_hint;  // a CPU rank that its binding leaves fewer cores than its share
  SmokeResult smoke;
  // A GPU rank's self-check at the IMDB model's shapes (self_check.h); not run on a CPU rank.
  bool self_check_ran = false;
  bool self_check_ok = false;
  std::string self_check;  // SelfCheckReport::summary()
  // NCCL's averages among the GPU ranks that passed their self-check, where there are two or more.
  bool nccl_check_ran = false;
  bool nccl_check_ok = false;
  std::string nccl_check;  // SelfCheckReport::summary()
};

// Facts travel to rank 0 as JSON (a GPU name or a CUDA error text may hold any character).
void to_json(nlohmann::json& out, const SmokeResult& s) {
  out = {{"ok", s.ok}, {"device", s.device}, {"error", s.error}};
  json::put_number(out, "loss", s.loss);
  json::put_number(out, "cpu_loss", s.cpu_loss);
  json::put_number(out, "millis", s.millis);
}
void from_json(const nlohmann::json& in, SmokeResult& s) {
  s.ok = in.at("ok").get<bool>();
  s.device = in.at("device").get<std::string>();
  s.error = in.at("error").get<std::string>();
  s.loss = json::number_at(in, "loss");
  s.cpu_loss = json::number_at(in, "cpu_loss");
  s.millis = json::number_at(in, "millis");
}
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankFacts, rank, local_rank, host, visible_devices, device, device_reason,
                                   device_detail, bound_gpu, cuda_built, gpus_probed, why_no_gpu,
                                   why_no_gpu_brief, gpus, peer_rows, versions, mpi, hdf5, blas, cores,
                                   cores_hint, smoke, self_check_ran, self_check_ok, self_check,
                                   nccl_check_ran, nccl_check_ok, nccl_check)

// --- Gathering ---------------------------------------------------------------------------------------

std::string mpi_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  DDP_CHECK_MPI(MPI_Get_library_version(text, &length));
  const std::string all(text, static_cast<std::size_t>(std::max(0, length)));
  return all.substr(0, all.find('\n'));
}

std::string hdf5_version() {
  unsigned major = 0;
  unsigned minor = 0;
  unsigned release = 0;
  if (H5get_libversion(&major, &minor, &release) < 0) return "unknown (H5get_libversion failed)";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::vector<std::string> peer_matrix(const std::vector<GpuInfo>& gpus) {
  std::vector<std::string> rows;
  for (const GpuInfo& from : gpus) {
    std::string row;
    for (const GpuInfo& to : gpus) {
      if (from.index == to.index) {
        row += '-';
        continue;
      }
      try {
        row += gpu_peer_access(from.index, to.index) ? 'Y' : 'N';
      } catch (const std::exception&) {
        row += '?';
      }
    }
    rows.push_back(row);
  }
  return rows;
}

// Collective over MPI_COMM_WORLD (discover_topology).
RankFacts gather_facts(const std::string& device_request) {
  RankFacts f;
  // "auto" shows the GPU each rank would bind without failing where there is none; the verdict judges.
  const Topology topology = discover_topology(MPI_COMM_WORLD, device_request == "cpu" ? "cpu" : "auto");
  f.rank = topology.rank;
  f.local_rank = topology.local_rank;
  f.host = topology.host;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  f.visible_devices = visible != nullptr ? visible : "unset";
  f.device = topology.device;
  f.device_reason = topology.device_reason;
  f.device_detail = topology.device_detail;
  if (topology.gpu >= 0) f.bound_gpu = topology.gpu_name + ", " + topology.gpu_bus_id;
  if (device_request != "cpu") {  // a CPU check creates no CUDA context
    const GpuInventory inventory = probe_gpus();
    f.gpus_probed = true;
    f.cuda_built = inventory.cuda_built;
    f.why_no_gpu = inventory.why_none;
    f.why_no_gpu_brief = inventory.why_none_brief;
    f.gpus = inventory.gpus;
    f.peer_rows = peer_matrix(inventory.gpus);
  }
  f.versions = gpu_software_versions();
  f.mpi = mpi_version();
  f.hdf5 = hdf5_version();
  f.blas = models::blas_description();
  f.cores = core_count();
  f.cores_hint = idle_cores_hint(topology, /*requested_threads=*/0);
  models::set_blas_threads(1);  // a tiny step; ranks of a node must not fight over cores
  f.smoke = smoke_test(topology);
  if (topology.gpu >= 0 && f.smoke.ok) {
    const SelfCheckReport report = self_check(topology.gpu);
    f.self_check_ran = true;
    f.self_check_ok = report.ok;
    f.self_check = report.summary();
  }
  const SelfCheckReport nccl = nccl_check(topology.gpu, f.self_check_ok, f.nccl_check_ran);
  f.nccl_check_ok = nccl.ok;
  if (f.nccl_check_ran) f.nccl_check = nccl.summary();
  return f;
}

// --- The report ----------------------------------------------------------------------------------------

std::string gpu_line(const GpuInfo& g) {
  const double mib = static_cast<double>(g.total_memory_bytes) / (1024.0 * 1024.0);
  return g.name + ", " + fmt::format("{:.0f}", mib) + " MiB, compute " + std::to_string(g.compute_major) +
         "." + std::to_string(g.compute_minor) + ", bus " + (g.pci_bus_id.empty() ? "unknown" : g.pci_bus_id);
}

std::string smoke_line(const SmokeResult& s) {
  if (!s.ok) return "FAILED on " + s.device + ": " + s.error;
  std::string line = "OK on " + s.device + ": loss " + fmt::format("{:.6f}", s.loss);
  if (std::isfinite(s.cpu_loss)) line += " (CPU replica " + fmt::format("{:.6f}", s.cpu_loss) + ")";
  return line + ", gradients finite and non-zero, " + fmt::format("{:.1f}", s.millis) + " ms";
}

// Prints one node's report; returns its problems (empty: OK).
// `full`: CUDA's own words where a GPU is missing (--verbose, or --device cuda, where a GPU was asked for);
// otherwise a few words, since a node without GPUs is a CPU node working as meant.
std::vector<std::string> report_node(const std::string& host, const std::vector<RankFacts>& ranks,
                                     const std::string& device_request, bool full) {
  const RankFacts& first = ranks.front();
  // The rank that sees the most GPUs speaks for the node's GPUs (ranks may have their own
  // CUDA_VISIBLE_DEVICES).
  const RankFacts* widest = &first;
  for (const RankFacts& r : ranks) {
    if (r.gpus.size() > widest->gpus.size()) widest = &r;
  }
  std::printf("\n=== node %s: %zu rank(s) ===\n", host.c_str(), ranks.size());
  const auto row = [](const char* label, const std::string& value) {
    std::printf("  %-14s %s\n", label, value.c_str());
  };
  row("NVIDIA driver", first.versions.driver);
  row("CUDA runtime", first.versions.cuda_runtime);
  row("cuDNN", first.versions.cudnn);
  row("NCCL", first.versions.nccl);
  row("MPI", first.mpi);
  row("HDF5", first.hdf5);
  row("BLAS", first.blas);
  if (!first.gpus_probed) {
    row("GPUs", "not checked (--device cpu)");
  } else if (widest->gpus.empty()) {
    row("GPUs", "none: " + (full ? first.why_no_gpu : first.why_no_gpu_brief));
  } else {
    const std::string seen_by = widest->rank == first.rank && ranks.size() == 1
                                    ? ""
                                    : " (as rank " + std::to_string(widest->rank) + " sees them)";
    row("GPUs", std::to_string(widest->gpus.size()) + seen_by);
    for (const GpuInfo& g : widest->gpus) std::printf("    GPU %d: %s\n", g.index, gpu_line(g).c_str());
    if (widest->gpus.size() > 1) {
      row("peer access", "row GPU reads and writes column GPU's memory directly (Y/N)");
      std::string header = "         ";
      for (const GpuInfo& g : widest->gpus) header += " " + std::to_string(g.index);
      std::printf("%s\n", header.c_str());
      for (std::size_t i = 0; i < widest->peer_rows.size() && i < widest->gpus.size(); ++i) {
        std::string line = "    GPU " + std::to_string(widest->gpus[i].index) + " ";
        for (const char c : widest->peer_rows[i]) line += std::string(" ") + c;
        std::printf("%s\n", line.c_str());
      }
    }
  }
  std::vector<std::string> problems;
  std::vector<int> unbound;
  for (const RankFacts& r : ranks) {
    // A rank that sees no GPU says why in a few words: "device cpu (no GPU driver)".
    std::string what;
    if (!r.bound_gpu.empty()) {
      what = " (" + r.bound_gpu + ")";
    } else if (r.gpus_probed && r.gpus.empty()) {
      what = " (" + r.why_no_gpu_brief + ")";
    }
    std::printf("  rank %d: local rank %d, CUDA_VISIBLE_DEVICES=%s, device %s%s\n", r.rank, r.local_rank,
                r.visible_devices.c_str(), r.device.c_str(), what.c_str());
    const std::string& binding = full && !r.device_detail.empty() ? r.device_detail : r.device_reason;
    std::printf("    binding: %s\n", binding.c_str());
    std::printf("    cores: %d of the node's %d\n", r.cores.allowed, r.cores.online);
    if (!r.cores_hint.empty()) std::printf("    hint: %s\n", r.cores_hint.c_str());
    std::printf("    smoke test: %s\n", smoke_line(r.smoke).c_str());
    if (r.self_check_ran) std::printf("    self-check: %s\n", r.self_check.c_str());
    if (r.nccl_check_ran) std::printf("    NCCL check: %s\n", r.nccl_check.c_str());
    if (r.device == "cpu") unbound.push_back(r.rank);
  }

  if (device_request == "cuda") {
    if (widest->gpus.empty()) {
      // A container started without --gpus has no driver either; the same advice covers it.
      const std::string driver_note =
          first.versions.driver.rfind("none", 0) == 0 ? " (no NVIDIA driver is loaded)" : "";
      if (first.cuda_built) {
        problems.push_back(
            "no GPU visible" + driver_note +
            ": check CUDA_VISIBLE_DEVICES / --gres (Slurm) / --gpus (docker); on CPU-only nodes use "
            "--device auto (the default) or cpu");
      } else {
        problems.push_back(
            "no GPU visible: built without CUDA (reconfigure with -DDDPTRAIN_CUDA=ON where the CUDA toolkit, "
            "cuDNN and NCCL are installed); on CPU-only nodes use --device auto (the default) or cpu");
      }
    } else if (!unbound.empty()) {
      std::string which;
      for (const int r : unbound) which += (which.empty() ? "" : ", ") + std::to_string(r);
      problems.push_back("more ranks than GPUs on node " + host + ": " + std::to_string(ranks.size()) +
                         " ranks, " + std::to_string(widest->gpus.size()) + " GPU(s) visible, rank(s) " +
                         which + " without a GPU: start at most " + std::to_string(widest->gpus.size()) +
                         " ranks per node, or use --device auto to train the extra ranks on the CPU");
    }
  }
  for (const RankFacts& r : ranks) {
    if (!r.smoke.ok)
      problems.push_back("smoke test failed on rank " + std::to_string(r.rank) + ": " + r.smoke.error);
    if (r.self_check_ran && !r.self_check_ok)
      problems.push_back("self-check failed on rank " + std::to_string(r.rank) + " (" + r.bound_gpu +
                         "): " + r.self_check + ": training there would give wrong results");
    if (r.nccl_check_ran && !r.nccl_check_ok)
      problems.push_back("NCCL check failed on rank " + std::to_string(r.rank) + " (" + r.bound_gpu +
                         "): " + r.nccl_check + ": gradients would be averaged wrongly");
  }
  if (problems.empty() && widest->gpus.empty() && first.gpus_probed) {
    std::printf("  verdict: OK (no GPU: training runs on the CPU)\n");
  } else if (problems.empty()) {
    std::printf("  verdict: OK\n");
  } else {
    for (const std::string& p : problems) std::printf("  verdict: PROBLEM: %s\n", p.c_str());
  }
  return problems;
}

// Prints the whole report on rank 0; returns whether any node has a problem.
bool report(const std::vector<RankFacts>& all, const std::string& device_request, bool verbose) {
  std::vector<std::string> hosts;  // in order of their first rank
  std::map<std::string, std::vector<RankFacts>> by_host;
  for (const RankFacts& f : all) {
    if (!by_host.count(f.host)) hosts.push_back(f.host);
    by_host[f.host].push_back(f);
  }
  std::printf("ddptrain %s check-env --device %s: %zu rank(s) on %zu node(s)\n", DDPTRAIN_VERSION,
              device_request.c_str(), all.size(), hosts.size());
  std::size_t failing = 0;
  for (const std::string& host : hosts)
    failing +=
        report_node(host, by_host[host], device_request, verbose || device_request == "cuda").empty() ? 0 : 1;
  if (failing == 0) {
    std::printf("\ncheck-env: OK\n");
  } else {
    std::printf("\ncheck-env: PROBLEM on %zu of %zu node(s) (exit code %d)\n", failing, hosts.size(),
                kExitEnvironmentProblem);
  }
  std::fflush(stdout);
  return failing > 0;
}

}  // namespace

int check_env_command(const std::vector<std::string>& args) {
  // auto, as training's default: a CPU-only node is fine unless GPUs are asked for.
  std::string device = "auto";
  bool verbose = false;
  po::options_description desc("ddptrain check-env (also under mpirun/srun: one report per node)");
  desc.add_options()("help,h", "print this help")(
      "device", po::value(&device)->default_value(device),
      "auto: GPUs where there are, else the CPU | cuda: this node must train on GPUs | cpu: a CPU-only node "
      "(no GPU probed)")("verbose,v", po::bool_switch(&verbose),
                         "where a GPU is missing, CUDA's own words (always with --device cuda)");
  int rank = 0;
  DDP_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  const std::string usage =
      "ddptrain check-env [--device auto|cuda|cpu] [--verbose]\nExit codes: 0 everything fine, 2 bad "
      "options, " +
      std::to_string(kExitEnvironmentProblem) + " a problem was found (the report says what to do).";
  auto comm = comm::make_mpi_communicator(MPI_COMM_WORLD);
  bool run = false;
  comm::agree_on_errors(*comm, [&] {
    run = parse_subcommand(args, desc, "check-env", usage, /*print_help=*/rank == 0);
    if (run && device != "cuda" && device != "cpu" && device != "auto") {
      throw UserError("check-env: --device must be cuda, cpu or auto, got '" + device + "'");
    }
  });
  if (!run) return kExitOk;

  const RankFacts mine = gather_facts(device);
  const std::vector<std::string> texts = comm->gather(nlohmann::json(mine).dump(), 0);
  std::vector<double> problem{0};
  if (comm->rank() == 0) {
    std::vector<RankFacts> all;
    for (const std::string& text : texts) all.push_back(nlohmann::json::parse(text).get<RankFacts>());
    problem[0] = report(all, device, verbose) ? 1 : 0;
  }
  comm->broadcast(problem, 0);
  return problem[0] != 0 ? kExitEnvironmentProblem : kExitOk;
}

}  // namespace ddp::engine

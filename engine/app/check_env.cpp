// `ddptrain check-env`: what a node offers for training, and whether a training step works there. Every rank
// gathers its own facts (rank_facts.h: binding, GPUs, library versions, the node checks); rank 0 prints one
// report per node and a verdict with advice, and every rank exits with the same code.
#include <fmt/format.h>
#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "engine/app/commands.h"
#include "engine/app/rank_facts.h"
#include "engine/base/errors.h"
#include "engine/command_line.h"
#include "engine/config.h"
#include "engine/watchdog.h"

namespace po = boost::program_options;

namespace ddp::engine {
namespace {

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
  if (!first.blas_hint.empty()) std::printf("    hint: %s\n", first.blas_hint.c_str());
  row("Unicode", first.unicode + " (the tokenizer's tables and word dictionaries)");
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

std::unique_ptr<ProgressWatchdog> check_env_watchdog(double timeout_s) {
  return std::make_unique<ProgressWatchdog>(
      timeout_s,
      [](const std::string& reason) {
        fatal(reason + "; ending check-env (the rank that did not finish is the one to look at)", __FILE__,
              __LINE__, kExitEnvironmentProblem);
      },
      ProgressWatchdog::HealthCheck{}, "check-env --timeout");
}

double check_env_timeout_early(const std::vector<std::string>& args) {
  double timeout_s = Config{}.comm.timeout_s;  // training's default
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--timeout" && i + 1 < args.size()) {
      value = args[i + 1];
    } else if (args[i].starts_with("--timeout=")) {
      value = args[i].substr(std::string("--timeout=").size());
    } else {
      continue;
    }
    char* end = nullptr;
    const double parsed = std::strtod(value.c_str(), &end);
    if (end != value.c_str() && *end == '\0' && parsed >= 1) timeout_s = parsed;
  }
  return timeout_s;
}

int check_env_command(const std::vector<std::string>& args, std::unique_ptr<ProgressWatchdog>& watchdog) {
  // auto, as training's default: a CPU-only node is fine unless GPUs are asked for.
  std::string device = "auto";
  bool verbose = false;
  double timeout_s = watchdog->timeout_s();
  po::options_description desc("ddptrain check-env (also under mpirun/srun: one report per node)");
  desc.add_options()("help,h", "print this help")(
      "device", po::value(&device)->default_value(device),
      "auto: GPUs where there are, else the CPU | cuda: this node must train on GPUs | cpu: a CPU-only node "
      "(no GPU probed)")("verbose,v", po::bool_switch(&verbose),
                         "where a GPU is missing, CUDA's own words (always with --device cuda)")(
      "timeout", po::value(&timeout_s)->default_value(timeout_s),
      "seconds a rank may wait for the others (a GPU probe that hangs, a rank that never comes) before "
      "check-env ends the job and says where it waited");
  comm::HostGroup world = comm::HostGroup::world();
  const int rank = world.rank();
  const std::string usage =
      "ddptrain check-env [--device auto|cuda|cpu] [--verbose] [--timeout S]\nExit codes: 0 everything fine, "
      "2 bad options, " +
      std::to_string(kExitEnvironmentProblem) + " a problem was found (the report says what to do).";
  bool run = false;
  comm::agree_on_errors(world, [&] {
    run = parse_subcommand(args, desc, "check-env", usage, /*print_help=*/rank == 0);
    if (run && device != "cuda" && device != "cpu" && device != "auto") {
      throw UserError("check-env: --device must be cuda, cpu or auto, got '" + device + "'");
    }
    if (run && !(timeout_s >= 1)) {
      throw UserError("check-env: --timeout must be at least 1 (seconds), got " +
                      fmt::format("{}", timeout_s));
    }
  });
  if (!run) return kExitOk;

  // A node with a broken GPU may hang in the very probe meant to find it: a rank that waits past the timeout
  // ends the job, naming what it was waiting in, rather than leave the report waiting forever.
  watchdog.reset();
  watchdog = check_env_watchdog(timeout_s);
  watchdog->enter("checking this rank's node (GPUs, smoke test, self-checks, NCCL)");
  const RankFacts mine = gather_facts(world, device);
  watchdog->enter("gathering every rank's report to rank 0, and its verdict");
  const std::vector<std::string> texts = world.gather(facts_to_json(mine), 0);
  std::vector<double> problem{0};
  if (world.rank() == 0) {
    std::vector<RankFacts> all;
    for (const std::string& text : texts) all.push_back(facts_from_json(text));
    problem[0] = report(all, device, verbose) ? 1 : 0;
  }
  world.broadcast(problem, 0);
  return problem[0] != 0 ? kExitEnvironmentProblem : kExitOk;
}

}  // namespace ddp::engine

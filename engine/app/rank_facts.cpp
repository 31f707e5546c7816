#include "engine/app/rank_facts.h"

#include <hdf5.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "comm/mpi_session.h"
#include "engine/base/errors.h"
#include "io/tokenizer.h"
#include "models/blas_threads.h"

namespace ddp::engine {

// The facts of device.h and topology.h that check-env sends to rank 0.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GpuInfo, index, name, pci_bus_id, total_memory_bytes, compute_major,
                                   compute_minor)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(GpuSoftwareVersions, driver, cuda_runtime, cudnn, nccl)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(CoreCount, online, allowed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(RankFacts, rank, local_rank, host, visible_devices, device, device_reason,
                                   device_detail, bound_gpu, cuda_built, gpus_probed, why_no_gpu,
                                   why_no_gpu_brief, gpus, peer_rows, versions, mpi, hdf5, blas, blas_hint,
                                   unicode, cores, cores_hint, smoke, self_check_ran, self_check_ok,
                                   self_check, nccl_check_ran, nccl_check_ok, nccl_check)

namespace {

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

}  // namespace

RankFacts gather_facts(comm::HostGroup& world, const std::string& device_request) {
  RankFacts f;
  // The GPU each rank would bind, described without failing where there is none; the verdict judges.
  const Topology topology = discover_topology(world, device_request, /*refuse_unmet=*/false);
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
  f.mpi = comm::mpi_library_version();
  f.hdf5 = hdf5_version();
  f.blas = models::blas_description();
  f.blas_hint = models::blas_kernels_hint();
  f.unicode = io::unicode_library_version();
  f.cores = core_count();
  f.cores_hint = idle_cores_hint(topology, /*requested_threads=*/0);
  models::set_blas_threads(1);  // a tiny step; ranks of a node must not fight over cores
  f.smoke = smoke_test(topology);
  if (topology.gpu >= 0 && f.smoke.ok) {
    const SelfCheckReport report = imdb_self_check(topology.gpu);
    f.self_check_ran = true;
    f.self_check_ok = report.ok;
    f.self_check = report.summary();
  }
  const std::string board =
      topology.gpu >= 0 && !topology.gpu_bus_id.empty() ? topology.host + " PCI " + topology.gpu_bus_id : "";
  const SelfCheckReport nccl = nccl_check(world, topology.gpu, board, f.self_check_ok, f.nccl_check_ran);
  f.nccl_check_ok = nccl.ok;
  if (f.nccl_check_ran) f.nccl_check = nccl.summary();
  return f;
}

// Facts travel to rank 0 as JSON (a GPU name or a CUDA error text may hold any character).
std::string facts_to_json(const RankFacts& facts) {
  return nlohmann::json(facts).dump();
}

RankFacts facts_from_json(const std::string& text) {
  return nlohmann::json::parse(text).get<RankFacts>();
}

}  // namespace ddp::engine

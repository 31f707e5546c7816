#include "engine/topology.h"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/host_group.h"
#include "engine/base/errors.h"
#include "engine/device.h"

namespace ddp::engine {
namespace {

std::string visible_devices() {
  const char* value = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("CUDA_VISIBLE_DEVICES=") + (value != nullptr ? value : "unset");
}

// The boards this rank sees, in CUDA's order: equal keys mean the same GPUs.
std::string visible_key(const GpuInventory& inventory) {
  std::string key;
  for (const GpuInfo& gpu : inventory.gpus) {
    key += gpu.pci_bus_id.empty() ? gpu.name + "#" + std::to_string(gpu.index) : gpu.pci_bus_id;
    key += ';';
  }
  return key;
}

struct GpuGroup {
  int index = 0;    // this rank's position among the node's ranks that see the same GPUs
  int members = 1;  // how many ranks of the node see them
};

// Collective over `node`: whether the launcher gave every rank all the node's GPUs (one group, index = local
// rank) or each rank its own CUDA_VISIBLE_DEVICES (groups of one, index 0).
GpuGroup gpu_group(comm::HostGroup& node, const std::string& mine) {
  const int local_rank = node.rank();
  const std::vector<std::string> keys = node.all_gather(mine);
  GpuGroup group{0, 0};
  for (std::size_t r = 0; r < keys.size(); ++r) {
    if (keys[r] != mine) continue;
    ++group.members;
    if (static_cast<int>(r) < local_rank) ++group.index;
  }
  return group;
}

}  // namespace

Topology discover_topology(comm::HostGroup& world, const std::string& device_request, bool refuse_unmet) {
  Topology t;
  t.rank = world.rank();
  t.size = world.size();
  std::optional<comm::HostGroup> node(world.node());
  t.local_rank = node->rank();
  t.local_size = node->size();
  t.host = host_name();

  // A CPU job never touches CUDA. Every rank has the same request, so either all or none of them gather.
  GpuInventory inventory;
  GpuGroup group;
  if (device_request != "cpu") {
    inventory = probe_gpus();
    group = gpu_group(*node, visible_key(inventory));
  }
  node.reset();

  if (device_request == "cpu") {
    t.device_reason = "device = cpu";
    return t;
  }
  const bool required = device_request == "cuda";
  const std::string request = required ? "device = cuda: " : "device = auto: ";
  // What becomes of a rank left without a GPU.
  const std::string fallback = required ? ", which a run refuses" : ", training on CPU";
  const std::string visible = visible_devices();
  const int count = static_cast<int>(inventory.gpus.size());
  if (count == 0) {
    if (required && refuse_unmet) throw UserError(request + inventory.why_none + " (" + visible + ")");
    t.device_reason = request + inventory.why_none + " (" + visible + ")" + fallback;
    if (inventory.why_none_brief != inventory.why_none) {
      // device = auto on a node without GPUs is a CPU node working as meant: a few words, not CUDA's error.
      t.device_detail = t.device_reason;
      t.device_reason = request + inventory.why_none_brief;
      if (std::getenv("CUDA_VISIBLE_DEVICES") != nullptr) t.device_reason += " (" + visible + ")";
    }
    return t;
  }
  const std::string local_rank = std::to_string(t.local_rank);
  const std::string gpus = std::to_string(count);
  if (group.index >= count) {
    if (required && refuse_unmet) {
      throw UserError(request + "host " + t.host + " runs " + std::to_string(group.members) +
                      " ranks but sees only " + gpus + " GPUs (" + visible + "): start at most " + gpus +
                      " ranks per node, or set device = auto to train the extra ranks on CPU");
    }
    const std::string slot = group.index == t.local_rank ? std::string()
                                                         : " (" + std::to_string(group.index) +
                                                               " among the ranks that see the same GPUs)";
    t.device_reason = request + "local rank " + local_rank + slot + " >= " + gpus + " visible GPUs (" +
                      visible + ")" + fallback;
    return t;
  }
  const GpuInfo& gpu = inventory.gpus[static_cast<std::size_t>(group.index)];
  t.gpu = gpu.index;
  t.gpu_name = gpu.name;
  t.gpu_bus_id = gpu.pci_bus_id;
  t.device = "cuda:" + std::to_string(t.gpu);
  t.device_reason = request + "local rank " + local_rank + " -> GPU " + std::to_string(t.gpu) + " of " +
                    gpus + " (" + visible + ")";
  use_gpu(t.gpu);
  return t;
}

CoreCount core_count() {
  CoreCount c;
  c.online = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t mask;
  CPU_ZERO(&mask);
  c.allowed = sched_getaffinity(0, sizeof(mask), &mask) == 0 ? CPU_COUNT(&mask) : c.online;
  return c;
}

int compute_threads_for(const Topology& topology, int requested) {
  if (requested > 0) return requested;
  const CoreCount c = core_count();
  // A launcher that bound this rank to its own cores already did the sharing; otherwise share the node.
  if (c.allowed < c.online) return std::max(1, c.allowed);
  return std::max(1, c.online / std::max(1, topology.local_size));
}

std::string idle_cores_hint(const Topology& topology, int requested_threads) {
  if (requested_threads > 0 || topology.gpu >= 0) return "";
  const CoreCount c = core_count();
  return idle_cores_hint(c.online, c.allowed, topology.local_size);
}

std::string idle_cores_hint(int online, int allowed, int local_size) {
  const int share = online / std::max(1, local_size);
  if (allowed >= share) return "";
  const std::string binding = "the launcher bound this rank to " + std::to_string(allowed) +
                              " of the node's " + std::to_string(online) + " cores, less than its share of " +
                              std::to_string(share) + " with " + std::to_string(local_size) +
                              " rank(s) on the node";
  return binding + "; mpirun --bind-to none (or srun --cpus-per-task) lets it use more";
}

}  // namespace ddp::engine

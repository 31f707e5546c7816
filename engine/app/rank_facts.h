// One rank's facts for `ddptrain check-env`: its binding, its node's GPUs and their peer access, the library
// versions, its cores, and the results of the node checks (node_checks.h); gathered on every rank and sent
// to rank 0 as JSON.
#pragma once

#include <string>
#include <vector>

#include "comm/host_group.h"
#include "engine/app/node_checks.h"
#include "engine/device.h"
#include "engine/topology.h"

namespace ddp::engine {

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
  std::string blas_hint;  // the BLAS runs kernels older than the CPU (models::blas_kernels_hint)
  std::string unicode;    // the tokenizer's Unicode library (io::unicode_library_version)
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

// Collective over `world` (discover_topology, the NCCL check): this rank's facts, the checks run on
// its device as `device_request` (auto, cuda or cpu) binds it.
RankFacts gather_facts(comm::HostGroup& world, const std::string& device_request);

// The facts as JSON text and back.
std::string facts_to_json(const RankFacts& facts);
RankFacts facts_from_json(const std::string& text);

}  // namespace ddp::engine

// The checks `ddptrain check-env` runs on each rank (check_env.cpp reports them): a one-step smoke test on
// the rank's device, and on a GPU the trainer's self-check at the IMDB model's shapes and, among the GPU
// ranks, NCCL's averages (self_check.h).
#pragma once

#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "comm/host_group.h"
#include "engine/self_check.h"
#include "engine/topology.h"

namespace ddp::engine {

struct SmokeResult {
  bool ok = false;
  std::string device;                                      // "cpu" or "cuda:N"
  double loss = std::numeric_limits<double>::quiet_NaN();  // on the rank's device
  double cpu_loss =
      std::numeric_limits<double>::quiet_NaN();  // the CPU replica's on the same parameters, for a GPU rank
  double millis = 0;
  std::string error;
};

// Builds a tiny replica on the rank's device, initializes it, runs one step and checks it. Never throws: a
// failure, a failed CUDA or cuDNN call too, is reported, so that no rank leaves the others waiting.
SmokeResult smoke_test(const Topology& topology);

// The trainer's self-check (self_check.h) at the IMDB model's shapes, the default config's: its training
// batch and a short last batch. Never throws.
SelfCheckReport imdb_self_check(int gpu);

// Collective over `world`: the GPU ranks whose replica passed its self-check (`ready`) average the
// IMDB model's gradient segments over NCCL, without and with each compression, against the closed form
// (self_check.h). Nothing (ran = false) on other ranks, or where fewer than two GPU ranks are ready. Two
// ranks on one GPU board (`board`: comm::BackendRequest::gpu_board) and a failed NCCL set-up are reported
// as the check's failure on every GPU rank, not by ending the job.
SelfCheckReport nccl_check(comm::HostGroup& world, int gpu, const std::string& board, bool ready, bool& ran);

// To rank 0 as JSON (a NaN loss as null, engine/base/json.h).
void to_json(nlohmann::json& out, const SmokeResult& s);
void from_json(const nlohmann::json& in, SmokeResult& s);

}  // namespace ddp::engine

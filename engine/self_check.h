// The check a GPU rank runs before its first step, and `ddptrain check-env` on every GPU: the device's
// replica against the CPU replica on the same parameters and batches, the parameter mapping round trip, and
// one optimizer step; with several ranks, the communicator's averages against their closed form. Nothing
// about the GPU path has been trusted before it ran there, so it proves itself where it first runs. The
// trainer, check-env and tests/gpu call these same functions, so they cannot drift apart.
//
// Tolerances come from the float32 CPU replica itself: the GPU's error against the float64 reference may be
// at most kErrorFactor times the CPU's own (both round in float; cuDNN sums in another order), or a floor
// for values the CPU happens to hit almost exactly. A wrong weight mapping, gate order or kernel gives
// errors of the size of the values themselves, orders of magnitude above either bound.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "engine/optimizer.h"
#include "models/replica.h"

namespace ddp::engine {

struct SelfCheckReport {
  bool ok = true;
  // The first check that failed: "<check>: largest error E at <where> (bound B)".
  std::string failure;
  // What passed, for the start log: "replica = CPU on 32x80, 7x80; mapping exact; adam step exact".
  std::vector<std::string> passed;
  double seconds = 0;

  // "passed in 0.41 s (...)" or "FAILED: <failure>".
  std::string summary() const;
  // This report followed by `next`: what both passed, the first failure, the time of both.
  void add(const SelfCheckReport& next);
};

// Allowed error against the float64 reference: kErrorFactor x the float32 CPU replica's, at least
// kRelativeFloor x the reference's size.
constexpr double kErrorFactor = 16;
constexpr double kRelativeFloor = 1e-4;

// `replica` runs on GPU `device` (or on the CPU: how the check itself is tested); its parameters and
// running stats are overwritten (load the real ones afterwards). For each (batch, seq) of `shapes`, the
// shapes the run will meet: one train_step and predict on generated data against the CPU replicas (float and
// double) on the same parameters, comparing the loss, every parameter tensor's gradient and the
// probabilities; then check_parameter_mapping(), and one step of the optimizer `settings` names on the GPU
// against the host optimizer, on the same gradients: bit for bit. CUDA failures on the way are reported as
// the check's failure (a check-env on a broken node must say so); call it only where no other rank waits for
// this one in a collective meanwhile, or agree on the result. `options` are the replica's (masking; the
// CPU replicas run them without dropout, which the GPU replica does not run).
SelfCheckReport check_gpu_replica(models::Replica& replica, int device,
                                  std::span<const std::pair<int, int>> shapes, OptimizerSettings settings,
                                  uint64_t seed, const models::ModelOptions& options = {});

// Collective over `comm`, whose averages run in the memory of GPU `device` (NCCL): comm::check_average over
// a buffer on that GPU, in the run's segments (`segment_sizes`, as the replica hands them to
// start_average), within comm::average_tolerance(compression, ranks). Every rank gets the same verdict; the
// failure names the rank and element with the largest error. CUDA failures on the way are reported as the
// check's failure on this rank and agreed on, so no rank is left waiting in a collective.
SelfCheckReport check_gpu_communicator(comm::Communicator& comm, int device,
                                       std::span<const std::size_t> segment_sizes,
                                       const std::string& compression);

}  // namespace ddp::engine

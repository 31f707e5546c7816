// The check a GPU rank runs before its first step, and `ddptrain check-env` on every GPU: the device's
// replica against the CPU replica, the run's batch shapes against themselves, the parameter mapping round
// trip, and one optimizer step; with several ranks, the communicator's averages against their closed form.
// Nothing about the GPU path has been trusted before it ran there, so it proves itself where it first runs.
// The trainer, check-env and tests/gpu call these same functions, so they cannot drift apart.
//
// Its cost must not grow with the run. The CPU's part (float and float64 replicas, which are slow at large
// hidden sizes) therefore runs on one small slice of the model: kSliceRows rows of at most kSliceSteps
// steps, through every layer and direction, with padded rows among them. That proves the arithmetic: weight
// mapping, gate order, kernels, masking. What the slice cannot show is whether cuDNN takes the run's own
// shapes and computes them alike (a persistent algorithm at a large batch): each of those runs on the GPU
// alone, against its two halves run as batches of their own, which costs a few GPU steps whatever the shape.
// A wrong result there differs by the size of the values; float rounding in another order, by parts per
// million. Beyond it: a cuDNN fault at every batch size of a long sequence length alone (the slice runs at
// most kSliceSteps steps).
//
// Tolerances of the slice come from the float32 CPU replica itself: the GPU's error against the float64
// reference may be at most kErrorFactor times the CPU's own (both round in float; cuDNN sums in another
// order), or a floor for values the CPU happens to hit almost exactly. A wrong weight mapping, gate order
// or kernel gives errors of the size of the values themselves, orders of magnitude above either bound.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/optimizer/optimizer.h"
#include "engine/step_graph.h"
#include "models/replica.h"

namespace ddp::engine {

struct SelfCheckReport {
  bool ok = true;
  // The first check that failed: "<check>: largest error E at <where> (bound B)".
  std::string failure;
  // What passed, for the start log: "replica = CPU on 32x80, 7x80; mapping exact; adam step exact".
  std::vector<std::string> passed;
  double seconds = 0;
  // Every (rows, steps) batch the CPU references ran, float and float64: the check's CPU work.
  std::vector<std::pair<int, int>> reference_batches;

  // "passed in 0.41 s (...)" or "FAILED: <failure>".
  std::string summary() const;
  // This report followed by `next`: what both passed, the first failure, the time of both.
  void add(const SelfCheckReport& next);
};

// Allowed error against the float64 reference, at fp32: kErrorFactor x the float32 CPU replica's, at least
// kRelativeFloor x the reference's size (precision_bounds() for the others).
constexpr double kErrorFactor = 16;
constexpr double kRelativeFloor = 1e-4;
// Never more than this fraction of the reference's size, at any precision: a wrong result (an error the
// size of the values themselves) must fail.
constexpr double kLargestRelativeError = 0.25;

// The slice the CPU references run on: enough rows for padded and unpadded ones, enough steps for the
// recurrence to matter, few enough that the float64 reference of a large model takes well under a second.
constexpr int kSliceRows = 4;
constexpr int kSliceSteps = 24;
// A shape's rows run in the full batch and in its halves, both on the GPU in float32: norm-wise relative
// difference allowed. Another summation order moves a float32 LSTM's outputs and gradients by
// about 1e-6 relative (more over long sequences); a wrong result, by about 1.
constexpr double kConsistencyTolerance = 1e-3;
// A step replayed from a CUDA graph runs the eager step's kernels on the same data: only the embedding
// gradient's atomics (repeated tokens, added in the order the GPU runs them) may move its last bits.
constexpr double kReplayTolerance = 1e-5;

// The tolerances at the GPU's precision (model.precision), derived from its unit roundoff u (precision.h),
// which bounds the relative error of each product's rounded inputs. With s = u / u(fp32), the GPU may err
// against the float64 reference by kErrorFactor x s x the float32 CPU's error (the CPU's error, had it
// rounded at u), at least by relative_floor x the size, at most by kLargestRelativeError x the size; and a
// shape's rows may differ from their halves' by `consistency`. Both floors are kErrorFactor units of u, or
// fp32's constants where those are larger: at fp32 nothing changes (1, 1e-4, 1e-3); at tf32 (u = 2^-11)
// s = 8192 and both floors are 7.8e-3; at bf16 (u = 2^-8) s = 65536 and both floors are 6.25e-2.
struct PrecisionBounds {
  double error_scale = 1;
  double relative_floor = kRelativeFloor;
  double consistency = kConsistencyTolerance;
};
PrecisionBounds precision_bounds(models::Precision precision);
// The norm-wise error allowed for a quantity whose float64 reference has norm `reference_size`, where the
// float32 CPU replica erred by `cpu_error`.
double reference_bound(const PrecisionBounds& bounds, double cpu_error, double reference_size);

// `replica` runs on GPU `device` (or on the CPU: how the check itself is tested); its parameters and
// running stats are overwritten (load the real ones afterwards). On parameters drawn from `seed`:
// - the slice (kSliceRows x min(kSliceSteps, longest seq of `shapes`)): one train_step and predict on
//   generated data against the CPU replicas (float and double), comparing the loss, every parameter
//   tensor's gradient and the probabilities;
// - each (batch, seq) of `shapes`, the shapes the run will meet, the first the training batch's (trained
//   and evaluated) and the others evaluated only: the replica's outputs of every row, and for the first its
//   loss and gradients, against its two halves run as batches of their own, within kConsistencyTolerance;
// - check_parameter_mapping(), and one step of the optimizer `settings` names on the GPU against the host
//   optimizer, on the same gradients: bit for bit.
// `progress` is called after each of these (start-up work that proceeds is no hang: trainer.cpp's
// watchdog). CUDA failures on the way are reported as the check's failure (a check-env on a broken node
// must say so); call it only where no other rank waits for this one in a collective meanwhile, or agree on
// the result. `options` are the replica's (masking; the CPU replicas run them without dropout, which the
// GPU replica does not run).
// With `make_recorder` (train.cuda_graph = auto: make_cuda_graph_recorder) and a replica whose steps can be
// replayed (Replica::step_graph_refusal), also the training shape's step captured into a graph and replayed
// on two batches against the eager step on each (kReplayTolerance; a failure names train.cuda_graph = off).
using GraphRecorderFactory = std::function<std::unique_ptr<GraphRecorder>(void* stream)>;
SelfCheckReport check_gpu_replica(models::Replica& replica, int device,
                                  std::span<const std::pair<int, int>> shapes,
                                  optim::OptimizerSettings settings, uint64_t seed,
                                  const models::ModelOptions& options = {},
                                  const std::function<void()>& progress = {},
                                  const GraphRecorderFactory& make_recorder = {});

// Collective over `group`, whose gradients `reducer` averages in the memory of GPU `device` (NCCL):
// comm::check_average over
// a buffer on that GPU, in the run's segments (`segment_sizes`, as the replica hands them to
// start_average), within comm::average_tolerance(compression, ranks). Every rank gets the same verdict; the
// failure names the rank and element with the largest error. CUDA failures on the way are reported as the
// check's failure on this rank and agreed on, so no rank is left waiting in a collective.
SelfCheckReport check_gpu_communicator(comm::HostGroup& group, comm::GradientReducer& reducer, int device,
                                       std::span<const std::size_t> segment_sizes,
                                       const std::string& compression);

}  // namespace ddp::engine

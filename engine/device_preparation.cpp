#include "engine/device_preparation.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>

#include "engine/base/errors.h"
#include "engine/self_check.h"
#include "engine/updater.h"
#include "models/cuda_replica.h"

namespace ddp::engine {
namespace {

// The sizes of the segments a step hands to the reducer, in the order it starts them.
std::vector<std::size_t> segment_sizes(const models::Replica& replica) {
  std::vector<std::size_t> sizes;
  for (const std::size_t index : replica.layout().reduction_order(/*embedding_early=*/true))
    sizes.push_back(replica.layout().segments()[index].size);
  return sizes;
}

std::string self_check_failure(const SelfCheckReport& report, const Topology& topology, int rank) {
  return "self-check failed on rank " + std::to_string(rank) + " (host " + topology.host + ", GPU " +
         std::to_string(topology.gpu) + " " + topology.gpu_name + "): " + report.failure +
         "; training there would give wrong results (comm.selfcheck = off skips the check)";
}

// The self-check of a GPU rank's replica. It compares a training step with the CPU's, whose dropout masks
// between layers the GPU's are not: a model with dropout is checked on a twin without it (same shape, masking
// and algorithm).
SelfCheckReport check_gpu_replica_of(models::Replica& replica, const Config& config, const Topology& topology,
                                     const std::vector<std::pair<int, int>>& shapes, bool steps_from_graphs,
                                     const std::function<void()>& progress) {
  const models::ModelOptions options = model_options(config);
  std::unique_ptr<models::Replica> twin;
  if (options.dropout > 0 || options.embedding_dropout > 0) {
    models::ModelOptions without_dropout = options;
    without_dropout.dropout = 0;
    without_dropout.embedding_dropout = 0;
    twin =
        models::make_cuda_replica(replica.layout().shape(), topology.gpu,
                                  models::parse_rnn_algorithm(config.model.cudnn_rnn_algo), without_dropout);
  }
  // train.cuda_graph: where the run's steps will be replayed, a replayed step is checked too.
  const GraphRecorderFactory make_recorder =
      steps_from_graphs ? GraphRecorderFactory(make_cuda_graph_recorder) : GraphRecorderFactory();
  return check_gpu_replica(twin ? *twin : replica, topology.gpu, shapes, optimizer_settings(config),
                           config.train.seed, options, progress, make_recorder);
}

}  // namespace

std::vector<std::pair<int, int>> batch_shapes(int batch_size, int seq, int64_t validation_rows,
                                              int64_t test_rows) {
  std::vector<std::pair<int, int>> shapes{{batch_size, seq}};
  for (const int64_t rows : {validation_rows, test_rows}) {
    const auto last = rows < 0 ? 0 : static_cast<int>(rows % batch_size);
    if (last > 0 && std::find(shapes.begin(), shapes.end(), std::pair{last, seq}) == shapes.end())
      shapes.emplace_back(last, seq);
  }
  return shapes;
}

std::vector<std::pair<int, int>> every_ranks_batch_shapes(comm::HostGroup& trainers, int batch_size, int seq,
                                                          int64_t validation_rows, int64_t test_rows) {
  // present[b] counts the ranks with a short batch of b rows.
  std::vector<double> present(static_cast<std::size_t>(std::max(batch_size, 1)), 0.0);
  for (const auto& [rows, _] : batch_shapes(batch_size, seq, validation_rows, test_rows)) {
    if (rows < batch_size) present[static_cast<std::size_t>(rows)] = 1;
  }
  trainers.sum(present);
  std::vector<std::pair<int, int>> shapes{{batch_size, seq}};
  for (int rows = 1; rows < batch_size; ++rows) {
    if (present[static_cast<std::size_t>(rows)] > 0) shapes.emplace_back(rows, seq);
  }
  return shapes;
}

std::string prepare_device(models::Replica& replica, const std::vector<std::pair<int, int>>& shapes,
                           const Config& config, const Topology& topology, comm::HostGroup& trainers,
                           comm::GradientReducer* reducer, bool steps_from_graphs,
                           const std::function<void()>& progress) {
  std::string summary;
  const auto proceed = [&] {
    if (progress) progress();
  };
  const auto on_this_rank = [&](const UserError& e) {
    return "rank " + std::to_string(trainers.rank()) + " (" + topology.host + ", " + topology.device +
           "): " + e.what();
  };
  comm::agree_on_errors(trainers, [&] {
    std::vector<double> refused(shapes.size(), 0.0);
    std::optional<std::string> error;  // kept until every training rank has tried: the sum below pairs up
    try {
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        if (!replica.try_shape(shapes[i].first, shapes[i].second)) refused[i] = 1;
        proceed();
      }
    } catch (const UserError& e) {
      error = on_this_rank(e);
    }
    if (auto first = trainers.first_error(error)) throw UserError(*first);
    trainers.sum(refused);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      replica.settle_shape(shapes[i].first, shapes[i].second, refused[i] == 0);
      proceed();
    }
    // Only GPU ranks check themselves, but every training rank takes part in the verdict (a CPU rank of a
    // mixed job that skipped this collective would leave the GPU ranks waiting in it), and an error on one
    // rank is handed to the verdict rather than thrown past it, for the same reason.
    std::optional<SelfCheckReport> report;
    if (replica.device() == models::DeviceKind::kCuda && config.comm.selfcheck) {
      try {
        report = check_gpu_replica_of(replica, config, topology, shapes, steps_from_graphs, progress);
        if (!report->ok) error = self_check_failure(*report, topology, trainers.rank());
      } catch (const UserError& e) {
        error = on_this_rank(e);
      }
    }
    if (auto first = trainers.first_error(error)) throw UserError(*first);
    if (!report) return;
    // Every rank of an NCCL job is a GPU rank, so all of them are here; the verdict is the same on each.
    if (reducer != nullptr && reducer->backend() == "nccl" && trainers.size() > 1) {
      report->add(check_gpu_communicator(trainers, *reducer, topology.gpu, segment_sizes(replica),
                                         config.comm.compression));
      if (!report->ok) throw UserError(self_check_failure(*report, topology, trainers.rank()));
    }
    summary = "self-check " + report->summary();
  });
  return summary;
}

}  // namespace ddp::engine

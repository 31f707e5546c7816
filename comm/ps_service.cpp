#include "comm/ps_service.h"

#include <fmt/format.h>

namespace ddp::comm {

std::string describe_mode(const PsOptions& o, const std::string& trainer) {
  const std::string mode =
      o.async ? fmt::format("async, a {} at most {} steps ahead of the slowest", trainer, o.max_staleness)
              : "sync";
  return fmt::format("{}, timeout {} s", mode, o.timeout_s);
}

ParameterServerRank join_parameter_server(const HostGroup& group, const PsOptions& options, std::size_t total,
                                          const ShardOptimizerFactory& make_optimizer,
                                          const std::string& server_line) {
  const MPI_Comm world = group.mpi_comm();
  if (options.servers == 0) return {make_colocated_service(world, options, total, make_optimizer), nullptr};
  if (options.clip_norm > 0 && options.async) {
    throw UserError(
        "train.clip_norm with comm.ps_mode = async: an async server applies each worker's "
        "gradient as it comes, there is no averaged gradient to clip (use sync or all-reduce)");
  }
  return join_dedicated_layout(world, options, total, make_optimizer, server_line);
}

}  // namespace ddp::comm

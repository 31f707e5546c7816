#include "comm/parameter_service.h"

namespace ddp::comm {

ParameterServerRank join_parameter_server(MPI_Comm world, const PsOptions& options, std::size_t total,
                                          const ShardOptimizerFactory& make_optimizer,
                                          const std::string& server_line) {
  if (options.servers == 0) return {make_colocated_service(world, options, total, make_optimizer), nullptr};
  return join_dedicated_layout(world, options, total, make_optimizer, server_line);
}

}  // namespace ddp::comm

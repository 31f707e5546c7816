#include "comm/node_layout.h"

#include "comm/mpi_check.h"

namespace ddp::comm {

NodeLayout find_nodes(MPI_Comm comm, int test_node) {
  int rank = 0;
  DDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  int node = test_node;
  if (node < 0) {  // the node's lowest rank names it
    MPI_Comm shared = MPI_COMM_NULL;
    DDP_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &shared));
    DDP_CHECK_MPI(MPI_Allreduce(&rank, &node, 1, MPI_INT, MPI_MIN, shared));
    DDP_CHECK_MPI(MPI_Comm_free(&shared));
  }
  NodeLayout layout;
  DDP_CHECK_MPI(MPI_Comm_split(comm, node, rank, &layout.node));
  DDP_CHECK_MPI(MPI_Comm_set_errhandler(layout.node, MPI_ERRORS_RETURN));
  DDP_CHECK_MPI(MPI_Comm_rank(layout.node, &layout.node_rank));
  DDP_CHECK_MPI(MPI_Comm_size(layout.node, &layout.node_size));
  const int leader = layout.node_rank == 0 ? 1 : 0;
  DDP_CHECK_MPI(MPI_Allreduce(&leader, &layout.nodes, 1, MPI_INT, MPI_SUM, comm));
  DDP_CHECK_MPI(MPI_Allreduce(&layout.node_size, &layout.largest_node, 1, MPI_INT, MPI_MAX, comm));
  DDP_CHECK_MPI(MPI_Allreduce(&layout.node_size, &layout.smallest_node, 1, MPI_INT, MPI_MIN, comm));
  return layout;
}

}  // namespace ddp::comm

// The ranks of a job grouped by the node (the memory) they share: what the hierarchical exchanges of the MPI
// all-reduce (mpi_reducer.cpp) and of the colocated parameter server (sharded_exchange.h) are built on.
#pragma once

#include <mpi.h>

namespace ddp::comm {

struct NodeLayout {
  MPI_Comm node = MPI_COMM_NULL;  // this rank's node, in rank order, returning errors: the caller frees it
  int node_rank = 0;
  int node_size = 1;
  int nodes = 1;
  int largest_node = 1;   // ranks on the fullest node
  int smallest_node = 1;  // ranks on the emptiest
};

// Collective over `comm`. `test_node` >= 0: the ranks that pass the same number count as one node (tests
// make pseudo-nodes of one machine so); -1: the ranks that share memory (MPI_COMM_TYPE_SHARED) do.
NodeLayout find_nodes(MPI_Comm comm, int test_node);

}  // namespace ddp::comm

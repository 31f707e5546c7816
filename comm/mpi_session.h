// MPI's start and end for the process, and what the MPI library says of itself: the only MPI calls the
// engine makes besides its collectives (host_group.h) and the fatal path's MPI_Abort
// (engine/base/errors.cpp).
#pragma once

#include <string>

namespace ddp::comm {

// Call before start_mpi: Open MPI defaults for gradient exchange across nodes (benchmarks/RESULTS.md,
// "Across nodes"). Sets only parameters the user has not set; other MPIs ignore them.
// - Its TCP transport sends a message above 64 KiB by rendezvous: a first fragment, then a wait for the
//   receiver's answer before the rest. Across a link whose queue holds milliseconds of data that answer
//   waits behind the gradients going the other way, which cut the throughput of an all-reduce across a slow
//   link by half. Gradient buckets are sent eagerly up to 4 MiB instead.
// - Its non-blocking all-reduce (libnbc) takes a binomial tree below 4 ranks: a reduce to one rank, then a
//   broadcast back, so each direction of a link idles half the time. Rabenseifner's reduce-scatter and
//   all-gather keep both directions busy (the step across two nodes: benchmarks/RESULTS.md).
void set_mpi_transport_defaults();

// MPI_Init_thread asking for MPI_THREAD_MULTIPLE, which lets the MPI backend's progress thread move gradient
// reductions during backward; an MPI that offers less is used as it is (the backend then makes progress only
// in its own calls). Once per process.
void start_mpi(int& argc, char**& argv);
// MPI_Finalize: waits for every rank, with no deadline of its own.
void finalize_mpi();

// The MPI library's own first line of MPI_Get_library_version ("Open MPI v4.1.2, ...").
std::string mpi_library_version();

}  // namespace ddp::comm

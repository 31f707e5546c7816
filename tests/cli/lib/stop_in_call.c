// Preloaded into the ranks of a CLI test (LD_PRELOAD): the rank that DDPTRAIN_TEST_STOP_RANK names stops
// itself (SIGSTOP) on entering the call that DDPTRAIN_TEST_STOP_IN names (an MPI call, or H5Fopen), so the
// test can hang a rank at an exact point, as a rank stuck in a driver or on a frozen file system looks to the
// others: alive, silent. It wraps the MPI calls through MPI's profiling interface (PMPI_*) and HDF5's open
// through the next definition (dlsym), so the rank goes on normally if it is ever continued.
#define _GNU_SOURCE
#include <mpi.h>

#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int stops_here(const char* call) {
  const char* at = getenv("DDPTRAIN_TEST_STOP_IN");
  const char* rank = getenv("DDPTRAIN_TEST_STOP_RANK");
  const char* mine = getenv("OMPI_COMM_WORLD_RANK");
  return at != NULL && rank != NULL && mine != NULL && strcmp(at, call) == 0 && strcmp(rank, mine) == 0;
}

static void stop_if_chosen(const char* call) {
  if (stops_here(call)) raise(SIGSTOP);
}

int MPI_Finalize(void) {
  stop_if_chosen("MPI_Finalize");
  return PMPI_Finalize();
}

// MPI_Isend stops only on a send to DDPTRAIN_TEST_STOP_DEST (a rank), after DDPTRAIN_TEST_STOP_AFTER such
// sends went out: a server that answers some workers of a step and stops before the next.
int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request* request) {
  static long sends_to_dest = 0;
  const char* chosen_dest = getenv("DDPTRAIN_TEST_STOP_DEST");
  const char* after = getenv("DDPTRAIN_TEST_STOP_AFTER");
  if (chosen_dest != NULL && dest == atoi(chosen_dest) && stops_here("MPI_Isend") &&
      sends_to_dest++ == (after != NULL ? atol(after) : 0)) {
    raise(SIGSTOP);
  }
  return PMPI_Isend(buffer, count, type, dest, tag, comm, request);
}

int MPI_Gather(const void* send, int send_count, MPI_Datatype send_type, void* receive, int receive_count,
               MPI_Datatype receive_type, int root, MPI_Comm comm) {
  stop_if_chosen("MPI_Gather");
  return PMPI_Gather(send, send_count, send_type, receive, receive_count, receive_type, root, comm);
}

// HDF5's (1.10 and later: hid_t is 64 bits), declared here so that the module needs no HDF5 headers. A
// file system that stops answering holds a rank in the open of data.path; every rank opens it.
typedef int64_t hid_t;
typedef hid_t (*H5FopenFunction)(const char*, unsigned, hid_t);

hid_t H5Fopen(const char* name, unsigned flags, hid_t access) {
  stop_if_chosen("H5Fopen");
  const H5FopenFunction next = (H5FopenFunction)dlsym(RTLD_NEXT, "H5Fopen");
  return next(name, flags, access);
}

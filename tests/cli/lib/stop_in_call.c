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
#include <unistd.h>

static int stops_here(const char* call) {
  const char* at = getenv("DDPTRAIN_TEST_STOP_IN");
  const char* rank = getenv("DDPTRAIN_TEST_STOP_RANK");
  const char* mine = getenv("OMPI_COMM_WORLD_RANK");
  return at != NULL && rank != NULL && mine != NULL && strcmp(at, call) == 0 && strcmp(rank, mine) == 0;
}

// DDPTRAIN_TEST_STOP_HOW=wait: the thread waits forever instead, the rest of the process running on (a read
// that never returns, as on a frozen file system; the rank's own watchdog sees it).
static void stop(void) {
  const char* how = getenv("DDPTRAIN_TEST_STOP_HOW");
  if (how != NULL && strcmp(how, "wait") == 0) {
    for (;;) pause();
  }
  raise(SIGSTOP);
}

// The chosen call stops on its (DDPTRAIN_TEST_STOP_AFTER + 1)th entry (the first where that is unset).
static void stop_if_chosen(const char* call, long* entries) {
  const char* after = getenv("DDPTRAIN_TEST_STOP_AFTER");
  if (stops_here(call) && (*entries)++ == (after != NULL ? atol(after) : 0)) stop();
}

int MPI_Finalize(void) {
  static long entries = 0;
  stop_if_chosen("MPI_Finalize", &entries);
  return PMPI_Finalize();
}

// MPI_Isend counts only the sends to DDPTRAIN_TEST_STOP_DEST (a rank): a server that answers some workers
// of a step and stops before the next.
int MPI_Isend(const void* buffer, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request* request) {
  static long entries = 0;
  const char* chosen_dest = getenv("DDPTRAIN_TEST_STOP_DEST");
  if (chosen_dest != NULL && dest == atoi(chosen_dest)) stop_if_chosen("MPI_Isend", &entries);
  return PMPI_Isend(buffer, count, type, dest, tag, comm, request);
}

// The parameter server's exchange is set up (a collective) at the start of every run of steps.
int MPI_Comm_idup(MPI_Comm comm, MPI_Comm* copy, MPI_Request* request) {
  static long entries = 0;
  stop_if_chosen("MPI_Comm_idup", &entries);
  return PMPI_Comm_idup(comm, copy, request);
}

int MPI_Gather(const void* send, int send_count, MPI_Datatype send_type, void* receive, int receive_count,
               MPI_Datatype receive_type, int root, MPI_Comm comm) {
  static long entries = 0;
  stop_if_chosen("MPI_Gather", &entries);
  return PMPI_Gather(send, send_count, send_type, receive, receive_count, receive_type, root, comm);
}

// HDF5's (1.10 and later: hid_t is 64 bits), declared here so that the module needs no HDF5 headers. A
// file system that stops answering holds a rank in the open of data.path; every rank opens it.
typedef int64_t hid_t;
typedef hid_t (*H5FopenFunction)(const char*, unsigned, hid_t);

hid_t H5Fopen(const char* name, unsigned flags, hid_t access) {
  static long entries = 0;
  stop_if_chosen("H5Fopen", &entries);
  const H5FopenFunction next = (H5FopenFunction)dlsym(RTLD_NEXT, "H5Fopen");
  return next(name, flags, access);
}

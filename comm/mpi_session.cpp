#include "comm/mpi_session.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "comm/mpi_check.h"

namespace ddp::comm {

void set_mpi_transport_defaults() {
  constexpr const char* kEagerBytes = "4194304";
  for (const char* name : {"OMPI_MCA_btl_tcp_eager_limit", "OMPI_MCA_btl_tcp_rndv_eager_limit",
                           "OMPI_MCA_btl_tcp_max_send_size"}) {
    setenv(name, kEagerBytes, /*overwrite=*/0);
  }
  constexpr const char* kRabenseifner = "3";
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", kRabenseifner, /*overwrite=*/0);
}

void start_mpi(int& argc, char**& argv) {
  int threading = MPI_THREAD_SINGLE;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &threading);
}

void finalize_mpi() {
  MPI_Finalize();
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  DDP_CHECK_MPI(MPI_Get_library_version(text, &length));
  const std::string all(text, static_cast<std::size_t>(std::max(0, length)));
  return all.substr(0, all.find('\n'));
}

}  // namespace ddp::comm

// Checks an MPI return code; a failure ends the job through ddp::fatal (MPI_Abort), never a hang. And what
// this MPI offers.
#pragma once

#include <mpi.h>

#include <string>

#include "engine/base/errors.h"

namespace ddp::comm {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

// Whether this rank's MPI lets several threads call it at once (main() asks for MPI_THREAD_MULTIPLE).
inline bool mpi_thread_multiple() {
  int provided = MPI_THREAD_SINGLE;
  return MPI_Query_thread(&provided) == MPI_SUCCESS && provided >= MPI_THREAD_MULTIPLE;
}

}  // namespace ddp::comm

#define DDP_CHECK_MPI(call)                                                                         \
  do {                                                                                              \
    const int ddp_mpi_status_ = (call);                                                             \
    if (ddp_mpi_status_ != MPI_SUCCESS)                                                             \
      DDP_FATAL(std::string(#call) + " failed: " + ::ddp::comm::mpi_error_string(ddp_mpi_status_)); \
  } while (0)

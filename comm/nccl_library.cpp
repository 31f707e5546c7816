#include "comm/nccl_library.h"

#include <nccl.h>

namespace ddp::comm {

const base::RuntimeLibrary& nccl_library() {
  static const base::RuntimeLibrary library(nccl_library_names());
  return library;
}

std::vector<std::string> nccl_library_names() {
  // The build's path serves a toolkit installed outside the loader's search (ld.so.conf).
  return {DDPTRAIN_NCCL_SONAME, DDPTRAIN_NCCL_BUILD_PATH};
}

namespace {

// What a stand-in returns when NCCL is not there: an error a result check reports.
struct NcclMissing {
  operator ncclResult_t() const { return ncclSystemError; }
  operator const char*() const { return "NCCL is not loaded (see check-env)"; }
};

}  // namespace

}  // namespace ddp::comm

#define DDP_NCCL_FORWARD(function, ...)     \
  return ddp::base::call_loaded<&function>( \
      ddp::comm::nccl_library(), #function, ddp::comm::NcclMissing {} __VA_OPT__(, ) __VA_ARGS__)

extern "C" {

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  DDP_NCCL_FORWARD(ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  DDP_NCCL_FORWARD(ncclCommAbort, comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  DDP_NCCL_FORWARD(ncclCommDestroy, comm);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  DDP_NCCL_FORWARD(ncclCommFinalize, comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  DDP_NCCL_FORWARD(ncclCommGetAsyncError, comm, asyncError);
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  DDP_NCCL_FORWARD(ncclCommInitRank, comm, nranks, commId, rank);
}

const char* ncclGetErrorString(ncclResult_t result) {
  DDP_NCCL_FORWARD(ncclGetErrorString, result);
}

const char* ncclGetLastError(ncclComm_t comm) {
  DDP_NCCL_FORWARD(ncclGetLastError, comm);
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  DDP_NCCL_FORWARD(ncclGetUniqueId, uniqueId);
}

ncclResult_t ncclGetVersion(int* version) {
  DDP_NCCL_FORWARD(ncclGetVersion, version);
}

}  // extern "C"

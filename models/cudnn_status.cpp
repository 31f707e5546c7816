#include "models/cudnn_status.h"

namespace ddp::models {

CudnnFailure classify_cudnn_failure(cudnnStatus_t status, bool persistent_algorithm) {
  if (!persistent_algorithm) return CudnnFailure::kFatal;
  switch (status) {
    case CUDNN_STATUS_BAD_PARAM:
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND:
    case CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT:
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED:
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
    case CUDNN_STATUS_NOT_SUPPORTED_SHAPE:
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
    case CUDNN_STATUS_NOT_SUPPORTED_LAYOUT:
    case CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH:
    case CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT:
    case CUDNN_STATUS_NOT_SUPPORTED_PADDING:
    case CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM:
    case CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE:
      return CudnnFailure::kRefused;
    case CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM:
      return CudnnFailure::kRefusedIfDeviceHealthy;
    default:
      break;
  }
  // Execution failures of every kind (the CUDA driver's, cuBLAS's, ...): the device decides.
  if (CUDNN_STATUS_CATEGORY(static_cast<int>(status)) == CUDNN_STATUS_EXECUTION_FAILED) {
    return CudnnFailure::kRefusedIfDeviceHealthy;
  }
  return CudnnFailure::kFatal;
}

}  // namespace ddp::models

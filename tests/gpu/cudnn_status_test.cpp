// How a failed cuDNN call is read (models/cudnn_status.h): a pure function, so it runs without a GPU.
#include "models/cudnn_status.h"

#include <gtest/gtest.h>

namespace ddp::models {
namespace {

TEST(CudnnFailures, UnderTheStandardAlgorithmEveryFailureIsFatal) {
  for (const cudnnStatus_t status :
       {CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
        CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, CUDNN_STATUS_EXECUTION_FAILED}) {
    EXPECT_EQ(classify_cudnn_failure(status, /*persistent_algorithm=*/false), CudnnFailure::kFatal)
        << cudnnGetErrorString(status);
  }
}

TEST(CudnnFailures, APersistentAlgorithmMayTurnDownAShapeOrThisGpu) {
  for (const cudnnStatus_t status :
       {CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, CUDNN_STATUS_NOT_SUPPORTED,
        CUDNN_STATUS_NOT_SUPPORTED_SHAPE, CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH,
        CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT, CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM}) {
    EXPECT_EQ(classify_cudnn_failure(status, true), CudnnFailure::kRefused) << cudnnGetErrorString(status);
  }
  // Found only when a kernel launches or runs: a refusal if the device is still healthy.
  for (const cudnnStatus_t status :
       {CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM, CUDNN_STATUS_EXECUTION_FAILED,
        CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER}) {
    EXPECT_EQ(classify_cudnn_failure(status, true), CudnnFailure::kRefusedIfDeviceHealthy)
        << cudnnGetErrorString(status);
  }
}

TEST(CudnnFailures, OurMistakesAndABrokenEnvironmentAreFatalUnderEveryAlgorithm) {
  for (const cudnnStatus_t status :
       {CUDNN_STATUS_BAD_PARAM_NULL_POINTER, CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
        CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH,
        CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER, CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART,
        CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE, CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH,
        CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_INTERNAL_ERROR,
        CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED,
        CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED}) {
    EXPECT_EQ(classify_cudnn_failure(status, true), CudnnFailure::kFatal) << cudnnGetErrorString(status);
  }
}

}  // namespace
}  // namespace ddp::models

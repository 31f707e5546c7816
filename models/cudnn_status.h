// What a failed cuDNN call means for the cuDNN replica, decided in one place (and tested on the host): a
// persistent RNN algorithm may turn down a shape or this GPU's share of SMs, and then the replica falls back
// to the standard algorithm or reports it; every other failure ends the job. CUDA builds only.
#pragma once

#include <cudnn.h>

namespace ddp::models {

enum class CudnnFailure {
  kRefused,                 // the algorithm cannot serve this shape or this GPU
  kRefusedIfDeviceHealthy,  // a kernel that could not launch or run: a refusal if no sticky CUDA error
                            // follows
  kFatal,                   // a bug, a broken environment or a failing device: the job ends
};

// `status` is not CUDNN_STATUS_SUCCESS. Under the standard algorithm nothing is a refusal. Under a persistent
// one:
//   refused   bad parameters and unsupported cases that depend on the algorithm (generic, shape, out of
//             bound, layout, data type, padding, architecture, shared memory, launch parameters)
//   if healthy a persistent kernel's launch parameters that cuDNN found bad only when launching (internal
//             error BAD_LAUNCH_PARAM), and execution failures (too few SMs on a MIG slice or an MPS share)
//   fatal     our own mistakes (null or misaligned pointers, unfinalized or mistyped descriptors, stream or
//             graph mismatches), an environment no algorithm can run in (driver, runtime, missing
//             sublibrary, version mismatch, license), and every other internal error (allocation failures
//             included: the standard algorithm would not get that memory either)
CudnnFailure classify_cudnn_failure(cudnnStatus_t status, bool persistent_algorithm);

}  // namespace ddp::models

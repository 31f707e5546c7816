#include "models/cpu_threads.h"

#include "engine/base/parallel_loops.h"
#include "models/blas_threads.h"
#include "models/onednn_lstm.h"

namespace ddp::models {

CpuThreadPlan plan_cpu_threads(int threads, CpuKernels kernels) {
  CpuThreadPlan plan;
  plan.threads = threads;
  if (kernels != CpuKernels::kBuiltin) {
    plan.blas_told = set_blas_threads(1);
    set_onednn_threads(threads);
    set_loop_threads(threads);
    plan.pool =
        kernels == CpuKernels::kOnednn
            ? "OpenMP's, for oneDNN's recurrent layers and the optimizer's loops (the BLAS on 1 thread)"
            : "OpenMP's, for the recurrent layers (each thread its rows of the batch, their products on 1 "
              "thread) and the optimizer's loops";
  } else {
    plan.blas_told = set_blas_threads(threads);
    set_onednn_threads(1);
    set_loop_threads(1);
    plan.pool = "the BLAS's, " + blas_description();
  }
  return plan;
}

}  // namespace ddp::models

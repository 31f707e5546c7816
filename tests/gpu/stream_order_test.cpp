// The gradient reducers order themselves after the replica's compute stream, not after the host: a rank's
// gradient is produced on another stream, behind a delay, and the compute stream only waits for it on the
// device. A reducer that read the gradient without waiting on the compute stream would average what the
// buffer held before (zeros), and the delayed write would then leave each rank its own gradient instead.
// Needs 2 or more ranks (on one, an average is the identity whatever the order): the GPU acceptance check
// runs it under `mpirun -np 2` (benchmarks/gpu_checks.sh); under CTest's single process it skips, saying so.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "tests/gpu/gpu_test_util.h"

namespace ddp {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Holds up the stream it is enqueued on, as a slow kernel would, without a kernel of its own.
void CUDART_CB hold_the_stream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
}

// Exactly representable in fp16 and bf16, times any rank count up to 8 and averaged.
float base_value(std::size_t i) {
  return 1.0f + 0.25f * static_cast<float>(i % 7);
}

class StreamOrder : public ::testing::TestWithParam<std::string> {};

TEST_P(StreamOrder, TheAverageWaitsForAGradientProducedBehindADelay) {
  DDP_REQUIRE_GPU();
  testing_gpu::ensure_mpi();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size < 2)
    GTEST_SKIP() << "needs 2 or more ranks (mpirun -np 2): on one rank an average is the identity, whatever "
                    "the order";
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  int gpus = 0;
  ASSERT_CUDA(cudaGetDeviceCount(&gpus));
  const std::string kind = GetParam();
  const bool nccl = kind.rfind("nccl", 0) == 0;
  // NCCL takes one GPU per rank; the staged communicator shares one. Every rank skips alike.
  if (nccl && gpus < size)
    GTEST_SKIP() << kind << " needs a GPU per rank: " << gpus << " for " << size << " ranks";
  ASSERT_CUDA(cudaSetDevice(local_rank % gpus));

  cudaStream_t compute = nullptr, producer = nullptr;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  const std::size_t n = std::size_t{1} << 20;
  float* gradient = nullptr;
  float* host = nullptr;
  ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&gradient), n * sizeof(float)));
  ASSERT_CUDA(cudaMemset(gradient, 0, n * sizeof(float)));
  ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&host), n * sizeof(float), cudaHostAllocDefault));
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(rank + 1) * base_value(i);

  comm::HostGroup world(MPI_COMM_WORLD);
  std::unique_ptr<comm::GradientReducer> reducer;
  if (nccl) {
    const std::string compression = kind == "nccl" ? "none" : kind.substr(5);
    reducer = comm::make_nccl_reducer(world, compute, compression);
  } else {
    reducer = comm::make_staged_mpi_reducer(world, compute);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank's reducer is ready: the delay below is all that orders the data

  // The gradient arrives behind the delay on the producer stream; the compute stream waits for it on the
  // device only, and the host goes straight on to the average.
  ASSERT_CUDA(cudaLaunchHostFunc(producer, hold_the_stream, nullptr));
  ASSERT_CUDA(cudaMemcpyAsync(gradient, host, n * sizeof(float), cudaMemcpyHostToDevice, producer));
  cudaEvent_t produced = nullptr;
  ASSERT_CUDA(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming));
  ASSERT_CUDA(cudaEventRecord(produced, producer));
  ASSERT_CUDA(cudaStreamWaitEvent(compute, produced, 0));
  reducer->start_average({gradient, n});
  reducer->finish_average();

  std::vector<float> averaged(n);
  ASSERT_CUDA(cudaMemcpyAsync(averaged.data(), gradient, n * sizeof(float), cudaMemcpyDeviceToHost, compute));
  ASSERT_CUDA(cudaStreamSynchronize(compute));
  const float ranks_mean = static_cast<float>(size + 1) / 2.0f;  // the mean of 1..size
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (averaged[i] != base_value(i) * ranks_mean) {
      if (wrong++ < 3)
        ADD_FAILURE() << "element " << i << ": " << averaged[i] << ", expected "
                      << base_value(i) * ranks_mean;
    }
  }
  EXPECT_EQ(wrong, 0u) << "of " << n << " elements";

  reducer.reset();
  cudaEventDestroy(produced);
  cudaFreeHost(host);
  cudaFree(gradient);
  cudaStreamDestroy(producer);
  cudaStreamDestroy(compute);
}

INSTANTIATE_TEST_SUITE_P(Reducers, StreamOrder,
                         ::testing::Values("nccl", "nccl_fp16", "nccl_bf16", "staged_mpi"),
                         [](const ::testing::TestParamInfo<std::string>& param) { return param.param; });

}  // namespace
}  // namespace ddp

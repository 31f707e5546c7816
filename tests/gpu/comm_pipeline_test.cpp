// The GPU communication and input pipeline: the NCCL and staged-MPI communicators on one rank, and the
// device batch source against the host one. The first tests check user errors and run anywhere; the rest
// skip where no GPU is visible.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "engine/base/errors.h"
#include "io/batch_source.h"
#include "io/synthetic.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing_gpu::ensure_mpi;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device memory, a pinned host mirror and a non-blocking stream standing in for a replica's.
class GpuFixture : public ::testing::Test {
 public:
  void SetUp() override {
    DDP_REQUIRE_GPU();
    ASSERT_CUDA(cudaSetDevice(0));
    ASSERT_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (void* p : device_) cudaFree(p);
    for (void* p : pinned_) cudaFreeHost(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  template <typename T>
  T* device_array(std::size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    device_.push_back(p);
    return static_cast<T*>(p);
  }
  template <typename T>
  T* pinned_array(std::size_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaHostAlloc(&p, n * sizeof(T), cudaHostAllocDefault), cudaSuccess);
    pinned_.push_back(p);
    return static_cast<T*>(p);
  }
  // Writes `values` to `device` on the stream (asynchronously: the communicators must order after it).
  void upload(const std::vector<float>& values, float* device) {
    float* staging = pinned_array<float>(values.size());
    std::copy(values.begin(), values.end(), staging);
    EXPECT_EQ(
        cudaMemcpyAsync(device, staging, values.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
        cudaSuccess);
  }
  // Reads `device` after everything enqueued on the stream so far.
  std::vector<float> download(const float* device, std::size_t n) {
    float* staging = pinned_array<float>(n);
    EXPECT_EQ(cudaMemcpyAsync(staging, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return std::vector<float>(staging, staging + n);
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> device_;
  std::vector<void*> pinned_;
};

std::vector<float> ramp(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * (std::sin(0.37f * static_cast<float>(i)) + 1.5f);
  return v;
}

// One rank averages to itself: several segments pending at once, the embedding through start_average_rows.
void expect_one_rank_average_is_identity(comm::GradientReducer& comm, GpuFixture& gpu, float* a, float* b,
                                         float* matrix) {
  const std::vector<float> va = ramp(1000, 0.01f);
  const std::vector<float> vb = ramp(3, 7.0f);
  const std::vector<float> vm = ramp(64 * 8, -2.0f);
  for (int step = 0; step < 2; ++step) {  // the second step reuses what the first one allocated
    gpu.upload(va, a);
    gpu.upload(vb, b);
    gpu.upload(vm, matrix);
    comm.start_average({a, va.size()});
    comm.start_average({b, vb.size()});
    const std::vector<int32_t> touched = {1, 5};
    EXPECT_TRUE(comm.start_average_rows({matrix, vm.size()}, 8, touched).empty());  // dense on a GPU
    comm.finish_average();
    EXPECT_EQ(gpu.download(a, va.size()), va);
    EXPECT_EQ(gpu.download(b, vb.size()), vb);
    EXPECT_EQ(gpu.download(matrix, vm.size()), vm);
  }
}

TEST(NcclCommunicatorTest, UnknownCompressionIsAUserError) {
  try {
    comm::HostGroup alone = comm::HostGroup::alone();
    comm::make_nccl_reducer(alone, nullptr, "fp8");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.compression = fp8"), std::string::npos) << e.what();
  }
}

TEST(DeviceBatchSourceTest, MissingDeviceIsAUserError) {
  io::BatchReaderOptions options;
  options.path = "never-opened.h5";
  try {
    io::make_device_batch_source(options, 1000, nullptr, 2);
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("device = cuda: no GPU visible"), std::string::npos) << e.what();
  }
}

using NcclCommunicatorGpuTest = GpuFixture;

TEST_F(NcclCommunicatorGpuTest, OneRankAverageIsIdentity) {
  ensure_mpi();
  comm::HostGroup self(MPI_COMM_SELF);
  auto comm = comm::make_nccl_reducer(self, stream_, "none");
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  expect_one_rank_average_is_identity(*comm, *this, device_array<float>(1000), device_array<float>(3),
                                      device_array<float>(64 * 8));
}

TEST_F(NcclCommunicatorGpuTest, CompressedRoundTripIsClose) {
  ensure_mpi();
  // Round to nearest keeps 11 significant bits in fp16 and 8 in bf16.
  for (const auto& [compression, relative] : {std::pair<std::string, float>{"fp16", 1.0f / 2048},
                                              std::pair<std::string, float>{"bf16", 1.0f / 256}}) {
    SCOPED_TRACE(compression);
    comm::HostGroup self(MPI_COMM_SELF);
    auto comm = comm::make_nccl_reducer(self, stream_, compression);
    const std::vector<float> small = ramp(5000, 0.003f);
    const std::vector<float> large = ramp(70000, 40.0f);  // larger than the first: the wire buffer grows
    float* a = device_array<float>(small.size());
    float* b = device_array<float>(large.size());
    upload(small, a);
    upload(large, b);
    comm->start_average({a, small.size()});
    comm->start_average({b, large.size()});
    comm->finish_average();
    for (const auto& [values, device] : {std::pair{&small, a}, std::pair{&large, b}}) {
      const std::vector<float> back = download(device, values->size());
      std::size_t changed = 0;
      for (std::size_t i = 0; i < back.size(); ++i) {
        ASSERT_NEAR(back[i], (*values)[i], std::abs((*values)[i]) * relative) << "element " << i;
        if (back[i] != (*values)[i]) ++changed;
      }
      EXPECT_GT(changed, 0u) << "the values did not go through the " << compression << " casts";
    }
  }
}

using StagedMpiCommunicatorGpuTest = GpuFixture;

TEST_F(StagedMpiCommunicatorGpuTest, OneRankAverageIsIdentity) {
  ensure_mpi();
  comm::HostGroup self(MPI_COMM_SELF);
  auto comm = comm::make_staged_mpi_reducer(self, stream_);
  EXPECT_EQ(comm->backend(), "mpi");
  EXPECT_EQ(comm->size(), 1);
  expect_one_rank_average_is_identity(*comm, *this, device_array<float>(1000), device_array<float>(3),
                                      device_array<float>(64 * 8));
}

// The device source hands out the host source's batches, in order, even when the consumer's stream lags
// behind: each batch is read back on the stream after a delay, without a host synchronisation in between,
// so a slot overwritten too early would show up as a wrong batch.
class DeviceBatchSourceGpuTest : public GpuFixture, public ::testing::WithParamInterface<int> {};

void CUDART_CB stall(void*) {
  usleep(2000);
}

TEST_P(DeviceBatchSourceGpuTest, SameBatchesAsHostSource) {
  testing::TempDir dir;
  io::SyntheticOptions data;
  data.output = dir.file("data.h5");
  data.train = 150;
  data.test = 10;
  data.vocab = 100;
  data.maxlen = 16;
  io::write_synthetic(data);

  io::BatchReaderOptions options;
  options.path = data.output;
  options.split = "train";
  options.shard = io::Shard{0, data.train};
  options.batch_size = 16;
  options.seed = 5;
  options.drop_last = false;  // a short last batch too
  options.prefetch = 2;

  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> labels;
  auto host = io::make_host_batch_source(options);
  while (const auto batch = host->next()) {
    tokens.emplace_back(batch->tokens, batch->tokens + batch->batch * batch->seq);
    labels.emplace_back(batch->labels, batch->labels + batch->batch);
  }
  ASSERT_EQ(tokens.size(), 10u);

  auto device = io::make_device_batch_source(options, 0, stream_, GetParam());
  EXPECT_EQ(device->num_batches(), host->num_batches());
  std::vector<int32_t*> token_copies;
  std::vector<float*> label_copies;
  std::vector<int> sizes;
  while (const auto batch = device->next()) {
    ASSERT_EQ(batch->seq, data.maxlen);
    const auto n = static_cast<std::size_t>(batch->batch);
    token_copies.push_back(pinned_array<int32_t>(n * static_cast<std::size_t>(batch->seq)));
    label_copies.push_back(pinned_array<float>(n));
    sizes.push_back(batch->batch);
    ASSERT_CUDA(cudaLaunchHostFunc(stream_, stall, nullptr));
    ASSERT_CUDA(cudaMemcpyAsync(token_copies.back(), batch->tokens, n * batch->seq * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream_));
    ASSERT_CUDA(cudaMemcpyAsync(label_copies.back(), batch->labels, n * sizeof(float), cudaMemcpyDeviceToHost,
                                stream_));
  }
  EXPECT_FALSE(device->next().has_value());  // stays at the end
  ASSERT_CUDA(cudaStreamSynchronize(stream_));

  ASSERT_EQ(sizes.size(), tokens.size());
  for (std::size_t k = 0; k < tokens.size(); ++k) {
    SCOPED_TRACE("batch " + std::to_string(k));
    ASSERT_EQ(static_cast<std::size_t>(sizes[k]), labels[k].size());
    EXPECT_EQ(std::vector<int32_t>(token_copies[k], token_copies[k] + tokens[k].size()), tokens[k]);
    EXPECT_EQ(std::vector<float>(label_copies[k], label_copies[k] + labels[k].size()), labels[k]);
  }
  const double wait = device->input_wait_seconds();
  EXPECT_GE(wait, 0.0);
  EXPECT_TRUE(std::isfinite(wait));
}

INSTANTIATE_TEST_SUITE_P(Depths, DeviceBatchSourceGpuTest, ::testing::Values(2, 3));

}  // namespace
}  // namespace ddp

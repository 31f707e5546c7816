// The NCCL backend: one NCCL communicator per job, gradients reduced on a communication stream of its own.
//
// Ordering without host synchronisation: start_average() records an event on the compute stream (the
// replica's) and makes the communication stream wait on it before the all-reduce, so the reduction of a
// segment starts when backward has produced it while backward goes on; finish_average() makes the compute
// stream wait on an event recorded after the last reduction, so the optimizer (enqueued next on the compute
// stream) reads averaged gradients. The host never waits.
//
// One event per direction is enough however many segments are pending: cudaStreamWaitEvent() waits on the
// state the event captured at its most recent cudaEventRecord() before the call, and later records do not
// change what an earlier wait waits for (CUDA runtime API, cudaEventRecord).
//
// Averages are ncclAvg (NCCL >= 2.10; the build asks for 2.14, for ncclCommFinalize): every rank receives the
// same bits, as with the MPI backend. The set-up's agreement and the unique id's broadcast go through the
// HostGroup it is made over; afterwards it needs no host collective.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/wire_cast.h"
#include "engine/base/cuda_check.h"
#include "engine/base/cuda_handles.h"
#include "engine/base/errors.h"
#include "engine/base/gpu_spans.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0),
              "ncclAvg needs NCCL 2.10 and ncclCommFinalize 2.14 or newer");

namespace ddp::comm {
namespace {

// A failed NCCL call often reports only "unhandled system error"; the communicator's last error and its
// asynchronous error (a peer that failed, a network that went down) say more.
void check_nccl(ncclResult_t status, ncclComm_t comm, const char* call, const char* file, int line) {
  if (status == ncclSuccess) return;
  std::string what = std::string(call) + " failed: " + ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') what += " (" + std::string(last) + ")";
  if (comm != nullptr) {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess) {
      what += "; asynchronous error: " + std::string(ncclGetErrorString(async));
    }
  }
  ::ddp::fatal(what, file, line);
}

// In destructors: report and go on, never abort or throw.
void warn_nccl(ncclResult_t status, const char* call) {
  if (status != ncclSuccess)
    std::fprintf(stderr, "ddptrain: warning: %s: %s\n", call, ncclGetErrorString(status));
}

#define NCCL_COMM_NCCL(comm, call) check_nccl((call), (comm), #call, __FILE__, __LINE__)

enum class Wire { kFloat, kHalf, kBfloat16 };

Wire parse_compression(const std::string& compression) {
  if (compression == "none") return Wire::kFloat;
  if (compression == "fp16") return Wire::kHalf;
  if (compression == "bf16") return Wire::kBfloat16;
  throw UserError("comm.compression = " + compression + ": expected none, fp16 or bf16");
}

// The casts of wire_cast.h, tested on the host.
// bfloat16 keeps float's range: cast as it is, averaged by NCCL in bfloat16.
__global__ void to_bfloat16_wire(const float* __restrict__ in, uint16_t* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = float_to_bfloat16(in[i]);
  }
}

__global__ void from_bfloat16_wire(const uint16_t* __restrict__ in, float* __restrict__ out, std::size_t n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = bfloat16_to_float(in[i]);
  }
}

// fp16's scaled wire (wire_cast.h: half_wire_scale). The bucket's largest magnitude as float bits, which for
// non-negative floats order as the floats do (a NaN above every number, so that it passes unscaled): one
// atomicMax per block into `largest_bits`, zeroed before.
__global__ void largest_magnitude_bits(const float* __restrict__ in, std::size_t n, unsigned* largest_bits) {
  __shared__ unsigned block_largest;
  if (threadIdx.x == 0) block_largest = 0;
  __syncthreads();
  unsigned mine = 0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const unsigned bits = bits_of(in[i]) & 0x7fffffffu;
    mine = bits > mine ? bits : mine;
  }
  atomicMax(&block_largest, mine);
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(largest_bits, block_largest);
}

__global__ void to_half_wire_scaled(const float* __restrict__ in, uint16_t* __restrict__ out, std::size_t n,
                                    const unsigned* __restrict__ largest_bits, int ranks) {
  const float scale = half_wire_scale(float_of(*largest_bits), ranks);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = float_to_half(in[i] * scale);
  }
}

// The scale undone exactly (a power of two), then one rounding of the sum x (1 / ranks), as fp32 averages.
__global__ void from_half_wire_scaled(const uint16_t* __restrict__ in, float* __restrict__ out, std::size_t n,
                                      const unsigned* __restrict__ largest_bits, int ranks) {
  const float unscale = 1.0f / half_wire_scale(float_of(*largest_bits), ranks);
  const float inverse_ranks = 1.0f / static_cast<float>(ranks);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = (half_to_float(in[i]) * unscale) * inverse_ranks;
  }
}

constexpr unsigned kCastThreads = 256;
constexpr std::size_t kMaxCastBlocks = 4096;  // grid-stride beyond; enough to fill an H100 many times

unsigned cast_blocks(std::size_t n) {
  return static_cast<unsigned>(std::min(kMaxCastBlocks, (n + kCastThreads - 1) / kCastThreads));
}

class NcclReducer final : public GradientReducer {
 public:
  NcclReducer(HostGroup& group, void* compute_stream, Wire wire)
      : size_(group.size()), compute_(static_cast<cudaStream_t>(compute_stream)), wire_(wire) {
    // The caller picked the device (cudaSetDevice); the NCCL communicator and our stream live on it. Asking
    // for it first fails with CUDA's own message where no device is usable, instead of deep inside NCCL.
    // Every rank learns whether every rank can take part before NCCL's collective set-up: one that cannot (no
    // usable device; rank 0 without a unique id, as where NCCL finds no network interface) must not leave the
    // others in the broadcast or in ncclCommInitRank. All of them then fail alike (under ThrowFatalErrors,
    // check-env's, they all report it).
    std::optional<std::string> unable;
    int device = -1;
    if (const cudaError_t status = cudaGetDevice(&device); status != cudaSuccess)
      unable = std::string("cudaGetDevice failed: ") + cudaGetErrorString(status);
    ncclUniqueId id{};
    if (!unable && group.rank() == 0) {
      if (const ncclResult_t status = ncclGetUniqueId(&id); status != ncclSuccess) {
        const char* last = ncclGetLastError(nullptr);
        unable = std::string("ncclGetUniqueId failed: ") + ncclGetErrorString(status) +
                 (last != nullptr && last[0] != '\0' ? " (" + std::string(last) + ")" : "");
      }
    }
    if (unable) unable = "rank " + std::to_string(group.rank()) + ": " + *unable;
    if (const auto first = group.first_error(unable)) DDP_FATAL("NCCL's set-up: " + *first);
    group.broadcast(std::as_writable_bytes(std::span<ncclUniqueId>(&id, 1)), 0);
    NCCL_COMM_NCCL(nullptr, ncclCommInitRank(&nccl_, size_, id, group.rank()));

    // The highest priority lets reduction kernels start between backward's kernels instead of after them.
    int least = 0;
    int greatest = 0;
    DDP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    DDP_CUDA_CHECK(cudaStreamCreateWithPriority(stream_.out(), cudaStreamNonBlocking, greatest));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(computed_.out(), cudaEventDisableTiming));
    DDP_CUDA_CHECK(cudaEventCreateWithFlags(reduced_.out(), cudaEventDisableTiming));
    spans_.emplace(stream_.get(), device, "NCCL stream");
  }

  // Teardown order: the NCCL communicator (aborted, or finalized and destroyed once the stream has drained),
  // the wire buffer, then the owners below: computed_, reduced_, stream_, spans_ (see their declaration).
  ~NcclReducer() override {
    // Unwinding on this rank alone: the other ranks may never reach a collective finalize, so abort locally.
    if (std::uncaught_exceptions() > 0 || nccl_ == nullptr) {
      abort();
      warn_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize(communication stream)");
    } else {
      // The staging buffer may be in use until the stream drains.
      warn_cuda(cudaStreamSynchronize(stream_.get()), "cudaStreamSynchronize(communication stream)");
      warn_nccl(ncclCommFinalize(nccl_), "ncclCommFinalize");
      warn_nccl(ncclCommDestroy(nccl_), "ncclCommDestroy");
    }
    if (wire_buffer_ != nullptr) warn_cuda(cudaFree(wire_buffer_), "cudaFree(wire buffer)");
  }

  NcclReducer(const NcclReducer&) = delete;
  NcclReducer& operator=(const NcclReducer&) = delete;

  std::string backend() const override { return "nccl"; }
  int size() const override { return size_; }
  // NCCL's collectives can be captured into a CUDA graph (NCCL 2.9 and newer); the events that order the
  // two streams become the graph's edges.
  bool capturable() const override { return true; }

  // `segment` is device memory on this communicator's device. Even with one rank the segment goes through
  // NCCL (a copy) and, with compression, the casts: a run rounds its gradients the same way at any size.
  void start_average(std::span<float> segment) override {
    if (segment.empty()) return;
    DDP_CUDA_CHECK(cudaEventRecord(computed_.get(), compute_));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(stream_.get(), computed_.get(), 0));
    void* span = spans_->begin();  // the bucket's reduction on the timeline, when it is on
    const std::size_t n = segment.size();
    switch (wire_) {
      case Wire::kFloat:
        NCCL_COMM_NCCL(nccl_, ncclAllReduce(segment.data(), segment.data(), n, ncclFloat, ncclAvg, nccl_,
                                            stream_.get()));
        break;
      case Wire::kHalf:
        reduce_on_half_wire(segment);
        break;
      case Wire::kBfloat16:
        reduce_on_bfloat16_wire(segment);
        break;
    }
    spans_->end(span, "all-reduce bucket");
    ++pending_;
  }

  void finish_average() override {
    if (pending_ == 0) return;
    DDP_CUDA_CHECK(cudaEventRecord(reduced_.get(), stream_.get()));
    DDP_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_.get(), 0));
    pending_ = 0;
    // A peer's failure surfaces here as an asynchronous error, before the next host synchronisation hangs.
    ncclResult_t async = ncclSuccess;
    NCCL_COMM_NCCL(nccl_, ncclCommGetAsyncError(nccl_, &async));
    if (async != ncclSuccess) DDP_FATAL(std::string("NCCL asynchronous error: ") + ncclGetErrorString(async));
  }

  // Dense on GPUs: the whole matrix is averaged (the interconnect makes that cheap, and a GPU replica does
  // not track touched rows), and every row then holds the average. Returns no rows: the caller clears the
  // whole embedding gradient. Like every other call here it only orders work on the streams; it does not
  // block.
  std::vector<int32_t> start_average_rows(std::span<float> matrix, std::size_t /*width*/,
                                          std::span<const int32_t> /*rows*/) override {
    start_average(matrix);
    return {};
  }

  // The watchdog's thread may be asking asynchronous_error() meanwhile: the mutex keeps it off a freed comm.
  void abort() override {
    const std::lock_guard<std::mutex> lock(abort_mutex_);
    if (nccl_ == nullptr) return;
    warn_nccl(ncclCommAbort(nccl_), "ncclCommAbort");
    nccl_ = nullptr;
  }

  // NCCL answers this from any thread while the owning thread enqueues work.
  std::optional<std::string> asynchronous_error() override {
    const std::lock_guard<std::mutex> lock(abort_mutex_);
    if (nccl_ == nullptr) return std::string("the NCCL communicator was aborted after an error on this rank");
    ncclResult_t async = ncclSuccess;
    const ncclResult_t status = ncclCommGetAsyncError(nccl_, &async);
    if (status != ncclSuccess)
      return std::string("ncclCommGetAsyncError failed: ") + ncclGetErrorString(status);
    if (async == ncclSuccess || async == ncclInProgress) return std::nullopt;
    return std::string("NCCL asynchronous error: ") + ncclGetErrorString(async) +
           " (a peer failed or the network went down)";
  }

 private:
  // Cast to bfloat16, average, cast back; all on the communication stream, which runs them in order, so one
  // staging buffer serves every segment however many are pending.
  void reduce_on_bfloat16_wire(std::span<float> segment) {
    const std::size_t n = segment.size();
    auto* wire = static_cast<uint16_t*>(wire_buffer(n * sizeof(uint16_t)));
    to_bfloat16_wire<<<cast_blocks(n), kCastThreads, 0, stream_.get()>>>(segment.data(), wire, n);
    DDP_CUDA_CHECK(cudaGetLastError());
    NCCL_COMM_NCCL(nccl_, ncclAllReduce(wire, wire, n, ncclBfloat16, ncclAvg, nccl_, stream_.get()));
    from_bfloat16_wire<<<cast_blocks(n), kCastThreads, 0, stream_.get()>>>(wire, segment.data(), n);
    DDP_CUDA_CHECK(cudaGetLastError());
  }

  // fp16, scaled by a power of two from the bucket's largest magnitude over every rank (wire_cast.h:
  // half_wire_scale): the largest found on the device, agreed with NCCL's max, then cast, summed in fp16, and
  // cast back with the scale and 1/ranks undone in float. All on the communication stream, without the host.
  void reduce_on_half_wire(std::span<float> segment) {
    const std::size_t n = segment.size();
    // The staging buffer holds the wire values and, after them (aligned), the largest magnitude's bits.
    const std::size_t wire_bytes = (n * sizeof(uint16_t) + 255) / 256 * 256;
    auto* wire = static_cast<uint16_t*>(wire_buffer(wire_bytes + sizeof(unsigned)));
    auto* largest = reinterpret_cast<unsigned*>(reinterpret_cast<char*>(wire) + wire_bytes);
    cudaStream_t stream = stream_.get();
    DDP_CUDA_CHECK(cudaMemsetAsync(largest, 0, sizeof(unsigned), stream));
    largest_magnitude_bits<<<cast_blocks(n), kCastThreads, 0, stream>>>(segment.data(), n, largest);
    DDP_CUDA_CHECK(cudaGetLastError());
    NCCL_COMM_NCCL(nccl_, ncclAllReduce(largest, largest, 1, ncclUint32, ncclMax, nccl_, stream));
    const int ranks = size_;
    to_half_wire_scaled<<<cast_blocks(n), kCastThreads, 0, stream>>>(segment.data(), wire, n, largest, ranks);
    DDP_CUDA_CHECK(cudaGetLastError());
    NCCL_COMM_NCCL(nccl_, ncclAllReduce(wire, wire, n, ncclHalf, ncclSum, nccl_, stream));
    from_half_wire_scaled<<<cast_blocks(n), kCastThreads, 0, stream>>>(wire, segment.data(), n, largest,
                                                                       ranks);
    DDP_CUDA_CHECK(cudaGetLastError());
  }

  // Grows only while the first step meets larger segments (the replica's segments never change); the old
  // buffer may still be in use by work on the stream, so wait for it before freeing. Every rank grows at the
  // same segment, after every rank has enqueued the previous reductions, so this wait cannot deadlock.
  void* wire_buffer(std::size_t bytes) {
    if (bytes <= wire_bytes_) return wire_buffer_;
    if (wire_buffer_ != nullptr) {
      DDP_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
      DDP_CUDA_CHECK(cudaFree(wire_buffer_));
      wire_buffer_ = nullptr;
      wire_bytes_ = 0;
    }
    DDP_CUDA_CHECK(cudaMalloc(&wire_buffer_, bytes));
    wire_bytes_ = bytes;
    return wire_buffer_;
  }

  const int size_;  // the ranks
  cudaStream_t compute_ = nullptr;
  Wire wire_ = Wire::kFloat;
  // By hand, not an owner: the destructor either aborts it (under abort_mutex_, as abort() does for the
  // watchdog) or finalizes and destroys it after the stream has drained, before anything below is freed.
  ncclComm_t nccl_ = nullptr;
  // By hand, not a cuda::DeviceArray: freed in the destructor once the communicator is gone, and a failed
  // cudaFree while it grows is fatal here where DeviceArray would only warn.
  void* wire_buffer_ = nullptr;  // fp16/bf16 staging
  std::size_t wire_bytes_ = 0;
  std::mutex abort_mutex_;                   // abort() against asynchronous_error() on another thread
  int pending_ = 0;                          // segments started since the last finish_average()
  std::optional<timeline::GpuSpans> spans_;  // made with the stream
  // Declared last so that they are destroyed first (members go in reverse order), after the destructor's
  // body: computed_, then reduced_, then stream_, then spans_.
  cuda::Stream stream_;   // communication stream
  cuda::Event reduced_;   // communication -> compute
  cuda::Event computed_;  // compute -> communication
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(HostGroup& group, void* compute_stream,
                                                   const std::string& compression) {
  const Wire wire = parse_compression(compression);  // before any collective, so a bad value costs nothing
  return std::make_unique<NcclReducer>(group, compute_stream, wire);
}

}  // namespace ddp::comm

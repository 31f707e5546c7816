// What accelerators this process can see. CMake compiles device_cuda.cpp when the CUDA path is built and
// device_none.cpp otherwise, so callers never test for CUDA themselves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::engine {

struct GpuInfo {
  int index = 0;  // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;
  std::string pci_bus_id;
  uint64_t total_memory_bytes = 0;
  int compute_major = 0;  // compute capability, e.g. 9.0 for an H100
  int compute_minor = 0;
};

struct GpuInventory {
  bool cuda_built = false;
  std::vector<GpuInfo> gpus;
  std::string why_none;  // when gpus is empty: why, in words a user can act on (with CUDA's own error text)
  // The same in a few words for where no GPU is simply normal, a CPU-only node: "no GPU driver", "no GPU
  // visible", "built without CUDA"; why_none itself for anything else (a driver too old for the runtime).
  std::string why_none_brief;
};

GpuInventory probe_gpus();

// Makes CUDA device `index` (an ordinal after CUDA_VISIBLE_DEVICES) current for this thread, so that streams,
// memory, cuDNN and NCCL created afterwards live on it. Ends the job through fatal() if CUDA refuses. Only
// called with an index from probe_gpus(); the build without CUDA has no GPU to bind and treats a call as a
// bug.
void use_gpu(int index);

// The GPU software stack, for `ddptrain check-env`. Each entry is a version ("12.4"), or words saying why
// there is none: "not built" in a build without CUDA, "none (...)" when the library or driver is missing.
struct GpuSoftwareVersions {
  std::string driver;        // the CUDA version the driver supports, and the kernel module's version
  std::string cuda_runtime;  // the runtime linked in, and the one compiled against if they differ
  std::string cudnn;
  std::string nccl;
};
GpuSoftwareVersions gpu_software_versions();

// For --version: what the GPU path is built with and which libraries it opens when a GPU is used (none of
// them is needed to start), each with its fallback path: "CUDA 13.0 (linked in); opens libcudnn.so.9
// (else /usr/local/cuda/lib/libcudnn.so.9), ...". "not built" in a build without CUDA. Opens nothing.
std::string gpu_build_line();

// Whether GPU `device` can read and write GPU `peer`'s memory directly (NVLink or PCIe peer-to-peer); both
// ordinals from probe_gpus(). Throws std::runtime_error when CUDA refuses to answer; false in a build
// without CUDA.
bool gpu_peer_access(int device, int peer);

// Bytes in the memory of GPU `device`, freed with the object: small inputs such as check-env's smoke-test
// batch and the self-check's batches and gradients. Copies complete before they return, and a download
// first waits for all work on the device (streams that may write the buffer). Throws
// std::runtime_error naming the CUDA call that failed (so that a caller can report it instead of ending the
// job), and UserError in a build without CUDA.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, std::size_t bytes);
  // Allocated and filled with `bytes` bytes from `host`.
  DeviceBuffer(int device, const void* host, std::size_t bytes);
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  // The first `bytes` bytes from or to host memory.
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;

 private:
  int device_ = 0;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace ddp::engine

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "comm/nccl_library.h"
#include "engine/base/cuda_check.h"
#include "engine/base/errors.h"
#include "engine/base/runtime_library.h"
#include "engine/device.h"
#include "models/cudnn_library.h"

namespace ddp::engine {
namespace {

// CUDA encodes versions as 1000 * major + 10 * minor.
std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

// cuDNN 9 encodes 10000 * major + 100 * minor + patch, earlier releases 1000 * major + 100 * minor + patch.
std::string cudnn_version_text(std::size_t version) {
  const std::size_t major_unit = version >= 90000 ? 10000 : 1000;
  return std::to_string(version / major_unit) + "." + std::to_string(version % major_unit / 100) + "." +
         std::to_string(version % 100);
}

// NCCL_VERSION(): 1000 * major + 100 * minor + patch up to 2.8, 10000 * major + ... from 2.9 on.
std::string nccl_version_text(int version) {
  const int major_unit = version >= 20900 ? 10000 : 1000;
  return std::to_string(version / major_unit) + "." + std::to_string(version % major_unit / 100) + "." +
         std::to_string(version % 100);
}

// The kernel module's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
// Module  550.54.15  ..."), or "" where the file is absent (no driver, or a container that hides it).
std::string kernel_module_version() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return "";
  std::istringstream words(line);
  for (std::string word; words >> word;) {
    const bool version_like = !word.empty() && word.find('.') != std::string::npos &&
                              word.find_first_not_of("0123456789.") == std::string::npos;
    if (version_like) return word;
  }
  return "";
}

// The libraries the GPU path loads at run time that are not here, by name: "libcuda.so.1 (the NVIDIA
// driver), libcudnn.so.9". Empty when all load.
std::string missing_gpu_libraries() {
  std::string missing;
  const auto note = [&missing](const std::string& what) { missing += (missing.empty() ? "" : ", ") + what; };
  // The static CUDA runtime opens the driver's library itself; this only names it when it is absent.
  static const base::RuntimeLibrary driver({"libcuda.so.1"});
  if (!driver.loaded()) note(driver.name() + " (the NVIDIA driver)");
  if (!models::cudnn_library().loaded()) note(models::cudnn_library().name());
  if (!comm::nccl_library().loaded()) note(comm::nccl_library().name());
  return missing;
}

void throw_on_cuda_error(cudaError_t status, const std::string& call) {
  if (status != cudaSuccess) throw std::runtime_error(call + " failed: " + cudaGetErrorString(status));
}

}  // namespace

GpuInventory probe_gpus() {
  GpuInventory inventory;
  inventory.cuda_built = true;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  // No driver (cudaErrorInsufficientDriver) and no device (cudaErrorNoDevice) both mean: no GPU here.
  if (status != cudaSuccess || count == 0) {
    // Without a driver CUDA says "CUDA driver version is insufficient for CUDA runtime version": on a
    // CPU-only node that is no problem, so say it plainly (as check-env does). A driver that is there but
    // too old keeps the full text.
    int driver = 0;
    const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
    const std::string missing = missing_gpu_libraries();
    inventory.why_none = std::string("no GPU visible (") +
                         (no_driver               ? "no NVIDIA driver is loaded"
                          : status != cudaSuccess ? cudaGetErrorString(status)
                                                  : "the driver lists none") +
                         (missing.empty() ? "" : "; not installed here: " + missing) +
                         "): check the driver, CUDA_VISIBLE_DEVICES or the job's --gres/--gpus";
    if (no_driver) {
      inventory.why_none_brief = "no GPU driver";
    } else if (status == cudaErrorNoDevice || count == 0) {
      inventory.why_none_brief = "no GPU visible";
    } else {
      inventory.why_none_brief = inventory.why_none;
    }
    cudaGetLastError();  // these failures are not sticky: leave no error for a later launch check to report
    return inventory;
  }
  // GPUs, but without cuDNN or NCCL (opened here, at run time) the GPU path cannot run on them.
  for (const base::RuntimeLibrary* library : {&models::cudnn_library(), &comm::nccl_library()}) {
    if (library->loaded()) continue;
    inventory.why_none = std::to_string(count) + " GPU(s), but the GPU path needs " +
                         library->why_not_loaded() + ": install it, or put its folder on LD_LIBRARY_PATH";
    inventory.why_none_brief = library->name() + " missing";
    cudaGetLastError();
    return inventory;
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo info;
    info.index = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) {
      info.name = prop.name;
      info.total_memory_bytes = prop.totalGlobalMem;
      info.compute_major = prop.major;
      info.compute_minor = prop.minor;
    }
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i) == cudaSuccess) info.pci_bus_id = bus_id;
    inventory.gpus.push_back(info);
  }
  cudaGetLastError();  // as above: a failed property query must not surface at a later launch check
  return inventory;
}

void use_gpu(int index) {
  const cudaError_t status = cudaSetDevice(index);
  if (status != cudaSuccess) {
    DDP_FATAL("cudaSetDevice(" + std::to_string(index) + ") failed: " + cudaGetErrorString(status));
  }
}

GpuSoftwareVersions gpu_software_versions() {
  GpuSoftwareVersions versions;
  const std::string module = kernel_module_version();
  int driver = 0;
  const cudaError_t driver_status = cudaDriverGetVersion(&driver);
  if (driver_status != cudaSuccess) {
    versions.driver = std::string("unknown (") + cudaGetErrorString(driver_status) + ")";
  } else if (driver == 0) {
    versions.driver = "none (no NVIDIA driver is loaded)";
  } else {
    versions.driver = "supports CUDA " + cuda_version_text(driver);
    if (!module.empty()) versions.driver = module + ", " + versions.driver;
  }

  int runtime = 0;
  const cudaError_t runtime_status = cudaRuntimeGetVersion(&runtime);
  versions.cuda_runtime = runtime_status == cudaSuccess
                              ? cuda_version_text(runtime)
                              : std::string("unknown (") + cudaGetErrorString(runtime_status) + ")";
  if (runtime_status == cudaSuccess && runtime != CUDART_VERSION)
    versions.cuda_runtime += " (built with " + cuda_version_text(CUDART_VERSION) + ")";
  if (runtime_status == cudaSuccess && driver > 0 && driver < runtime)
    versions.cuda_runtime += ", newer than the driver supports: update the driver";

  if (!models::cudnn_library().loaded()) {
    versions.cudnn = "none (" + models::cudnn_library().why_not_loaded() + ")";
  } else {
    const std::size_t cudnn = cudnnGetVersion();
    versions.cudnn = cudnn_version_text(cudnn);
    if (cudnn != CUDNN_VERSION) versions.cudnn += " (built with " + cudnn_version_text(CUDNN_VERSION) + ")";
  }

  if (!comm::nccl_library().loaded()) {
    versions.nccl = "none (" + comm::nccl_library().why_not_loaded() + ")";
    return versions;
  }
  int nccl = 0;
  const ncclResult_t nccl_status = ncclGetVersion(&nccl);
  versions.nccl = nccl_status == ncclSuccess
                      ? nccl_version_text(nccl)
                      : std::string("unknown (") + ncclGetErrorString(nccl_status) + ")";
  if (nccl_status == ncclSuccess && nccl != NCCL_VERSION_CODE)
    versions.nccl += " (built with " + nccl_version_text(NCCL_VERSION_CODE) + ")";
  return versions;
}

std::string gpu_build_line() {
  std::string line = "CUDA " + cuda_version_text(CUDART_VERSION) + " (linked in); opens";
  const char* separator = " ";
  for (const std::vector<std::string>& names : {models::cudnn_library_names(), comm::nccl_library_names()}) {
    line += separator + names.front() + " (else " + names.back() + ")";
    separator = ", ";
  }
  return line + " when a GPU is used";
}

bool gpu_peer_access(int device, int peer) {
  int can_access = 0;
  throw_on_cuda_error(
      cudaDeviceCanAccessPeer(&can_access, device, peer),
      "cudaDeviceCanAccessPeer(" + std::to_string(device) + ", " + std::to_string(peer) + ")");
  return can_access != 0;
}

DeviceBuffer::DeviceBuffer(int device, std::size_t bytes) : device_(device), bytes_(bytes) {
  throw_on_cuda_error(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  throw_on_cuda_error(cudaMalloc(&data_, std::max<std::size_t>(bytes, 1)),
                      "cudaMalloc(" + std::to_string(bytes) + " bytes)");
}

// Once the delegated constructor has returned the object exists, so a failed upload runs the destructor,
// which frees the memory (freeing it here too would free it twice).
DeviceBuffer::DeviceBuffer(int device, const void* host, std::size_t bytes) : DeviceBuffer(device, bytes) {
  upload(host, bytes);
}

DeviceBuffer::~DeviceBuffer() {
  warn_cuda(cudaFree(data_), "cudaFree");
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::upload: more bytes than the buffer holds");
  throw_on_cuda_error(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  throw_on_cuda_error(cudaMemcpy(data_, host, bytes, cudaMemcpyHostToDevice),
                      "cudaMemcpy to GPU " + std::to_string(device_));
  // From pageable memory cudaMemcpy may return before the DMA has landed, and a replica's non-blocking
  // stream is not ordered after the default stream: wait for the data before anyone reads it.
  throw_on_cuda_error(cudaDeviceSynchronize(),
                      "cudaDeviceSynchronize after a copy to GPU " + std::to_string(device_));
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  if (bytes > bytes_) throw std::invalid_argument("DeviceBuffer::download: more bytes than the buffer holds");
  throw_on_cuda_error(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  // Work on other (non-blocking) streams may be writing the buffer (a replica's, NCCL's): wait for all of it.
  throw_on_cuda_error(cudaDeviceSynchronize(),
                      "cudaDeviceSynchronize before a copy from GPU " + std::to_string(device_));
  throw_on_cuda_error(cudaMemcpy(host, data_, bytes, cudaMemcpyDeviceToHost),
                      "cudaMemcpy from GPU " + std::to_string(device_));
}

}  // namespace ddp::engine

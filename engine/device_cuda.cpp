#include <cuda_runtime_api.h>

#include "engine/device.h"
#include "engine/errors.h"

namespace ddp::engine {

GpuInventory probe_gpus() {
  GpuInventory inventory;
  inventory.cuda_built = true;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  // No driver (cudaErrorInsufficientDriver) and no device (cudaErrorNoDevice) both mean: no GPU here.
  if (status != cudaSuccess || count == 0) {
    inventory.why_none = std::string("no GPU visible (") + cudaGetErrorString(status) +
                         "): check the driver, CUDA_VISIBLE_DEVICES or the job's --gres/--gpus";
    return inventory;
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo info;
    info.index = i;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) info.name = prop.name;
    char bus_id[32] = {};
    if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i) == cudaSuccess) info.pci_bus_id = bus_id;
    inventory.gpus.push_back(info);
  }
  return inventory;
}

void use_gpu(int index) {
  const cudaError_t status = cudaSetDevice(index);
  if (status != cudaSuccess) {
    DDP_FATAL("cudaSetDevice(" + std::to_string(index) + ") failed: " + cudaGetErrorString(status));
  }
}

}  // namespace ddp::engine

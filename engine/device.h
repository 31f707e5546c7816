// What accelerators this process can see. CMake compiles device_cuda.cpp when the CUDA path is built and
// device_none.cpp otherwise, so callers never test for CUDA themselves.
#pragma once

#include <string>
#include <vector>

namespace ddp::engine {

struct GpuInfo {
  int index = 0;  // CUDA device ordinal (after CUDA_VISIBLE_DEVICES)
  std::string name;
  std::string pci_bus_id;
};

struct GpuInventory {
  bool cuda_built = false;
  std::vector<GpuInfo> gpus;
  std::string why_none;  // when gpus is empty: why, in words a user can act on
};

GpuInventory probe_gpus();

// Makes CUDA device `index` (an ordinal after CUDA_VISIBLE_DEVICES) current for this thread, so that streams,
// memory, cuDNN and NCCL created afterwards live on it. Ends the job through fatal() if CUDA refuses. Only
// called with an index from probe_gpus(); the build without CUDA has no GPU to bind and treats a call as a
// bug.
void use_gpu(int index);

}  // namespace ddp::engine

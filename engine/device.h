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

}  // namespace ddp::engine

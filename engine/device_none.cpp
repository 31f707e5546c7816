#include "engine/device.h"

namespace ddp::engine {

GpuInventory probe_gpus() {
  GpuInventory inventory;
  inventory.why_none = "this ddptrain was built without CUDA (configure with -DDDPTRAIN_CUDA=ON)";
  return inventory;
}

}  // namespace ddp::engine

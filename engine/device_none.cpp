#include "engine/device.h"

#include <string>

#include "engine/base/errors.h"

namespace ddp::engine {

GpuInventory probe_gpus() {
  GpuInventory inventory;
  inventory.why_none = "this ddptrain was built without CUDA (configure with -DDDPTRAIN_CUDA=ON)";
  inventory.why_none_brief = "built without CUDA";
  return inventory;
}

void use_gpu(int index) {
  DDP_FATAL("use_gpu(" + std::to_string(index) + ") in a build without CUDA: probe_gpus() lists no GPU here");
}

GpuSoftwareVersions gpu_software_versions() {
  return {"not built", "not built", "not built", "not built"};
}

std::string gpu_build_line() {
  return "not built";
}

bool gpu_peer_access(int, int) {
  return false;
}

DeviceBuffer::DeviceBuffer(int, std::size_t) {
  throw UserError("this ddptrain was built without CUDA (configure with -DDDPTRAIN_CUDA=ON)");
}

DeviceBuffer::DeviceBuffer(int device, const void*, std::size_t bytes) : DeviceBuffer(device, bytes) {}

DeviceBuffer::~DeviceBuffer() = default;

void DeviceBuffer::upload(const void*, std::size_t) {}
void DeviceBuffer::download(void*, std::size_t) const {}

}  // namespace ddp::engine

#include "engine/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <utility>

namespace ddp::engine {
namespace {

// The few NVML entry points used here, with their C signatures from nvml.h (not installed with the CUDA
// toolkit, and not needed: the library is loaded at run time).
extern "C" {
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;  // an enum in nvml.h; NVML_SUCCESS is 0
typedef struct {
  unsigned int gpu;     // percent of the sample period during which a kernel was running
  unsigned int memory;  // percent of the period during which device memory was read or written
} nvmlUtilization_t;
typedef struct {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;
typedef nvmlReturn_t (*NvmlInitFn)(void);
typedef nvmlReturn_t (*NvmlShutdownFn)(void);
typedef const char* (*NvmlErrorStringFn)(nvmlReturn_t);
typedef nvmlReturn_t (*NvmlGetHandleByPciBusIdFn)(const char* pci_bus_id, nvmlDevice_t* device);
typedef nvmlReturn_t (*NvmlGetUtilizationRatesFn)(nvmlDevice_t device, nvmlUtilization_t* utilization);
typedef nvmlReturn_t (*NvmlGetMemoryInfoFn)(nvmlDevice_t device, nvmlMemory_t* memory);
}

constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr auto kSamplePeriod = std::chrono::milliseconds(200);
constexpr double kMib = 1024.0 * 1024.0;

struct Nvml {
  void* library = nullptr;
  NvmlInitFn init = nullptr;
  NvmlShutdownFn shutdown = nullptr;
  NvmlErrorStringFn error_string = nullptr;
  NvmlGetHandleByPciBusIdFn handle_by_bus_id = nullptr;
  NvmlGetUtilizationRatesFn utilization = nullptr;
  NvmlGetMemoryInfoFn memory = nullptr;

  std::string error(nvmlReturn_t status) const {
    const char* text = error_string != nullptr ? error_string(status) : nullptr;
    return text != nullptr ? text : "NVML error " + std::to_string(status);
  }
};

template <typename Fn>
bool load_symbol(void* library, const char* name, Fn* fn, std::string* missing) {
  *fn = reinterpret_cast<Fn>(dlsym(library, name));
  if (*fn == nullptr) *missing = name;
  return *fn != nullptr;
}

void set_reason(std::string* why_not, const std::string& reason) {
  if (why_not != nullptr) *why_not = reason;
}

}  // namespace

void GpuSampleAccumulator::add(const GpuReading& reading) {
  utilization_sum_ += reading.utilization_percent;
  memory_peak_mib_ = std::max(memory_peak_mib_, reading.memory_used_mib);
  memory_total_mib_ = reading.memory_total_mib;
  ++readings_;
}

GpuSample GpuSampleAccumulator::take() {
  GpuSample sample;
  if (readings_ > 0) {
    sample.utilization_percent = utilization_sum_ / readings_;
    sample.memory_used_mib = memory_peak_mib_;
    sample.memory_total_mib = memory_total_mib_;
    sample.readings = readings_;
  }
  *this = GpuSampleAccumulator();
  return sample;
}

std::unique_ptr<GpuMonitor> GpuMonitor::start(const std::string& pci_bus_id, std::string* why_not) {
  if (pci_bus_id.empty()) {
    set_reason(why_not, "no PCI bus id for the GPU");
    return nullptr;
  }
  Nvml nvml;
  nvml.library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (nvml.library == nullptr) {
    const char* error = dlerror();
    set_reason(why_not, std::string("NVML not available (") + (error != nullptr ? error : "dlopen failed") +
                            "): it comes with the NVIDIA driver");
    return nullptr;
  }
  std::string missing;
  const bool loaded =
      load_symbol(nvml.library, "nvmlInit_v2", &nvml.init, &missing) &&
      load_symbol(nvml.library, "nvmlShutdown", &nvml.shutdown, &missing) &&
      load_symbol(nvml.library, "nvmlErrorString", &nvml.error_string, &missing) &&
      load_symbol(nvml.library, "nvmlDeviceGetHandleByPciBusId_v2", &nvml.handle_by_bus_id, &missing) &&
      load_symbol(nvml.library, "nvmlDeviceGetUtilizationRates", &nvml.utilization, &missing) &&
      load_symbol(nvml.library, "nvmlDeviceGetMemoryInfo", &nvml.memory, &missing);
  if (!loaded) {
    set_reason(why_not, "NVML has no " + missing + ": the driver is too old");
    dlclose(nvml.library);
    return nullptr;
  }
  const nvmlReturn_t init_status = nvml.init();
  if (init_status != kNvmlSuccess) {
    set_reason(why_not, "nvmlInit_v2 failed: " + nvml.error(init_status));
    dlclose(nvml.library);
    return nullptr;
  }
  nvmlDevice_t device = nullptr;
  const nvmlReturn_t handle_status = nvml.handle_by_bus_id(pci_bus_id.c_str(), &device);
  if (handle_status != kNvmlSuccess) {
    set_reason(why_not,
               "NVML cannot find the GPU at PCI bus id " + pci_bus_id + ": " + nvml.error(handle_status));
    nvml.shutdown();
    dlclose(nvml.library);
    return nullptr;
  }
  auto reader = [nvml, device]() -> std::optional<GpuReading> {
    nvmlUtilization_t utilization{};
    nvmlMemory_t memory{};
    if (nvml.utilization(device, &utilization) != kNvmlSuccess) return std::nullopt;
    if (nvml.memory(device, &memory) != kNvmlSuccess) return std::nullopt;
    return GpuReading{static_cast<double>(utilization.gpu), static_cast<double>(memory.used) / kMib,
                      static_cast<double>(memory.total) / kMib};
  };
  auto release = [nvml] {
    nvml.shutdown();
    dlclose(nvml.library);
  };
  return std::make_unique<GpuMonitor>(std::move(reader), kSamplePeriod, std::move(release));
}

GpuMonitor::GpuMonitor(GpuReader reader, std::chrono::milliseconds period, std::function<void()> release)
    : reader_(std::move(reader)), period_(period), release_(std::move(release)) {
  thread_ = std::thread([this] { run(); });
}

GpuMonitor::~GpuMonitor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (release_) release_();
}

std::optional<GpuReading> GpuMonitor::read() {
  std::lock_guard lock(reader_mutex_);
  return reader_();
}

void GpuMonitor::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    lock.unlock();
    const std::optional<GpuReading> reading = read();
    lock.lock();
    if (reading) accumulator_.add(*reading);
    wake_.wait_for(lock, period_, [this] { return stop_; });
  }
}

GpuSample GpuMonitor::take() {
  {
    std::lock_guard lock(mutex_);
    if (accumulator_.readings() > 0) return accumulator_.take();
  }
  const std::optional<GpuReading> reading = read();
  std::lock_guard lock(mutex_);
  if (reading) accumulator_.add(*reading);
  return accumulator_.take();
}

}  // namespace ddp::engine

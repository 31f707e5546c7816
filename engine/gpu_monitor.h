// GPU utilization and memory during training, read through NVML (the library behind nvidia-smi).
//
// NVML ships with the NVIDIA driver, not with the CUDA toolkit, so it is loaded at run time with dlopen:
// the same binary runs where the driver is missing (a CPU node, CI), and the monitor then simply does not
// start. A monitor samples one GPU, named by its PCI bus id (the id CUDA reports, which stays the same
// whatever CUDA_VISIBLE_DEVICES renumbers), every ~200 ms on a thread of its own; the trainer takes the
// summary once per epoch.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ddp::engine {

// One reading of the GPU.
struct GpuReading {
  double utilization_percent = 0;  // share of the last sample period in which a kernel ran
  double memory_used_mib = 0;      // by every process on the GPU
  double memory_total_mib = 0;
};

// What take() reports for the time since the previous take().
struct GpuSample {
  double utilization_percent = 0;  // mean over the readings
  double memory_used_mib = 0;      // peak over the readings
  double memory_total_mib = 0;
  int readings = 0;  // 0: no reading succeeded (the other fields are then 0)
};

// Adds up readings between two take()s; the arithmetic of GpuMonitor, on its own so that it can be tested.
class GpuSampleAccumulator {
 public:
  void add(const GpuReading& reading);
  // The summary of the readings added since the last take(), and starts over.
  GpuSample take();
  int readings() const { return readings_; }

 private:
  double utilization_sum_ = 0;
  double memory_peak_mib_ = 0;
  double memory_total_mib_ = 0;
  int readings_ = 0;
};

// Reads the GPU once; nothing when the read failed (the sample is then left out). Must not throw.
using GpuReader = std::function<std::optional<GpuReading>()>;

class GpuMonitor {
 public:
  // Loads NVML and starts sampling the GPU with this PCI bus id ("0000:3b:00.0"). Returns nullptr, with the
  // reason in *why_not (if given), when NVML or the GPU cannot be found; never throws for that.
  static std::unique_ptr<GpuMonitor> start(const std::string& pci_bus_id, std::string* why_not);
  // Samples with `reader` every `period`, on the monitor's thread. `release` runs once after the thread has
  // stopped (NVML's shutdown); it may be empty.
  GpuMonitor(GpuReader reader, std::chrono::milliseconds period, std::function<void()> release = {});
  GpuMonitor(const GpuMonitor&) = delete;
  GpuMonitor& operator=(const GpuMonitor&) = delete;
  ~GpuMonitor();

  // Mean utilization and peak memory since the last take() (or since start). When no reading was taken in
  // between (an epoch shorter than the period), reads the GPU once now, so an epoch always gets a value.
  GpuSample take();

 private:
  void run();
  std::optional<GpuReading> read();

  GpuReader reader_;
  std::chrono::milliseconds period_;
  std::function<void()> release_;
  std::mutex reader_mutex_;  // the reader is called from one thread at a time
  std::mutex mutex_;         // guards accumulator_ and stop_
  std::condition_variable wake_;
  GpuSampleAccumulator accumulator_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddp::engine

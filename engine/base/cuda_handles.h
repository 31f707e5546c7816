// Owners for what the CUDA code creates, shared by every .cu file: a handle of CUDA, cuDNN or NCCL destroyed
// with the library's own function, device memory that grows, one pinned host value. Their destructors never
// end the job (a failed release is a warning), so they may run while an error unwinds.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>

#include "engine/base/cuda_check.h"

namespace ddp::cuda {

// A handle made by a create function (through out()) and destroyed with kDestroy, whose status (0 for
// success in CUDA, cuDNN and NCCL alike) kErrorText words: Owned<cudnnHandle_t, cudnnDestroy,
// cudnnGetErrorString>.
template <typename Handle, auto kDestroy, auto kErrorText>
class Owned {
 public:
  Owned() = default;
  ~Owned() { reset(); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;

  Handle get() const { return handle_; }
  // For the create function's out parameter.
  Handle* out() {
    reset();
    return &handle_;
  }
  void reset() {
    if (handle_ == Handle{}) return;
    const auto status = kDestroy(handle_);
    if (status != decltype(status){}) {
      std::fprintf(stderr, "ddptrain: warning: destroying a CUDA/cuDNN handle: %s\n", kErrorText(status));
    }
    handle_ = Handle{};
  }

 private:
  Handle handle_{};
};

using Stream = Owned<cudaStream_t, cudaStreamDestroy, cudaGetErrorString>;
using Event = Owned<cudaEvent_t, cudaEventDestroy, cudaGetErrorString>;

// Device memory that only grows; its contents are scratch and are not kept when it does.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t bytes() const { return size_ * sizeof(T); }
  // At least n elements. The caller has drained the streams that use the old buffer.
  void ensure(std::size_t n) {
    if (n <= size_) return;
    release();
    DDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), n * sizeof(T)));
    size_ = n;
  }

 private:
  void release() {
    if (data_ != nullptr) warn_cuda(cudaFree(data_), "cudaFree");
    data_ = nullptr;
    size_ = 0;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
};

// Pinned host memory for one T, so that a copy of it is a true async copy. Allocate it once the right device
// is current, so that no other GPU gets a context.
template <typename T>
class PinnedValue {
 public:
  PinnedValue() = default;
  ~PinnedValue() {
    if (value_ != nullptr) warn_cuda(cudaFreeHost(value_), "cudaFreeHost");
  }
  PinnedValue(const PinnedValue&) = delete;
  PinnedValue& operator=(const PinnedValue&) = delete;
  void allocate() {
    DDP_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&value_), sizeof(T)));
    *value_ = T{};
  }
  T* get() const { return value_; }

 private:
  T* value_ = nullptr;
};

}  // namespace ddp::cuda

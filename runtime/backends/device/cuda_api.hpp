// Thin RAII over the CUDA runtime for the engine's device path: errors become co2 Errors with the
// CUDA message; device memory comes from cudaMalloc or the caller's allocator.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "runtime/backends/device/allocator.hpp"
#include "runtime/backends/device/selection.hpp"
#include "runtime/base/status.hpp"

namespace co2::device {

// Throws Error(Transport-free statuses: OutOfMemory for allocation failures, Internal otherwise)
// naming `what` and CUDA's message.
void check(cudaError_t error, const char* what);
inline void check(int error, const char* what) { check(cudaError_t(error), what); }

// Usable devices: 0 on any error (no driver is error 35) or when there are none.
int device_count();

// Sets the current device for this thread.
void use_device(int index);

// Throws InvalidArgument unless [data, +bytes) is memory of CUDA device `device` (its first and
// last byte are asked), naming `what`.
void check_device_memory(const void* data, size_t bytes, int device, const std::string& what);

// The host waits until `stream`'s work issued so far is done, polling, at most `timeout`
// (Status::Timeout after it, naming `what`): a hung kernel costs the timeout, not the process.
void wait_for_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const char* what);

// Device memory of `count` elements of T, zeroed, from cudaMalloc or `allocator`.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(size_t bytes, int device, const DeviceAllocator& allocator, cudaStream_t stream);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& o) noexcept { swap(o); }
  DeviceMemory& operator=(DeviceMemory&& o) noexcept {
    DeviceMemory moved(std::move(o));
    swap(moved);
    return *this;
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  template <typename T = void>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void swap(DeviceMemory& o) noexcept;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  int device_ = 0;
  DeviceAllocator allocator_{};
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory (the staging buffers of GPU over UCX, the boundary reports).
class PinnedMemory {
 public:
  PinnedMemory() = default;
  explicit PinnedMemory(size_t bytes);
  ~PinnedMemory();
  PinnedMemory(PinnedMemory&& o) noexcept { std::swap(data_, o.data_); std::swap(bytes_, o.bytes_); }
  PinnedMemory& operator=(PinnedMemory&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  template <typename T = void>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

class CudaStream {
 public:
  CudaStream();  // non-blocking with respect to the legacy default stream
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing; recorded() says whether record() was ever called, so that nothing
// waits on an event that was never recorded.
class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(cudaStream_t stream);
  void make_wait(cudaStream_t stream) const;  // `stream` waits (host does not block)
  void synchronize() const;                   // the host blocks
  bool done() const;                          // non-blocking query
  bool recorded() const { return recorded_; }

 private:
  cudaEvent_t event_ = nullptr;
  bool recorded_ = false;
};

}  // namespace co2::device

// The host executor's CUDA runtime (cuda_runtime.h here): device memory is aligned host memory
// registered in a table, so that cudaPointerGetAttributes tells device from host pointers as
// the real runtime does; every asynchronous operation completes before it returns.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

#include "runtime/backends/device/host_executor/executor_log.hpp"

namespace co2::device::host_executor {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<const char*, size_t> device;  // begin -> bytes
  size_t device_bytes = 0;
  std::vector<std::string> operations;
};

Registry& registry() {
  static Registry r;
  return r;
}

// Device memory is 256-byte aligned, as cudaMalloc's.
constexpr size_t kAlignment = 256;

bool is_device(const void* p) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const char* c = static_cast<const char*>(p);
  auto it = r.device.upper_bound(c);
  if (it == r.device.begin()) return false;
  --it;
  return c >= it->first && c < it->first + (it->second ? it->second : 1);
}

const char* side(const void* p) { return is_device(p) ? "D" : "H"; }

}  // namespace

void record(const std::string& operation) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.operations.push_back(operation);
}

std::vector<std::string> recorded() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.operations;
}

void clear_recorded() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.operations.clear();
}

size_t device_bytes_in_use() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.device_bytes;
}

}  // namespace co2::device::host_executor

namespace ex = co2::device::host_executor;

// The streams and events are tokens: nothing is ever pending.
struct CUstream_st {};
struct CUevent_st {
  bool recorded = false;
};

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error (host executor)";
    case cudaErrorInvalidValue: return "invalid argument (host executor)";
    case cudaErrorMemoryAllocation: return "out of memory (host executor)";
    case cudaErrorInvalidDevice: return "invalid device ordinal (host executor: one device)";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer (host executor)";
    default: return "error (host executor)";
  }
}

cudaError_t cudaGetLastError() { return cudaSuccess; }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  if (!attributes) return cudaErrorInvalidValue;
  const bool device = ex::is_device(pointer);
  *attributes = cudaPointerAttributes{device ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered, device ? 0 : -1,
                                      device ? const_cast<void*>(pointer) : nullptr, nullptr};
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (!pointer) return cudaErrorInvalidValue;
  const size_t rounded = (bytes + ex::kAlignment - 1) / ex::kAlignment * ex::kAlignment;
  void* p = std::aligned_alloc(ex::kAlignment, rounded ? rounded : ex::kAlignment);
  if (!p) return cudaErrorMemoryAllocation;
  ex::Registry& r = ex::registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.device[static_cast<const char*>(p)] = bytes;
  r.device_bytes += bytes;
  *pointer = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (!pointer) return cudaSuccess;
  ex::Registry& r = ex::registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.device.find(static_cast<const char*>(pointer));
    if (it == r.device.end()) return cudaErrorInvalidDevicePointer;
    r.device_bytes -= it->second;
    r.device.erase(it);
  }
  std::free(pointer);
  return cudaSuccess;
}

// Pinned memory is plain host memory.
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned) {
  if (!pointer) return cudaErrorInvalidValue;
  *pointer = std::aligned_alloc(ex::kAlignment, (bytes + ex::kAlignment - 1) / ex::kAlignment * ex::kAlignment);
  return *pointer ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFreeHost(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t) {
  if (bytes && !ex::is_device(pointer)) return cudaErrorInvalidValue;
  ex::record("memset");
  std::memset(pointer, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* pointer, int value, size_t bytes) { return cudaMemsetAsync(pointer, value, bytes); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  const bool to_device = ex::is_device(dst), from_device = ex::is_device(src);
  // The real runtime rejects a direction that contradicts the pointers; so does this one, so
  // that a wrong kind in the backend fails here rather than only on a GPU.
  const bool consistent = kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost
                              ? true
                              : (kind == cudaMemcpyHostToDevice && !from_device && to_device) ||
                                    (kind == cudaMemcpyDeviceToHost && from_device && !to_device) ||
                                    (kind == cudaMemcpyDeviceToDevice && from_device && to_device);
  if (bytes && !consistent) return cudaErrorInvalidValue;
  ex::record(std::string("copy ") + ex::side(src) + "2" + ex::side(dst));
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) {
  *stream = new CUstream_st;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }

cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
  return event && event->recorded ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (!event) return cudaErrorInvalidValue;
  event->recorded = true;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaEventQuery(cudaEvent_t event) { return event ? cudaSuccess : cudaErrorInvalidValue; }

#include "runtime/backends/device/cuda_api.hpp"
#include "runtime/backends/device/raw_memory.hpp"

#include <thread>
#include <utility>

namespace co2::device {

void check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  const std::string message = std::string(what) + ": CUDA error " + std::to_string(int(error)) + " (" +
                              cudaGetErrorString(error) + ")";
  if (error == cudaErrorMemoryAllocation) fail(Status::OutOfMemory, message);
  if (error == cudaErrorInvalidValue || error == cudaErrorInvalidDevice || error == cudaErrorInvalidDevicePointer)
    fail(Status::InvalidArgument, message);
  if (error == cudaErrorNoDevice || error == cudaErrorInsufficientDriver) fail(Status::Unsupported, message);
  fail(Status::Internal, message);
}

int device_count() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) cudaGetLastError();  // clear the sticky-free error for later calls
  return usable_device_count(int(error), count);
}

void use_device(int index) {
  const int count = device_count();
  require(count > 0, Status::Unsupported,
          "CUDA tensors need a usable CUDA device and cudaGetDeviceCount found none on this machine: run where "
          "a GPU and its driver are visible (nvidia-smi lists them), or keep the parameters in host memory "
          "(model.cpu() in torch)");
  require(index >= 0 && index < count, Status::InvalidArgument,
          "device_index " + std::to_string(index) + " is not a CUDA device of this machine (" +
              std::to_string(count) + " found)");
  check(cudaSetDevice(index), "cudaSetDevice");
}

void check_device_memory(const void* data, size_t bytes, int device, const std::string& what) {
  const char* last = static_cast<const char*>(data) + (bytes ? bytes - 1 : 0);
  for (const void* p : {data, static_cast<const void*>(last)}) {
    cudaPointerAttributes attributes{};
    const cudaError_t e = cudaPointerGetAttributes(&attributes, p);
    if (e != cudaSuccess) cudaGetLastError();
    const bool device_memory =
        e == cudaSuccess && (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged);
    require(device_memory && attributes.device == device, Status::InvalidArgument,
            what + " is declared CUDA device " + std::to_string(device) +
                " memory but is not (host memory, another device, or not allocated)");
  }
}

void wait_for_stream(cudaStream_t stream, std::chrono::milliseconds timeout, const char* what) {
  CudaEvent reached;
  reached.record(stream);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reached.done()) {
    require(std::chrono::steady_clock::now() < deadline, Status::Timeout,
            std::string(what) + ": the CUDA stream's work did not finish within " +
                std::to_string(timeout.count()) + " ms (the communicator's timeout): a kernel hangs");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

DeviceMemory::DeviceMemory(size_t bytes, int device, const DeviceAllocator& allocator, cudaStream_t stream)
    : bytes_(bytes), device_(device), allocator_(allocator), stream_(stream) {
  if (bytes == 0) return;
  if (allocator.allocate) {
    data_ = allocator.allocate(allocator.user, bytes, device, stream);
    require(data_ != nullptr, Status::OutOfMemory,
            "the caller's allocator returned NULL for " + std::to_string(bytes) + " bytes");
    check(cudaMemsetAsync(data_, 0, bytes, stream), "cudaMemsetAsync (zeroing device state)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return;
  }
  check(cudaMalloc(&data_, bytes), "cudaMalloc");
  check(cudaMemset(data_, 0, bytes), "cudaMemset (zeroing device state)");
}

DeviceMemory::~DeviceMemory() {
  if (!data_) return;
  if (allocator_.allocate) {
    if (allocator_.release) allocator_.release(allocator_.user, data_, bytes_, device_, stream_);
  } else {
    cudaFree(data_);
  }
}

void DeviceMemory::swap(DeviceMemory& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(bytes_, o.bytes_);
  std::swap(device_, o.device_);
  std::swap(allocator_, o.allocator_);
  std::swap(stream_, o.stream_);
}

PinnedMemory::PinnedMemory(size_t bytes) : bytes_(bytes) {
  if (bytes) check(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault), "cudaHostAlloc (pinned staging)");
}

PinnedMemory::~PinnedMemory() {
  if (data_) cudaFreeHost(data_);
}

CudaStream::CudaStream() { check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"); }
CudaStream::~CudaStream() {
  if (stream_) cudaStreamDestroy(stream_);
}

CudaEvent::CudaEvent() { check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
CudaEvent::~CudaEvent() {
  if (event_) cudaEventDestroy(event_);
}
void CudaEvent::record(cudaStream_t stream) {
  check(cudaEventRecord(event_, stream), "cudaEventRecord");
  recorded_ = true;
}
void CudaEvent::make_wait(cudaStream_t stream) const {
  require(recorded_, Status::Internal, "waiting on an event that was never recorded");
  check(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}
void CudaEvent::synchronize() const {
  if (recorded_) check(cudaEventSynchronize(event_), "cudaEventSynchronize");
}
bool CudaEvent::done() const {
  if (!recorded_) return true;
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery");
  return true;
}

}  // namespace co2::device

namespace co2 {

bool is_cuda_memory(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // an unregistered host pointer is not an error for the next call
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

void stream_waits_for(void* waiter, void* producer) {
  if (waiter == producer) return;
  device::CudaEvent produced;
  produced.record(static_cast<cudaStream_t>(producer));
  produced.make_wait(static_cast<cudaStream_t>(waiter));
}

}  // namespace co2

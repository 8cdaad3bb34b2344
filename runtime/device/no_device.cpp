// Host-only builds: CUDA tensors are refused with a status that says why.
#include "runtime/device/device_path.hpp"
#include "runtime/device/raw_memory.hpp"

namespace co2 {

bool device_path_built() { return false; }

std::unique_ptr<DevicePath> make_device_path(int /*device_index*/) {
  fail(Status::Unsupported,
       "CUDA tensors need a build with the cuda option (this libco2 was built without CUDA)");
}

}  // namespace co2

namespace co2 {

bool is_cuda_memory(const void*) { return false; }

void stream_waits_for(void*, void*) {}

}  // namespace co2

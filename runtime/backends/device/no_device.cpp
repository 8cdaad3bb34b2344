// Host-only builds: CUDA tensors are refused with a status that says why.
#include "runtime/backends/backend.hpp"
#include "runtime/backends/backend_state.hpp"
#include "runtime/backends/device/raw_memory.hpp"
#include "runtime/base/status.hpp"

namespace co2 {

bool device_backend_built() { return false; }

std::unique_ptr<Backend> make_device_backend(BackendState&, int /*device_index*/) {
  fail(Status::Unsupported,
       kBuiltWithoutCuda);
}

bool is_cuda_memory(const void*) { return false; }

void stream_waits_for(void*, void*) {}

}  // namespace co2

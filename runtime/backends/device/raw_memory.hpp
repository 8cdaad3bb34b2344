// What the raw collectives (co2_allreduce, co2_broadcast) need to know of a caller's buffer and
// stream. No CUDA types: capi.cpp compiles without CUDA; cuda_api.cpp implements these in CUDA
// builds, no_device.cpp in host-only builds (where every buffer is host memory).
#pragma once

namespace co2 {

// Whether `p` points into CUDA device (or managed) memory.
bool is_cuda_memory(const void* p);

// Work later enqueued on `waiter` (a cudaStream_t) starts after what `producer` (a cudaStream_t;
// nullptr = the legacy default stream) has enqueued so far. The host does not block.
void stream_waits_for(void* waiter, void* producer);

}  // namespace co2

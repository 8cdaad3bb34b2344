// The engine's device path: what Engine does when its tensors are CUDA memory. The interface has
// no CUDA types, so engine.cpp compiles without CUDA; runtime/device/device_engine.cpp implements
// it (CUDA builds), runtime/device/no_device.cpp refuses (host-only builds).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/device/allocator.hpp"
#include "runtime/engine.hpp"

namespace co2 {

class DevicePath {
 public:
  virtual ~DevicePath() = default;
  // Throws InvalidArgument unless [data, +bytes) is memory of this path's CUDA device.
  virtual void check_device_memory(const void* data, size_t bytes, const std::string& what) = 0;
  // Runtime-owned flat storage on the device, zeroed.
  virtual void* allocate_flat(Engine::State& s, size_t count) = 0;
  // The device half of commit: tables, outer state, broadcast of rank 0's values (blocking).
  virtual void commit(Engine::State& s) = 0;
  // One boundary of the configured algorithm, ordered after the caller's stream's work. Returns
  // false when an average was not finite (nothing applied).
  virtual bool boundary(Engine::State& s, void* stream) = 0;
  virtual void reduce_gradients(Engine::State& s, void* const* grads, size_t num_grads, void* stream) = 0;
  virtual void synchronize(Engine::State& s) = 0;
  virtual void finalize(Engine::State& s) = 0;
  virtual void consensus(Engine::State& s, ConsensusKind kind, float* out, size_t count) = 0;
  virtual void momentum_needed(Engine::State& s) = 0;  // beta became > 0 after commit
  // Folds the reports of boundaries the device finished into the statistics (wait: all of them).
  virtual void fold_reports(Engine::State& s, bool wait) = 0;
  // Waits (bounded) for everything in flight; before the state is freed.
  virtual void drain(Engine::State& s) noexcept = 0;
};

// Whether this build has the device path at all.
bool device_path_built();

// The path for tensors on CUDA device `device_index`. Throws Unsupported without CUDA or
// without a usable device.
std::unique_ptr<DevicePath> make_device_path(int device_index);

}  // namespace co2

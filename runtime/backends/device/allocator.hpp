// The caller-supplied device allocator of co2_engine_set_allocator (co2_allocator_t's callbacks).
#pragma once

#include <cstddef>
#include <cstdint>

namespace co2 {

struct DeviceAllocator {
  void* user = nullptr;
  void* (*allocate)(void* user, size_t bytes, int32_t device_index, void* stream) = nullptr;
  void (*release)(void* user, void* ptr, size_t bytes, int32_t device_index, void* stream) = nullptr;
};

}  // namespace co2

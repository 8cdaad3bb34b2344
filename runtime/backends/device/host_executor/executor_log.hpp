// What the host executor did, in issue order: kernel launches (by the launcher's name), copies
// (by direction), memsets and stream synchronisations, so that a test can compare the device
// path's order of operations with the host backend's plan.
#pragma once

#include <string>
#include <vector>

namespace co2::device::host_executor {

// Appends one operation; thread-safe (the engine's progress thread issues copies too).
void record(const std::string& operation);

// The operations since the last clear().
std::vector<std::string> recorded();
void clear_recorded();

// Bytes of device memory currently allocated (cudaMalloc minus cudaFree).
size_t device_bytes_in_use();

}  // namespace co2::device::host_executor

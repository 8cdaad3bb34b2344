// CO2_HOST_DEVICE marks the element math that CUDA kernels and the host loops share: the host
// tests execute the very functions a kernel runs (docs/architecture.md, "The outer core").
#pragma once

#if defined(__CUDACC__)
#define CO2_HOST_DEVICE __host__ __device__
#else
#define CO2_HOST_DEVICE
#endif

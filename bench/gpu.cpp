// GPU benchmark (scripts/gpu-check.sh runs it; docs/benchmarks.md records the numbers):
//  1. the fused co2 pass (update + momentum + delta: reads p, a, m, c, writes them: 32 B per
//     element) against a device-to-device copy of the same bytes, GB/s, for 16M ... 1G params;
//  2. host time of a boundary co2_engine_step on the collective (NCCL) path, by N;
//  3. co2 step time against compute-only time, with a spin kernel as the "training step".
//     On one GPU this measures the interference of the runtime's work (pass, all-reduce of a
//     group of one) with compute, not communication hiding across GPUs.
//
//   build/bench/gpu_bench [--max-millions 1024] [--repeats 5] [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "runtime/backends/device/kernels.hpp"
#include "runtime/backends/device/selection.hpp"

namespace {

using Clock = std::chrono::steady_clock;
namespace k = co2::device::kernels;

#define CUDA_OK(call)                                                                         \
  do {                                                                                        \
    const cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                        \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#define CO2_OK(call)                                                                          \
  do {                                                                                        \
    const co2_status_t s_ = (call);                                                           \
    if (s_ != CO2_OK) {                                                                       \
      std::fprintf(stderr, "%s: %s: %s\n", #call, co2_status_string(s_), co2_last_error_message()); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

template <typename T>
T* device_alloc(size_t count) {
  T* p = nullptr;
  CUDA_OK(cudaMalloc(&p, count * sizeof(T)));
  CUDA_OK(cudaMemset(p, 0, count * sizeof(T)));
  return p;
}

template <typename F>
float best_ms(int repeats, cudaStream_t stream, F&& f) {
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  float best = 1e30f;
  f();  // warm-up
  for (int r = 0; r < repeats; ++r) {
    CUDA_OK(cudaEventRecord(a, stream));
    f();
    CUDA_OK(cudaEventRecord(b, stream));
    CUDA_OK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return best;
}

void pass_vs_copy(size_t max_millions, int repeats) {
  std::printf("\n1. fused co2 pass vs device-to-device copy of the same bytes (32 B/element)\n");
  std::printf("%12s %10s %10s %10s %10s %8s\n", "params", "pass ms", "pass GB/s", "copy ms", "copy GB/s", "ratio");
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (size_t millions = 16; millions <= max_millions; millions *= 4) {
    const size_t n = millions << 20;
    float* p = device_alloc<float>(n);
    float* a = device_alloc<float>(n);
    float* m = device_alloc<float>(n);
    float* c = device_alloc<float>(n);
    const auto chunks = co2::device::make_chunks({n}, k::kChunkElements);
    k::SegmentEntry seg{p, 0, n, 0, 1, /*dtype fp32*/ 0, 0};
    k::Tables t;
    auto* segs = device_alloc<k::SegmentEntry>(1);
    auto* dchunks = device_alloc<co2::device::Chunk>(chunks.size());
    CUDA_OK(cudaMemcpy(segs, &seg, sizeof seg, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dchunks, chunks.data(), chunks.size() * sizeof(chunks[0]), cudaMemcpyHostToDevice));
    t.segments = segs;
    t.num_segments = 1;
    t.chunks = dchunks;
    t.num_chunks = uint32_t(chunks.size());
    t.anchor = a;
    t.momentum = m;
    t.comm = c;
    t.chunk_squares = device_alloc<double>(chunks.size());
    t.chunk_clamped = device_alloc<unsigned int>(chunks.size());
    t.coefficients = device_alloc<k::SegmentCoefficients>(1);
    t.gap = device_alloc<k::GapState>(1);
    int* flags = device_alloc<int>(2);
    t.average_nonfinite = flags;
    t.delta_nonfinite = flags + 1;
    t.report = device_alloc<k::Report>(1);
    k::Config config;
    config.alpha = 0.7f;
    config.beta = 0.9f;
    config.momentum = true;
    config.update_requested = true;
    config.write_delta = true;
    CUDA_OK(cudaError_t(k::coefficients(t, config, stream)));
    const float pass = best_ms(repeats, stream, [&] { CUDA_OK(cudaError_t(k::boundary_pass(t, config, stream))); });
    // Four copies of one array each: 16 B/element read, 16 written, like the pass.
    const float copy = best_ms(repeats, stream, [&] {
      CUDA_OK(cudaMemcpyAsync(m, p, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaMemcpyAsync(c, a, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaMemcpyAsync(p, m, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
      CUDA_OK(cudaMemcpyAsync(a, c, n * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    });
    const double bytes = 32.0 * double(n);
    std::printf("%11zuM %10.3f %10.1f %10.3f %10.1f %8.2f\n", millions, pass, bytes / pass / 1e6, copy,
                bytes / copy / 1e6, copy / pass);
    for (void* x : std::vector<void*>{p, a, m, c, segs, dchunks, t.chunk_squares, t.chunk_clamped, t.coefficients,
                                      t.gap, flags, t.report})
      cudaFree(x);
  }
  cudaStreamDestroy(stream);
}

co2_comm_t make_comm(const char* group, bool* nccl) {
  co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
  cc.transport = CO2_TRANSPORT_NCCL;
  cc.group_name = group;
  co2_comm_t comm = nullptr;
  if (co2_comm_create(&cc, &comm) == CO2_OK) {
    *nccl = true;
    return comm;
  }
  std::printf("(NCCL unavailable: %s; the staged path over the local transport is measured)\n",
              co2_last_error_message());
  cc.transport = CO2_TRANSPORT_LOCAL;
  CO2_OK(co2_comm_create(&cc, &comm));
  *nccl = false;
  return comm;
}

co2_engine_t make_engine(co2_comm_t comm, size_t n, uint32_t tau) {
  co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
  ec.tau = tau;
  ec.outer_momentum = 0.9;
  ec.anchor_check_interval = 0;  // the check blocks the host: measured without it
  co2_engine_t engine = nullptr;
  CO2_OK(co2_engine_create(comm, &ec, &engine));
  void* flat = nullptr;
  CO2_OK(co2_engine_alloc_flat(engine, n, CO2_DTYPE_FP32, CO2_DEVICE_CUDA, 0, &flat));
  co2_segment_t seg = CO2_SEGMENT_INIT;
  seg.name = "all";
  seg.count = n;
  CO2_OK(co2_engine_add_segment(engine, &seg));
  CO2_OK(co2_engine_commit(engine));
  return engine;
}

void boundary_host_time(size_t max_millions) {
  std::printf("\n2. host time of a boundary co2_engine_step (tau = 1, median of 20)\n");
  bool nccl = false;
  co2_comm_t comm = make_comm("bench-boundary", &nccl);
  std::printf("%12s %14s %10s\n", "params", "path", "host us");
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  for (size_t millions = 16; millions <= max_millions; millions *= 4) {
    const size_t n = millions << 20;
    co2_engine_t engine = make_engine(comm, n, 1);
    std::vector<double> us;
    for (int i = 0; i < 22; ++i) {
      const auto start = Clock::now();
      CO2_OK(co2_engine_step(engine, stream, nullptr));
      const double t = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (i >= 2) us.push_back(t);  // the first two fill the pipeline
      CUDA_OK(cudaStreamSynchronize(stream));
    }
    std::sort(us.begin(), us.end());
    std::printf("%11zuM %14s %10.1f\n", millions, nccl ? "nccl" : "staged", us[us.size() / 2]);
    CO2_OK(co2_engine_finalize(engine));
    CO2_OK(co2_engine_destroy(engine));
  }
  cudaStreamDestroy(stream);
  CO2_OK(co2_comm_destroy(comm));
}

void overlap(size_t millions, int tau, double step_ms, int rounds) {
  std::printf("\n3. co2 vs compute only: %zuM params, tau = %d, synthetic step %.1f ms, %d rounds\n", millions, tau,
              step_ms, rounds);
  std::printf("   one GPU: this is the interference of the runtime's work with compute, not hiding of\n"
              "   inter-GPU communication (a group of one all-reduces nothing over a network)\n");
  bool nccl = false;
  co2_comm_t comm = make_comm("bench-overlap", &nccl);
  const size_t n = millions << 20;
  co2_engine_t engine = make_engine(comm, n, uint32_t(tau));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const uint64_t ns = uint64_t(step_ms * 1e6);
  auto timed = [&](bool with_engine) {
    CUDA_OK(cudaStreamSynchronize(stream));
    const auto start = Clock::now();
    for (int s = 0; s < rounds * tau; ++s) {
      CUDA_OK(cudaError_t(k::spin(ns, stream)));
      if (with_engine) CO2_OK(co2_engine_step(engine, stream, nullptr));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  timed(true);  // warm-up: fills the co2 pipeline
  const double compute = timed(false);
  const double co2 = timed(true);
  std::printf("%14s %14s %12s %12s\n", "path", "compute ms", "co2 ms", "throughput");
  std::printf("%14s %14.1f %12.1f %11.1f%%\n", nccl ? "nccl" : "staged", compute, co2, 100.0 * compute / co2);
  CO2_OK(co2_engine_finalize(engine));
  CO2_OK(co2_engine_destroy(engine));
  cudaStreamDestroy(stream);
  CO2_OK(co2_comm_destroy(comm));
}

}  // namespace

int main(int argc, char** argv) {
  size_t max_millions = 1024;
  int repeats = 5;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--max-millions") && i + 1 < argc) max_millions = std::strtoull(argv[++i], nullptr, 10);
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else {
      std::fprintf(stderr, "usage: %s [--max-millions N] [--repeats R] [--quick]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (co2::device::usable_device_count(int(e), count) == 0) {
    std::printf("no usable CUDA device (%s): nothing to measure\n", cudaGetErrorString(e));
    return 77;
  }
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device 0: %s, %.0f GiB, driver API %d, runtime %d\n", prop.name, double(prop.totalGlobalMem) / (1 << 30),
              driver, runtime);
  CUDA_OK(cudaSetDevice(0));
  pass_vs_copy(max_millions, repeats);
  boundary_host_time(quick ? 64 : std::min<size_t>(max_millions, 1024));
  overlap(quick ? 64 : 256, 12, 20.0, quick ? 3 : 5);
  return 0;
}

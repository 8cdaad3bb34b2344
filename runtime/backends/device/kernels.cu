// The boundary's kernels. Deterministic reductions: a chunk's partial sum is a fixed tree over a
// fixed thread layout (kThreads threads, kPerThread elements each, strided), and a segment's
// partials are folded in chunk order by one thread, so norms depend only on segment sizes.
#include <cuda_runtime.h>

#include <type_traits>

#include "runtime/outer/boundary_pass.hpp"
#include "runtime/backends/device/kernel_math.hpp"
#include "runtime/backends/device/kernels.hpp"
#include "runtime/backends/device/state_checksum.hpp"

namespace co2::device::kernels {
namespace {

// Fixed-shape tree reduction of one double per thread; thread 0 gets the sum.
__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    tree_level(shared, stride, int(threadIdx.x));
    __syncthreads();
  }
  return shared[0];
}

__global__ void finite_kernel(const float* x, size_t n, int* flag) {
  float probe = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    probe += finite_probe(x[i]);
  if (probe != 0.0f) atomicExch(flag, 1);
}

__global__ void checksum_kernel(const uint32_t* words, size_t n, unsigned long long* out) {
  unsigned long long sum = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    sum += checksum_term(words[i], i);
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, sum);  // modulo 2^64: any order gives the same sum
}

__global__ void lambda_kernel(Tables t, Config c) {
  const bool update = update_happens(c, t.average_nonfinite);
  for (uint32_t s = blockIdx.x * blockDim.x + threadIdx.x; s < t.num_segments; s += gridDim.x * blockDim.x)
    segment_lambda(t, c, update, s);
}

__global__ void candidate_squares_kernel(Tables t, Config c) {
  __shared__ double shared[kThreads];
  const Chunk ch = t.chunks[blockIdx.x];
  double sum = 0.0;
  if (t.segments[ch.segment].is_parameter && update_happens(c, t.average_nonfinite)) {
    for (int j = 0; j < kPerThread; ++j) {
      const uint32_t i = chunk_element(threadIdx.x, j);
      if (i < ch.count) sum += candidate_square(t, c, ch, i);
    }
  }
  const double total = block_sum(sum, shared);
  if (threadIdx.x == 0) t.chunk_squares[blockIdx.x] = total;
}

__global__ void norm_scale_kernel(Tables t, Config c) {
  if (!update_happens(c, t.average_nonfinite)) return;
  for (uint32_t s = blockIdx.x * blockDim.x + threadIdx.x; s < t.num_segments; s += gridDim.x * blockDim.x)
    segment_norm_scale(t, c, s);
}

// One block per chunk; a block that finds the flag already set has nothing left to decide.
__global__ void update_probe_kernel(Tables t, Config c) {
  if (!update_happens(c, t.average_nonfinite)) return;
  const Chunk ch = t.chunks[blockIdx.x];
  const bool value_clip = t.segments[ch.segment].is_parameter && c.clip == 1;
  float probe = 0.0f;
  with_param_type(t.segments[ch.segment].dtype, [&](auto* type) {
    using P = std::remove_pointer_t<decltype(type)>;
    probe = value_clip ? probe_thread_results<true, P>(t, c, ch, threadIdx.x)
                       : probe_thread_results<false, P>(t, c, ch, threadIdx.x);
  });
  if (probe != 0.0f) atomicExch(t.average_nonfinite, 1);
}

// kFull: the chunk has all kChunkElements elements, so the loop needs no bounds check.
template <bool kValueClip, bool kFull, typename P>
__device__ void pass_chunk(const Tables& t, const Config& c, bool update, const Chunk& ch,
                           const SegmentEntry& seg, double* step_squares, uint32_t* clamped, float* probe) {
  const OuterCoefficients k = coefficients_of(c, seg, t.coefficients[ch.segment]);
  const ChunkBuffers<P> buffers = chunk_buffers<P>(t, c, ch, seg);  // distinct: the layout rejects overlaps
  // Batches of kBatch elements per thread: every load of a batch is issued before its stores,
  // so each thread keeps several cache lines in flight (the pass is memory-bound).
  constexpr int kBatch = 4;
  static_assert(kPerThread % kBatch == 0, "whole batches");
#pragma unroll
  for (int j0 = 0; j0 < kPerThread; j0 += kBatch) {
    ElementInputs<P> x[kBatch];
    bool in[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const uint32_t i = chunk_element(threadIdx.x, j0 + b);
      in[b] = kFull || i < ch.count;
      if (in[b]) x[b] = load_element(buffers, c, update, i);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (!in[b]) continue;
      const uint32_t i = chunk_element(threadIdx.x, j0 + b);
      const PassResult r = pass_loaded<kValueClip>(c, k, update, seg.is_parameter, x[b], clamped);
      store_element(buffers, c, update, i, r, step_squares, probe);
    }
  }
}

__global__ void pass_kernel(Tables t, Config c) {
  __shared__ double shared[kThreads];
  const Chunk ch = t.chunks[blockIdx.x];
  const SegmentEntry seg = t.segments[ch.segment];
  const bool update = update_happens(c, t.average_nonfinite);
  double squares = 0.0;
  uint32_t clamped = 0;
  float probe = 0.0f;
  const bool value_clip = seg.is_parameter && c.clip == 1;
  const bool full = ch.count == kChunkElements;
  with_param_type(seg.dtype, [&](auto* type) {
    using P = std::remove_pointer_t<decltype(type)>;
    if (value_clip && full)
      pass_chunk<true, true, P>(t, c, update, ch, seg, &squares, &clamped, &probe);
    else if (value_clip)
      pass_chunk<true, false, P>(t, c, update, ch, seg, &squares, &clamped, &probe);
    else if (full)
      pass_chunk<false, true, P>(t, c, update, ch, seg, &squares, &clamped, &probe);
    else
      pass_chunk<false, false, P>(t, c, update, ch, seg, &squares, &clamped, &probe);
  });
  if (probe != 0.0f) atomicExch(t.delta_nonfinite, 1);
  const double total = block_sum(squares, shared);
  if (threadIdx.x == 0) t.chunk_squares[blockIdx.x] = total;
  __syncthreads();
  const double clamps = block_sum(double(clamped), shared);  // exact: counts below 2^53
  if (threadIdx.x == 0) t.chunk_clamped[blockIdx.x] = (unsigned int)clamps;
}

// Eager policy: a rank whose delta was not finite restarts from the anchor without offsets.
__global__ void eager_restart_kernel(Tables t) {
  if (*t.delta_nonfinite == 0) return;
  const Chunk ch = t.chunks[blockIdx.x];
  if (!t.segments[ch.segment].is_parameter) return;
  with_param_type(t.segments[ch.segment].dtype, [&](auto* type) {
    using P = std::remove_pointer_t<decltype(type)>;
    for (int j = 0; j < kPerThread; ++j) {
      const uint32_t i = chunk_element(threadIdx.x, j);
      if (i < ch.count) eager_restart_element<P>(t, ch, i);
    }
  });
}

// One block: per segment the step norm (gap history) and the report, folded in a fixed order.
__global__ void fold_kernel(Tables t, Config c) {
  __shared__ UpdateSummary partials[kFoldThreads];
  const bool update = update_happens(c, t.average_nonfinite);
  UpdateSummary mine = empty_summary();
  for (uint32_t s = threadIdx.x; s < t.num_segments; s += kFoldThreads)
    if (update && t.segments[s].is_parameter) fold_segment(t, c, s, &mine);
  partials[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x == 0) *t.report = fold_report(t, c, update, partials, kFoldThreads);
}

template <typename P>
__global__ void widen_kernel(const P* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = widen(src[i]);
}

template <typename P>
__global__ void narrow_kernel(const float* src, P* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = narrow<P>(src[i]);
}

unsigned grid_of(size_t n) {
  const size_t blocks = (n + 1023) / 1024;
  return unsigned(blocks < 4096 ? blocks : 4096);
}

__global__ void spin_kernel(unsigned long long nanoseconds) {
  const unsigned long long start = clock64();
  // globaltimer is in ns; clock64 keeps the loop busy if it is coarse.
  unsigned long long t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  unsigned long long now = t0;
  while (now - t0 < nanoseconds) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (clock64() - start > (1ull << 62)) break;
  }
}

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

}  // namespace

int finite_check(const float* data, size_t n, int* flag, void* stream) {
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof(int), as_stream(stream));
  if (e != cudaSuccess || n == 0) return int(e);
  const size_t blocks = (n + 1023) / 1024;
  finite_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0, as_stream(stream)>>>(data, n, flag);
  return int(cudaGetLastError());
}

int checksum(const float* data, size_t n, unsigned long long* out, void* stream) {
  cudaError_t e = cudaMemsetAsync(out, 0, sizeof(unsigned long long), as_stream(stream));
  if (e != cudaSuccess || n == 0) return int(e);
  const size_t blocks = (n + 1023) / 1024;
  checksum_kernel<<<unsigned(blocks < 4096 ? blocks : 4096), 256, 0, as_stream(stream)>>>(
      reinterpret_cast<const uint32_t*>(data), n, out);
  return int(cudaGetLastError());
}

int coefficients(const Tables& t, const Config& c, void* stream) {
  if (t.num_segments == 0) return 0;
  const unsigned segment_blocks = (t.num_segments + 255) / 256;
  lambda_kernel<<<segment_blocks, 256, 0, as_stream(stream)>>>(t, c);
  if (c.clip == 2 && c.update_requested) {
    candidate_squares_kernel<<<t.num_chunks, kThreads, 0, as_stream(stream)>>>(t, c);
    norm_scale_kernel<<<segment_blocks, 256, 0, as_stream(stream)>>>(t, c);
  }
  return int(cudaGetLastError());
}

int update_result_probe(const Tables& t, const Config& c, void* stream) {
  if (t.num_chunks == 0) return 0;
  update_probe_kernel<<<t.num_chunks, kThreads, 0, as_stream(stream)>>>(t, probe_config(c));
  return int(cudaGetLastError());
}

int boundary_pass(const Tables& t, const Config& c, void* stream) {
  if (t.num_chunks == 0) return 0;
  cudaError_t e = cudaMemsetAsync(t.delta_nonfinite, 0, sizeof(int), as_stream(stream));
  if (e != cudaSuccess) return int(e);
  pass_kernel<<<t.num_chunks, kThreads, 0, as_stream(stream)>>>(t, c);
  if (c.eager) eager_restart_kernel<<<t.num_chunks, kThreads, 0, as_stream(stream)>>>(t);
  fold_kernel<<<1, kFoldThreads, 0, as_stream(stream)>>>(t, c);
  return int(cudaGetLastError());
}

// Host launchers dispatch by hand: a host lambda must not pass through with_param_type, which is
// CO2_HOST_DEVICE.
template <typename P>
void launch_widen(const void* src, float* dst, size_t n, void* stream) {
  widen_kernel<P><<<grid_of(n), 256, 0, as_stream(stream)>>>(static_cast<const P*>(src), dst, n);
}

template <typename P>
void launch_narrow(const float* src, void* dst, size_t n, void* stream) {
  narrow_kernel<P><<<grid_of(n), 256, 0, as_stream(stream)>>>(src, static_cast<P*>(dst), n);
}

int widen_params(const void* src, uint32_t dtype, float* dst, size_t n, void* stream) {
  if (n == 0) return 0;
  if (dtype == 1)
    launch_widen<Bf16>(src, dst, n, stream);
  else if (dtype == 2)
    launch_widen<Fp16>(src, dst, n, stream);
  else
    launch_widen<float>(src, dst, n, stream);
  return int(cudaGetLastError());
}

int narrow_params(const float* src, void* dst, uint32_t dtype, size_t n, void* stream) {
  if (n == 0) return 0;
  if (dtype == 1)
    launch_narrow<Bf16>(src, dst, n, stream);
  else if (dtype == 2)
    launch_narrow<Fp16>(src, dst, n, stream);
  else
    launch_narrow<float>(src, dst, n, stream);
  return int(cudaGetLastError());
}

int spin(uint64_t nanoseconds, void* stream) {
  spin_kernel<<<1, 1, 0, as_stream(stream)>>>((unsigned long long)nanoseconds);
  return int(cudaGetLastError());
}

}  // namespace co2::device::kernels

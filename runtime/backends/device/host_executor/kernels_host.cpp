// The launchers of runtime/backends/device/kernels.hpp on the host executor: the same CO2_HOST_DEVICE
// functions as kernels.cu (kernel_math.hpp), run for each block and thread in turn, with the
// kernels' reductions replayed in their fixed order, so the results equal the kernels'.
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#include "runtime/backends/device/host_executor/executor_log.hpp"
#include "runtime/backends/device/kernel_math.hpp"
#include "runtime/backends/device/kernels.hpp"
#include "runtime/backends/device/state_checksum.hpp"

namespace co2::device::kernels {
namespace {

// block_sum of kernels.cu: the per-thread partials folded by the same tree.
double block_sum(double* partials) {
  for (int stride = kThreads / 2; stride > 0; stride /= 2)
    for (int thread = 0; thread < kThreads; ++thread) tree_level(partials, stride, thread);
  return partials[0];
}

template <bool kValueClip, typename P>
void pass_chunk(const Tables& t, const Config& c, bool update, uint32_t chunk, double* step_squares,
                double* clamped, float* probe) {
  const Chunk ch = t.chunks[chunk];
  const SegmentEntry seg = t.segments[ch.segment];
  const OuterCoefficients k = coefficients_of(c, seg, t.coefficients[ch.segment]);
  const ChunkBuffers<P> buffers = chunk_buffers<P>(t, c, ch, seg);
  for (int thread = 0; thread < kThreads; ++thread) {
    uint32_t thread_clamped = 0;
    for (int j = 0; j < kPerThread; ++j) {
      const uint32_t i = chunk_element(uint32_t(thread), j);
      if (i >= ch.count) continue;
      const PassResult r =
          pass_loaded<kValueClip>(c, k, update, seg.is_parameter, load_element(buffers, c, update, i), &thread_clamped);
      store_element(buffers, c, update, i, r, &step_squares[thread], probe);
    }
    clamped[thread] = double(thread_clamped);
  }
}

}  // namespace

int finite_check(const float* data, size_t n, int* flag, void*) {
  host_executor::record("kernel finite_check");
  float probe = 0.0f;
  for (size_t i = 0; i < n; ++i) probe += finite_probe(data[i]);
  *flag = probe != 0.0f;
  return 0;
}

int checksum(const float* data, size_t n, unsigned long long* out, void*) {
  host_executor::record("kernel checksum");
  *out = state_checksum(data, n);  // modulo 2^64, so the kernel's any-order sum is this one
  return 0;
}

int coefficients(const Tables& t, const Config& c, void*) {
  if (t.num_segments == 0) return 0;
  host_executor::record("kernel lambda");
  const bool update = update_happens(c, t.average_nonfinite);
  for (uint32_t s = 0; s < t.num_segments; ++s) segment_lambda(t, c, update, s);
  if (c.clip == 2 && c.update_requested) {
    host_executor::record("kernel candidate_squares");
    for (uint32_t chunk = 0; chunk < t.num_chunks; ++chunk) {
      const Chunk ch = t.chunks[chunk];
      double partials[kThreads] = {};
      if (t.segments[ch.segment].is_parameter && update)
        for (int thread = 0; thread < kThreads; ++thread)
          for (int j = 0; j < kPerThread; ++j) {
            const uint32_t i = chunk_element(uint32_t(thread), j);
            if (i < ch.count) partials[thread] += candidate_square(t, c, ch, i);
          }
      t.chunk_squares[chunk] = block_sum(partials);
    }
    host_executor::record("kernel norm_scale");
    if (update)
      for (uint32_t s = 0; s < t.num_segments; ++s) segment_norm_scale(t, c, s);
  }
  return 0;
}

int update_result_probe(const Tables& t, const Config& c, void*) {
  if (t.num_chunks == 0) return 0;
  host_executor::record("kernel update_probe");
  const Config probe_c = probe_config(c);
  for (uint32_t chunk = 0; chunk < t.num_chunks && update_happens(probe_c, t.average_nonfinite); ++chunk) {
    const Chunk ch = t.chunks[chunk];
    const bool value_clip = t.segments[ch.segment].is_parameter && c.clip == 1;
    float probe = 0.0f;
    with_param_type(t.segments[ch.segment].dtype, [&](auto* type) {
      using P = std::remove_pointer_t<decltype(type)>;
      for (uint32_t thread = 0; thread < uint32_t(kThreads); ++thread)
        probe += value_clip ? probe_thread_results<true, P>(t, probe_c, ch, thread)
                            : probe_thread_results<false, P>(t, probe_c, ch, thread);
    });
    if (probe != 0.0f) *t.average_nonfinite = 1;
  }
  return 0;
}

int boundary_pass(const Tables& t, const Config& c, void*) {
  if (t.num_chunks == 0) return 0;
  host_executor::record("kernel pass");
  const bool update = update_happens(c, t.average_nonfinite);
  float probe = 0.0f;
  for (uint32_t chunk = 0; chunk < t.num_chunks; ++chunk) {
    double squares[kThreads] = {}, clamped[kThreads] = {};
    const SegmentEntry& seg = t.segments[t.chunks[chunk].segment];
    with_param_type(seg.dtype, [&](auto* type) {
      using P = std::remove_pointer_t<decltype(type)>;
      if (seg.is_parameter && c.clip == 1)
        pass_chunk<true, P>(t, c, update, chunk, squares, clamped, &probe);
      else
        pass_chunk<false, P>(t, c, update, chunk, squares, clamped, &probe);
    });
    t.chunk_squares[chunk] = block_sum(squares);
    t.chunk_clamped[chunk] = (unsigned int)block_sum(clamped);
  }
  const bool delta_nonfinite = probe != 0.0f;
  *t.delta_nonfinite = delta_nonfinite;
  if (c.eager) {
    host_executor::record("kernel eager_restart");
    for (uint32_t chunk = 0; chunk < t.num_chunks && delta_nonfinite; ++chunk) {
      const Chunk ch = t.chunks[chunk];
      if (!t.segments[ch.segment].is_parameter) continue;
      with_param_type(t.segments[ch.segment].dtype, [&](auto* type) {
        using P = std::remove_pointer_t<decltype(type)>;
        for (uint32_t i = 0; i < ch.count; ++i) eager_restart_element<P>(t, ch, i);
      });
    }
  }
  host_executor::record("kernel fold");
  UpdateSummary partials[kFoldThreads];
  for (int thread = 0; thread < kFoldThreads; ++thread) {
    partials[thread] = empty_summary();
    for (uint32_t s = uint32_t(thread); s < t.num_segments; s += kFoldThreads)
      if (update && t.segments[s].is_parameter) fold_segment(t, c, s, &partials[thread]);
  }
  *t.report = fold_report(t, c, update, partials, kFoldThreads);
  return 0;
}

int widen_params(const void* src, uint32_t dtype, float* dst, size_t n, void*) {
  host_executor::record("kernel widen");
  with_param_type(dtype, [&](auto* type) {
    using P = std::remove_pointer_t<decltype(type)>;
    for (size_t i = 0; i < n; ++i) dst[i] = widen(static_cast<const P*>(src)[i]);
  });
  return 0;
}

int narrow_params(const float* src, void* dst, uint32_t dtype, size_t n, void*) {
  host_executor::record("kernel narrow");
  with_param_type(dtype, [&](auto* type) {
    using P = std::remove_pointer_t<decltype(type)>;
    for (size_t i = 0; i < n; ++i) static_cast<P*>(dst)[i] = narrow<P>(src[i]);
  });
  return 0;
}

int spin(uint64_t nanoseconds, void*) {
  host_executor::record("kernel spin");
  std::this_thread::sleep_for(std::chrono::nanoseconds(nanoseconds));
  return 0;
}

}  // namespace co2::device::kernels

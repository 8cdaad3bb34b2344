// The per-element, per-segment and per-chunk work of the boundary kernels, as CO2_HOST_DEVICE
// functions: kernels.cu keeps only thread indexing and reductions around them, and the host
// executor (runtime/backends/device/host_executor/) runs the same functions in the same summation order,
// so the device path is exercised on machines without a GPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/outer/boundary_pass.hpp"
#include "runtime/backends/device/kernels.hpp"
#include "runtime/base/host_device.hpp"

namespace co2::device::kernels {

// The fixed thread layout of a chunk; the norms' summation order depends on it.
constexpr int kThreads = 256;
constexpr int kPerThread = int(kChunkElements) / kThreads;
constexpr int kFoldThreads = 256;
static_assert(kPerThread * kThreads == int(kChunkElements), "chunk = threads x elements per thread");

// Element j of thread `thread` inside a chunk (strided, so that a warp's loads coalesce).
CO2_HOST_DEVICE inline uint32_t chunk_element(uint32_t thread, int j) { return thread + uint32_t(j) * kThreads; }

CO2_HOST_DEVICE inline bool update_happens(const Config& c, const int* average_nonfinite) {
  return c.update_requested && *average_nonfinite == 0;
}

// The segments' chunks are [first_chunk, the next segment's first_chunk).
CO2_HOST_DEVICE inline uint32_t end_chunk(const Tables& t, uint32_t s) {
  return s + 1 < t.num_segments ? t.segments[s + 1].first_chunk : t.num_chunks;
}

CO2_HOST_DEVICE inline OuterCoefficients coefficients_of(const Config& c, const SegmentEntry& seg,
                                                         const SegmentCoefficients& sc) {
  return update_coefficients_of(seg.is_parameter, anchor_weight_of(c.buffer_values, seg.is_parameter), c.alpha, c.beta,
                                c.clip_threshold, sc.lambda, sc.norm_scale);
}

// Segment s's staleness penalty, and the gap history the update leaves once applied (kept in
// its coefficients: fold_segment commits it, so a refused update leaves t.gap as it was).
CO2_HOST_DEVICE inline void segment_lambda(const Tables& t, const Config& c, bool update, uint32_t s) {
  double lambda = 1.0;
  GapState after = t.gap[s];
  if (update && t.segments[s].is_parameter) {
    uint64_t updates = after.updates;
    lambda = penalty_lambda(c.penalty, c.penalty_constant, after.last_step_norm, &after.gap_sum, &updates);
    after.updates = updates;
  }
  t.coefficients[s] = SegmentCoefficients{lambda, 1.0, after};
}

// Norm clipping: one element's (beta*m + lambda*c)^2, element i of chunk ch.
CO2_HOST_DEVICE inline double candidate_square(const Tables& t, const Config& c, const Chunk& ch, uint32_t i) {
  const SegmentEntry& seg = t.segments[ch.segment];
  const OuterCoefficients k = coefficients_of(c, seg, t.coefficients[ch.segment]);
  const uint64_t at = seg.state_offset + ch.begin + i;
  const float u = momentum_candidate(t.momentum ? t.momentum[at] : 0.0f, t.comm[at], k);
  return double(u) * double(u);
}

// Norm clipping: segment s's scale from its chunks' sums of squares, folded in chunk order.
CO2_HOST_DEVICE inline void segment_norm_scale(const Tables& t, const Config& c, uint32_t s) {
  if (!t.segments[s].is_parameter) return;
  double sum = 0.0;
  for (uint32_t k = t.segments[s].first_chunk; k < end_chunk(t, s); ++k) sum += t.chunk_squares[k];
  t.coefficients[s].norm_scale = norm_clip_scale(sum, c.clip_threshold);
}

// One element of the fused pass: the outer update (when `update`) and the delta (when
// c.write_delta), from the loaded anchor, parameter, momentum and average values, and under the
// eager policy (c.eager, PARAMETER segments) from the rank's offset e and its filter q.
struct PassResult {
  float anchor;    // the new anchor
  float momentum;  // the new momentum (when the segment has one and update)
  float delta;     // the comm buffer's new value (when write_delta)
  float step;      // the outer step (its square goes into the step norm)
  float param;     // the new parameter: the new anchor, plus the new offset when eager
  float offset;    // eager: the new e
  float filtered;  // eager: the new q
};

// `param` is the parameter as stored (P): the delta starts from the start rounded as P held it.
template <bool kValueClip, typename P>
CO2_HOST_DEVICE inline PassResult pass_element(const Config& c, const OuterCoefficients& k, bool update, bool is_parameter,
                                               float anchor_old, P param, float momentum, float average,
                                               float offset, float filtered, uint32_t* clamped) {
  const float base_value = anchor_base(anchor_old, k);
  PassResult r{anchor_old, momentum, 0.0f, 0.0f, anchor_old, offset, filtered};
  if (update) {
    r.momentum = clip_momentum<kValueClip>(momentum_candidate(momentum, average, k), k, clamped);
    r.step = is_parameter && c.nesterov ? outer_step<true>(r.momentum, average, k)
                                        : outer_step<false>(r.momentum, average, k);
    r.anchor = next_anchor(base_value, r.step, k);
  }
  r.param = r.anchor;
  if (c.keep_progress) {
    const bool offset_kept = c.eager && is_parameter;
    r.param = position_on_arrival(r.anchor, offset_kept ? round_start(anchor_old, offset) : anchor_old, param);
    if (offset_kept) r.offset = 0.0f;
  } else if (c.eager && c.write_delta && is_parameter) {
    // The rank trained from anchor + e (PARAMETER: anchor weight 1).
    r.delta = delta_element(round_start(anchor_old, offset), param);
    r.filtered = eager_filtered(r.delta, c.eager_coefficients.momentum ? filtered : 0.0f, c.eager_coefficients);
    r.offset = eager_offset(r.delta, r.filtered, c.eager_coefficients);
    r.param = round_start(r.anchor, r.offset);
  } else if (c.write_delta) {
    r.delta = delta_element(base_value, param);
  }
  return r;
}

// The buffers one chunk of the fused pass reads and writes, from the chunk's first element: null
// where the pass leaves them (momentum in segments without one; e and q outside the eager policy).
template <typename P>
struct ChunkBuffers {
  P* params;
  float* anchor;
  float* momentum;
  float* comm;
  float* offset;
  float* filtered;
};

template <typename P>
CO2_HOST_DEVICE inline ChunkBuffers<P> chunk_buffers(const Tables& t, const Config& c, const Chunk& ch,
                                                     const SegmentEntry& seg) {
  const size_t base = seg.state_offset + ch.begin;
  const bool eager = c.eager && seg.is_parameter;
  return ChunkBuffers<P>{static_cast<P*>(seg.params) + ch.begin,
                         t.anchor + base,
                         seg.is_parameter && c.momentum ? t.momentum + base : nullptr,
                         t.comm + base,
                         eager ? t.eager_offset + base : nullptr,
                         eager && t.eager_momentum ? t.eager_momentum + base : nullptr};
}

// Element i's values as pass_element takes them (zero where the pass does not read them).
template <typename P>
struct ElementInputs {
  float anchor = 0.0f;
  P param{};
  float momentum = 0.0f, average = 0.0f, offset = 0.0f, filtered = 0.0f;
};

template <typename P>
CO2_HOST_DEVICE inline ElementInputs<P> load_element(const ChunkBuffers<P>& b, const Config& c, bool update,
                                                     uint32_t i) {
  ElementInputs<P> x;
  x.anchor = b.anchor[i];
  if (c.write_delta || c.keep_progress) x.param = b.params[i];
  if (update) x.average = b.comm[i];
  if (update && b.momentum) x.momentum = b.momentum[i];
  if (b.offset) x.offset = b.offset[i];
  if (b.filtered) x.filtered = b.filtered[i];
  return x;
}

template <bool kValueClip, typename P>
CO2_HOST_DEVICE inline PassResult pass_loaded(const Config& c, const OuterCoefficients& k, bool update,
                                              bool is_parameter, const ElementInputs<P>& x, uint32_t* clamped) {
  return pass_element<kValueClip>(c, k, update, is_parameter, x.anchor, x.param, x.momentum, x.average, x.offset,
                                  x.filtered, clamped);
}

// Element i's results stored; the step's square added to *step_squares and the delta's finite
// probe to *probe (not zero once a delta is not finite).
template <typename P>
CO2_HOST_DEVICE inline void store_element(const ChunkBuffers<P>& b, const Config& c, bool update, uint32_t i,
                                          const PassResult& r, double* step_squares, float* probe) {
  if (update) {
    if (b.momentum) b.momentum[i] = r.momentum;
    b.anchor[i] = r.anchor;
    *step_squares += double(r.step) * double(r.step);
  }
  if (c.write_delta) {
    *probe += finite_probe(r.delta);
    b.comm[i] = r.delta;
  }
  if (b.offset) b.offset[i] = r.offset;
  if (b.filtered) b.filtered[i] = r.filtered;
  b.params[i] = narrow<P>(r.param);
}

// The update-result probe's view of a requested update: only the update (no delta, no eager
// correction), so that it reads a, m and c alone.
CO2_HOST_DEVICE inline Config probe_config(const Config& update) {
  Config c = update;
  c.write_delta = false;
  c.eager = false;
  c.keep_progress = false;
  return c;
}

// One thread's elements of chunk ch under the probe (c = probe_config(...)): the new anchor and,
// where stored, the new momentum as pass_element computes them; not zero once one is not finite.
template <bool kValueClip, typename P>
CO2_HOST_DEVICE inline float probe_thread_results(const Tables& t, const Config& c, const Chunk& ch, uint32_t thread) {
  const SegmentEntry& seg = t.segments[ch.segment];
  const OuterCoefficients k = coefficients_of(c, seg, t.coefficients[ch.segment]);
  const ChunkBuffers<P> b = chunk_buffers<P>(t, c, ch, seg);
  float probe = 0.0f;
  uint32_t clamped = 0;  // the pass that applies the update counts the clamps
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t i = chunk_element(thread, j);
    if (i >= ch.count) continue;
    const PassResult r =
        pass_loaded<kValueClip>(c, k, /*update=*/true, seg.is_parameter, load_element(b, c, true, i), &clamped);
    probe += finite_probe(r.anchor);
    if (b.momentum) probe += finite_probe(r.momentum);
  }
  return probe;
}

// Segment s's gap history committed (its coefficients' history after this update, with this
// update's step norm), and its share of the report into a thread's partial summary.
CO2_HOST_DEVICE inline void fold_segment(const Tables& t, const Config& c, uint32_t s, UpdateSummary* f) {
  const SegmentEntry& seg = t.segments[s];
  double sum = 0.0;
  uint64_t clamped = 0;
  for (uint32_t k = seg.first_chunk; k < end_chunk(t, s); ++k) {
    sum += t.chunk_squares[k];
    clamped += t.chunk_clamped[k];
  }
  const SegmentCoefficients sc = t.coefficients[s];
  GapState committed = sc.history_after;
  committed.last_step_norm = step_gap(double(c.alpha), sum);
  t.gap[s] = committed;
  summarize_segment(sc.lambda, sc.norm_scale, f);
  summarize_pass(seg.count, clamped, f);
}

// The report from the threads' partials, merged in thread order.
CO2_HOST_DEVICE inline Report fold_report(const Tables& t, const Config& c, bool update, const UpdateSummary* partials,
                                          int count) {
  Report r{};
  r.update_requested = c.update_requested;
  r.applied = update;
  r.delta_nonfinite = c.write_delta && *t.delta_nonfinite != 0;
  r.summary = empty_summary();
  for (int i = 0; i < count; ++i) merge_summary(partials[i], &r.summary);
  return r;
}

// Eager policy, after a pass whose delta was not finite on this rank: the rank restarts from the
// anchor with no offset (element i of chunk ch, parameters of type P).
template <typename P>
CO2_HOST_DEVICE inline void eager_restart_element(const Tables& t, const Chunk& ch, uint32_t i) {
  const SegmentEntry& seg = t.segments[ch.segment];
  const uint64_t at = seg.state_offset + ch.begin + i;
  static_cast<P*>(seg.params)[ch.begin + i] = narrow<P>(t.anchor[at]);
  t.eager_offset[at] = 0.0f;
  if (t.eager_momentum) t.eager_momentum[at] = 0.0f;
}

// Calls f(P*) with a segment's parameters as their stored type.
template <typename F>
CO2_HOST_DEVICE inline void with_param_type(uint32_t dtype, F&& f) {
  if (dtype == 1)
    f(static_cast<Bf16*>(nullptr));
  else if (dtype == 2)
    f(static_cast<Fp16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

// The fixed-shape tree over kThreads values (a chunk's block reduction); values[0] gets the sum.
// The kernel runs it in shared memory with a barrier between levels; the host runs the loops.
CO2_HOST_DEVICE inline void tree_level(double* values, int stride, int thread) {
  if (thread < stride) values[thread] += values[thread + stride];
}

}  // namespace co2::device::kernels

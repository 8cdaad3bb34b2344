// The fused boundary pass over one segment: one read of (p, a, m, c), one write of each. The
// loops are here; the element math and the per-segment scalars are the outer core's
// (runtime/outer/), which the CUDA kernels share, so the host tests cover the arithmetic the
// device runs.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/outer/coefficients.hpp"
#include "runtime/outer/elements.hpp"
#include "runtime/outer/param_types.hpp"

namespace co2 {

struct PassFlags {
  bool update;      // apply the outer update with c as the average
  bool momentum;    // m is stored (beta > 0 or Nesterov)
  bool nesterov;
  bool value_clip;  // otherwise: scale by norm_scale
  bool write_delta; // c <- a - p (co2); otherwise p is only overwritten
  // The first half of the split pass (co2 on the host): with update, m <- m_new and c <- the
  // next anchor a - alpha*s; a is left alone, and so is p when it is null (co2: the progress
  // thread never touches the framework's memory); a non-null p takes the next anchor too
  // (diloco, on the training thread). apply_prepared_segment is co2's other half.
  bool prepare = false;
};

struct PassResult {
  double step_sum_squares = 0.0;  // sum of s^2 (for the gap penalty's next g = alpha*||s||)
  uint32_t clamped = 0;           // momentum elements clamped by value clipping
  bool delta_finite = true;       // every a - p was finite (only checked with write_delta)
  bool result_finite = true;      // every new anchor was finite (only checked with update)
};

// One segment. p: the framework's params (fp32, bf16 or fp16: read widened, written rounded);
// a: anchor; m: momentum (may be null when !momentum); c: the comm buffer (average in, delta out).
// The delta is R(w*a) - p: from the rounded start the rank trained from (stored_value).
template <bool kUpdate, bool kMomentum, bool kNesterov, bool kValueClip, bool kWriteDelta,
          bool kPrepare = false, typename P = float>
PassResult boundary_pass_segment(P* __restrict__ p, float* __restrict__ a, float* __restrict__ m,
                                 float* __restrict__ c, size_t n, const OuterCoefficients& k) {
  double norm_lane[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  // Squares are summed in fp32 over chunks of kSquareChunk elements (16 per lane keeps the
  // relative rounding error near 1e-6), then folded into fp64: exact enough for a penalty and
  // cheap enough that the pass stays memory-bound.
  float square_lane[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  float nan_probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  float result_probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t clamped_lane[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  // Element i of the segment always lands in lane i mod kNormLanes, so the sums do not depend
  // on how the loop is vectorised. Each block is written as lane-wise loops the compiler turns
  // into vector instructions.
  auto block = [&](size_t base, int first_lane, auto lane_count) {
    constexpr int lanes = decltype(lane_count)::value;
    float anchor_old[kNormLanes], anchor_new[kNormLanes], step[kNormLanes], base_value[kNormLanes];
    for (int l = 0; l < lanes; ++l) anchor_new[l] = anchor_old[l] = a[base + l];
    for (int l = 0; l < lanes; ++l) base_value[l] = anchor_base(anchor_old[l], k);  // exact for w = 1
    if (kUpdate) {
      for (int l = 0; l < lanes; ++l) {
        const float average = c[base + l];
        const float m_old = kMomentum ? m[base + l] : 0.0f;
        const float m_new =
            clip_momentum<kValueClip>(momentum_candidate(m_old, average, k), k, &clamped_lane[first_lane + l]);
        step[l] = outer_step<kNesterov>(m_new, average, k);
        if (kMomentum) m[base + l] = m_new;
        anchor_new[l] = next_anchor(base_value[l], step[l], k);
      }
      for (int l = 0; l < lanes; ++l) square_lane[first_lane + l] += step[l] * step[l];
      // Finite inputs can still overflow (a - alpha*s beyond FLT_MAX): the result is checked too.
      for (int l = 0; l < lanes; ++l) result_probe[first_lane + l] += finite_probe(anchor_new[l]);
      for (int l = 0; l < lanes; ++l) (kPrepare ? c : a)[base + l] = anchor_new[l];
    }
    if (kPrepare) {
      if (p)
        for (int l = 0; l < lanes; ++l) p[base + l] = narrow<P>(anchor_new[l]);
      return;
    }
    if (kWriteDelta) {
      for (int l = 0; l < lanes; ++l) {
        const float delta = delta_element(base_value[l], p[base + l]);
        nan_probe[first_lane + l] += finite_probe(delta);
        c[base + l] = delta;
      }
    }
    for (int l = 0; l < lanes; ++l) p[base + l] = narrow<P>(anchor_new[l]);
  };
  auto fold_squares = [&] {
    for (int l = 0; l < kNormLanes; ++l) {
      norm_lane[l] += double(square_lane[l]);
      square_lane[l] = 0.0f;
    }
  };
  size_t i = 0;
  while (i + kNormLanes <= n) {
    const size_t chunk_end = std::min(n - n % kNormLanes, i + kSquareChunk);
    for (; i < chunk_end; i += kNormLanes) block(i, 0, std::integral_constant<int, kNormLanes>());
    fold_squares();
  }
  for (int lane = 0; i < n; ++i, ++lane) block(i, lane, std::integral_constant<int, 1>());
  fold_squares();

  PassResult result;
  NormAccumulator norm;
  for (int lane = 0; lane < kNormLanes; ++lane) {
    norm.lane[lane] = norm_lane[lane];
    result.clamped += clamped_lane[lane];
  }
  result.step_sum_squares = norm.total();
  float probe = 0.0f;
  for (float v : nan_probe) probe += v;
  result.delta_finite = probe == 0.0f;
  float result_sum = 0.0f;
  for (float v : result_probe) result_sum += v;
  result.result_finite = result_sum == 0.0f;
  return result;
}

}  // namespace co2

namespace co2 {

// Runtime dispatch to the instantiation of boundary_pass_segment that matches `flags`, for each
// parameter type.
PassResult run_boundary_pass(const PassFlags& flags, float* p, float* a, float* m, float* c,
                             size_t n, const OuterCoefficients& k);
PassResult run_boundary_pass(const PassFlags& flags, Bf16* p, float* a, float* m, float* c,
                             size_t n, const OuterCoefficients& k);
PassResult run_boundary_pass(const PassFlags& flags, Fp16* p, float* a, float* m, float* c,
                             size_t n, const OuterCoefficients& k);
// The prepare half without parameters (co2): no parameter type to choose.
inline PassResult run_boundary_pass(const PassFlags& flags, std::nullptr_t, float* a, float* m, float* c,
                                    size_t n, const OuterCoefficients& k) {
  return run_boundary_pass(flags, static_cast<float*>(nullptr), a, m, c, n, k);
}

// sum over i of (beta*m[i] + lambda*c[i])^2 in the deterministic lane order; m may be null
// (treated as zeros). The extra read pass norm clipping needs.
double momentum_candidate_sum_squares(const float* m, const float* c, size_t n,
                                      const OuterCoefficients& k);

// The second half of the split pass, at the boundary: a <- R(w*a) - p (the delta, written into the
// anchor's buffer, which the engine then swaps with the comm buffer; w = anchor_weight), p <- c
// (the prepared next anchor). Returns whether every delta was finite.
template <typename P>
bool apply_prepared_segment(P* p, float* a, const float* c, size_t n, float anchor_weight = 1.0f);

// One PARAMETER segment of a co2 boundary under the eager policy. `a` is the anchor the round
// started from, `next` the anchor the next round starts from (`a` itself when nothing is
// applied). Per element: d = R(a + e) - p into `delta` (which may be `a`: the split pass writes
// the delta into the anchor's buffer); q <- beta*q + d (q may be null: then q = d);
// e <- -scale * (nesterov ? beta*q + d : q); p <- next + e. Returns whether every d was finite.
template <typename P>
bool eager_boundary_segment(P* p, const float* a, const float* next, float* e, float* q,
                            float* delta, size_t n, const EagerCoefficients& k);

// Applying the average on arrival, one segment: p <- R(next - (R(a + e) - p)) and e <- 0 (e may
// be null: no offset, as for BUFFER segments and without the eager policy).
template <typename P>
void arrival_shift_segment(P* p, const float* a, const float* next, float* e, size_t n);

// True when no element is NaN or infinite.
bool all_finite(const float* x, size_t n);

// Whether the update of `flags` (update set, momentum stored) would leave every new anchor and
// momentum element finite; reads a, m, c and writes nothing. The split pass writes the momentum
// in place, so an overflow must be found before it, not after.
bool update_result_finite(const PassFlags& flags, const float* a, const float* m, const float* c,
                          size_t n, const OuterCoefficients& k);

}  // namespace co2

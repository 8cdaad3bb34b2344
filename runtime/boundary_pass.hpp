// The fused boundary pass over one segment: one read of (p, a, m, c), one write of each.
// The element math is written once, as inline functions a CUDA kernel can share
// (CO2_HOST_DEVICE), so the host tests cover the arithmetic the device runs.
#pragma once

#include <cstddef>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/host_device.hpp"
#include "runtime/param_types.hpp"

namespace co2 {

// Coefficients of one segment's outer update, in the precision of the pass.
struct OuterCoefficients {
  float alpha = 1.0f;       // outer lr
  float beta = 0.0f;        // outer momentum
  float lambda = 1.0f;      // staleness penalty of this segment
  float norm_scale = 1.0f;  // norm clipping factor min(1, phi/||u||), 1 when not clipping
  float clip_value = 0.0f;  // phi of value clipping
  // What deltas and the update start from: anchor_weight * a. 1 for PARAMETER segments; 0 for
  // co2's BUFFER segments, which send their values (d = -p) and take the average of the values
  // (a <- -(-p)bar): a statistic measured from a stale anchor overshoots (docs/algorithm.md).
  float anchor_weight = 1.0f;
};

// u = beta*m + lambda*c: the unclipped new momentum.
CO2_HOST_DEVICE inline float momentum_candidate(float m, float c, const OuterCoefficients& k) {
  return k.beta * m + k.lambda * c;
}

// Branch-free so that the host loop vectorises; *clamped counts clamped elements.
template <bool kValueClip>
CO2_HOST_DEVICE inline float clip_momentum(float u, const OuterCoefficients& k, uint32_t* clamped) {
  if (kValueClip) {
    *clamped += uint32_t(u > k.clip_value) + uint32_t(u < -k.clip_value);
    const float upper = u < k.clip_value ? u : k.clip_value;
    return upper > -k.clip_value ? upper : -k.clip_value;
  }
  return u * k.norm_scale;
}

// The step s applied to the anchor (a <- a - alpha*s); m is the new, clipped momentum.
template <bool kNesterov>
CO2_HOST_DEVICE inline float outer_step(float m_new, float c, const OuterCoefficients& k) {
  return kNesterov ? k.beta * m_new + k.lambda * c : m_new;
}

// The delta of one element: R(start) - p, from the start the rank trained from as its P
// parameter held it (stored_value), never from the fp32 start itself.
template <typename P>
CO2_HOST_DEVICE inline float delta_element(float start, P p) {
  return stored_value<P>(start) - widen(p);
}

// The eager policy's rank-local correction (docs/algorithm.md, "The eager policy").
struct EagerCoefficients {
  float beta = 0.0f;      // the outer momentum, filtering this rank's own deltas
  float scale = 0.0f;     // alpha / W
  bool momentum = false;  // q is stored (beta > 0 or Nesterov)
  bool nesterov = false;
};

// q' = beta*q + d (q' = d without a stored momentum): this rank's filtered delta.
CO2_HOST_DEVICE inline float eager_filtered(float d, float q, const EagerCoefficients& k) {
  return k.momentum ? k.beta * q + d : d;
}

// e' = -scale * (nesterov ? beta*q' + d : q'): the offset the next round starts from (p = a' + e').
CO2_HOST_DEVICE inline float eager_offset(float d, float filtered, const EagerCoefficients& k) {
  return -k.scale * (k.nesterov ? k.beta * filtered + d : filtered);
}

// Gap penalty of one segment at an update (docs/algorithm.md): g = alpha*||s|| of the previous
// update; the history (sum of g, number of updates) advances by this update. The host engine and
// the device coefficients kernel both call this.
CO2_HOST_DEVICE inline double gap_penalty_lambda(double g, double* gap_sum, uint64_t* updates) {
  const double sum = *gap_sum + g;
  const uint64_t n = *updates + 1;
  *gap_sum = sum;
  *updates = n;
  if (g == 0.0) return 1.0;
  const double mean = sum / double(n);
  return 1.0 / (1.0 + g / (mean + 1e-12));
}

// Norm clipping factor min(1, phi/||u||) of a segment, from its sum of squares.
CO2_HOST_DEVICE inline double norm_clip_scale(double sum_squares, double phi) {
  const double norm = sqrt(sum_squares);
  return norm > phi ? phi / norm : 1.0;
}

// Deterministic sum of squares: element i goes to lane i mod kLanes, lanes combined in a fixed
// order, so the result depends only on the values and the segment size.
constexpr int kNormLanes = 8;
constexpr size_t kSquareChunk = 128;

struct NormAccumulator {
  double lane[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  double total() const {
    double pairs[4] = {lane[0] + lane[4], lane[1] + lane[5], lane[2] + lane[6], lane[3] + lane[7]};
    return (pairs[0] + pairs[2]) + (pairs[1] + pairs[3]);
  }
};

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
    for (int l = 0; l < lanes; ++l) base_value[l] = k.anchor_weight * anchor_old[l];  // exact for 1
    if (kUpdate) {
      for (int l = 0; l < lanes; ++l) {
        const float average = c[base + l];
        const float m_old = kMomentum ? m[base + l] : 0.0f;
        const float m_new =
            clip_momentum<kValueClip>(momentum_candidate(m_old, average, k), k, &clamped_lane[first_lane + l]);
        step[l] = outer_step<kNesterov>(m_new, average, k);
        if (kMomentum) m[base + l] = m_new;
        anchor_new[l] = base_value[l] - k.alpha * step[l];
      }
      for (int l = 0; l < lanes; ++l) square_lane[first_lane + l] += step[l] * step[l];
      // Finite inputs can still overflow (a - alpha*s beyond FLT_MAX): the result is checked too.
      for (int l = 0; l < lanes; ++l) result_probe[first_lane + l] += anchor_new[l] * 0.0f;
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
        nan_probe[first_lane + l] += delta * 0.0f;  // stays 0 unless delta is NaN or infinite
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

// True when no element is NaN or infinite.
bool all_finite(const float* x, size_t n);

// Whether the update of `flags` (update set, momentum stored) would leave every new anchor and
// momentum element finite; reads a, m, c and writes nothing. The split pass writes the momentum
// in place, so an overflow must be found before it, not after.
bool update_result_finite(const PassFlags& flags, const float* a, const float* m, const float* c,
                          size_t n, const OuterCoefficients& k);

}  // namespace co2

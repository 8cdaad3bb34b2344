// The fused boundary pass over one segment: one read of (p, a, m, c), one write of each.
// The element math is written once, as inline functions a CUDA kernel can share
// (CO2_HOST_DEVICE), so the host tests cover the arithmetic the device runs.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CO2_HOST_DEVICE __host__ __device__
#else
#define CO2_HOST_DEVICE
#endif

namespace co2 {

// Coefficients of one segment's outer update, in the precision of the pass.
struct OuterCoefficients {
  float alpha = 1.0f;       // outer lr
  float beta = 0.0f;        // outer momentum
  float lambda = 1.0f;      // staleness penalty of this segment
  float norm_scale = 1.0f;  // norm clipping factor min(1, phi/||u||), 1 when not clipping
  float clip_value = 0.0f;  // phi of value clipping
};

// u = beta*m + lambda*c: the unclipped new momentum.
CO2_HOST_DEVICE inline float momentum_candidate(float m, float c, const OuterCoefficients& k) {
  return k.beta * m + k.lambda * c;
}

template <bool kValueClip>
CO2_HOST_DEVICE inline float clip_momentum(float u, const OuterCoefficients& k, uint32_t* clamped) {
  if (kValueClip) {
    if (u > k.clip_value) {
      ++*clamped;
      return k.clip_value;
    }
    if (u < -k.clip_value) {
      ++*clamped;
      return -k.clip_value;
    }
    return u;
  }
  return u * k.norm_scale;
}

// The step s applied to the anchor (a <- a - alpha*s); m is the new, clipped momentum.
template <bool kNesterov>
CO2_HOST_DEVICE inline float outer_step(float m_new, float c, const OuterCoefficients& k) {
  return kNesterov ? k.beta * m_new + k.lambda * c : m_new;
}

// Deterministic sum of squares: element i goes to lane i mod kLanes, lanes combined in a fixed
// order, so the result depends only on the values and the segment size.
constexpr int kNormLanes = 8;

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
};

struct PassResult {
  double step_sum_squares = 0.0;  // sum of s^2 (for the gap penalty's next g = alpha*||s||)
  uint32_t clamped = 0;           // momentum elements clamped by value clipping
  bool delta_finite = true;       // every a - p was finite (only checked with write_delta)
};

// One segment. p: the framework's params; a: anchor; m: momentum (may be null when
// !momentum); c: the comm buffer (average in, delta out).
template <bool kUpdate, bool kMomentum, bool kNesterov, bool kValueClip, bool kWriteDelta>
PassResult boundary_pass_segment(float* p, float* a, float* m, float* c, size_t n,
                                 const OuterCoefficients& k) {
  PassResult result;
  NormAccumulator norm;
  float nan_probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t clamped = 0;
  auto element = [&](size_t i, int lane) {
    const float anchor_old = a[i];
    float anchor_new = anchor_old;
    if (kUpdate) {
      const float average = c[i];
      const float m_old = kMomentum ? m[i] : 0.0f;
      const float m_new =
          clip_momentum<kValueClip>(momentum_candidate(m_old, average, k), k, &clamped);
      const float s = outer_step<kNesterov>(m_new, average, k);
      if (kMomentum) m[i] = m_new;
      norm.lane[lane] += double(s) * double(s);
      anchor_new = anchor_old - k.alpha * s;
      a[i] = anchor_new;
    }
    if (kWriteDelta) {
      const float delta = anchor_old - p[i];
      nan_probe[lane] += delta * 0.0f;  // stays 0 unless delta is NaN or infinite
      c[i] = delta;
    }
    p[i] = anchor_new;
  };
  size_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int lane = 0; lane < kNormLanes; ++lane) element(i + lane, lane);
  for (int lane = 0; i < n; ++i, ++lane) element(i, lane);
  result.step_sum_squares = norm.total();
  result.clamped = clamped;
  float probe = 0.0f;
  for (float v : nan_probe) probe += v;
  result.delta_finite = probe == 0.0f;
  return result;
}

}  // namespace co2

namespace co2 {

// Runtime dispatch to the instantiation of boundary_pass_segment that matches `flags`.
PassResult run_boundary_pass(const PassFlags& flags, float* p, float* a, float* m, float* c,
                             size_t n, const OuterCoefficients& k);

// sum over i of (beta*m[i] + lambda*c[i])^2 in the deterministic lane order; m may be null
// (treated as zeros). The extra read pass norm clipping needs.
double momentum_candidate_sum_squares(const float* m, const float* c, size_t n,
                                      const OuterCoefficients& k);

// True when no element is NaN or infinite.
bool all_finite(const float* x, size_t n);

}  // namespace co2

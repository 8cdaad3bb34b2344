// The outer update's element math, written once (docs/architecture.md, "The outer core"): the
// delta, the new momentum with its clip, the step and the new anchor, the eager correction, and
// the wire's 16-bit and int8 element codes with their error feedback. CO2_HOST_DEVICE: the host
// passes (runtime/outer/boundary_pass.*, runtime/outer/wire_format.cpp) and the CUDA kernels
// (runtime/backends/device/kernels.cu) call these very functions, so the CPU tests cover what a kernel runs.
// Per-segment scalars (lambda, the norm-clip scale, the gap) come from runtime/outer/coefficients.hpp.
#pragma once

#include <cstdint>

#include "runtime/base/host_device.hpp"
#include "runtime/outer/param_types.hpp"

namespace co2 {

// Coefficients of one segment's outer update, in the precision of the pass
// (runtime/outer/coefficients.hpp fills them).
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

// anchor_weight of a segment: 0 for a BUFFER segment whose values travel instead of its delta
// (co2), else 1.
CO2_HOST_DEVICE inline float anchor_weight_of(bool buffer_values, bool is_parameter) {
  return buffer_values && !is_parameter ? 0.0f : 1.0f;
}

// w*a: what the delta and the update of one element start from.
CO2_HOST_DEVICE inline float anchor_base(float a, const OuterCoefficients& k) { return k.anchor_weight * a; }

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

// The new anchor from the base w*a and the step s.
CO2_HOST_DEVICE inline float next_anchor(float base, float step, const OuterCoefficients& k) {
  return base - k.alpha * step;
}

// The delta of one element: R(start) - p, from the start the rank trained from as its P
// parameter held it (stored_value), never from the fp32 start itself.
template <typename P>
CO2_HOST_DEVICE inline float delta_element(float start, P p) {
  return stored_value<P>(start) - widen(p);
}

// What a BUFFER segment whose values travel sends (anchor weight 0): -p, written as the sharded
// eager passes always have (delta_element(0 * a, p) gives +0 where this gives -0).
template <typename P>
CO2_HOST_DEVICE inline float value_delta(P p) {
  return -widen(p);
}

// The sharded chain (docs/algorithm.md, "Sharded outer state"): the deltas are taken from R(B),
// the ranks trained from R(cur); the owner of a shard adds back their difference, scaled by the
// anchor weight, to the reduced average.
template <typename P>
CO2_HOST_DEVICE inline float start_difference(float trained_from, float taken_from) {
  return stored_value<P>(trained_from) - stored_value<P>(taken_from);
}
CO2_HOST_DEVICE inline float restored_average(float reduced, float difference, float anchor_weight) {
  return reduced + anchor_weight * difference;
}

// x * 0: stays 0 unless x is NaN or infinite, so a sum of probes tells whether all were finite
// without a branch per element.
CO2_HOST_DEVICE inline float finite_probe(float x) { return x * 0.0f; }

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

// a + e: where a rank's round starts under the eager policy.
CO2_HOST_DEVICE inline float round_start(float anchor, float offset) { return anchor + offset; }

// Applying the average on arrival (docs/algorithm.md): where a rank goes when the next anchor
// arrives mid-round. It keeps its progress since the round began, R(start) - p, on top of the
// next anchor; the next boundary's delta R(next) - p then holds the progress of the whole round.
template <typename P>
CO2_HOST_DEVICE inline float position_on_arrival(float next, float start, P p) {
  return next - delta_element(start, p);
}

// --- the compressed wire (runtime/outer/wire_format.cpp) ---

// What an encoding dropped of x, which travels as `sent`, in units of the sum (error feedback:
// the next round's delta takes it back).
CO2_HOST_DEVICE inline float wire_dropped(float x, float sent, float scale) { return (x - sent) * scale; }

// What the next delta takes back of a drop: nothing of a non-finite one (the round after a NaN or
// Inf delta), which would make every later average non-finite too.
CO2_HOST_DEVICE inline float fed_back(float dropped) { return dropped - dropped == 0.0f ? dropped : 0.0f; }

// A group's scale s = max|x| / top, and its inverse top / max|x| (top: the largest code's
// magnitude, 127 for int8, 6 for fp4): 0 and 0 for a group so small (or zero) that either
// leaves the float range (absmax below about 1e-36: it travels as zeros, error feedback keeps
// it); a NaN scale for a non-finite group (it decodes to NaN).
struct GroupScale {
  float scale, inverse;
};
CO2_HOST_DEVICE inline GroupScale group_scale_of(float absmax, bool finite, float top) {
  constexpr float kFloatMax = 3.40282347e+38f;
  const float nan = param_detail::float_of(0x7fc00000u);
  GroupScale s{finite ? absmax / top : nan, finite && absmax > 0.0f ? top / absmax : 0.0f};
  if (finite && !(s.scale > 0.0f && s.inverse <= kFloatMax)) s.scale = s.inverse = 0.0f;
  return s;
}

constexpr float kInt8Top = 127.0f;
CO2_HOST_DEVICE inline GroupScale int8_scale_of(float absmax, bool finite) {
  return group_scale_of(absmax, finite, kInt8Top);
}

// round(x * inverse) in [-127, 127]. Any rounding is correct (error feedback keeps what it
// drops); half away from zero is the cheapest. |x| * 127 / absmax <= 127 up to one rounding:
// the clamp keeps it a byte.
CO2_HOST_DEVICE inline int8_t int8_code(float x, float inverse) {
  const float r = x * inverse;
  const int rounded = int(r + (r >= 0.0f ? 0.5f : -0.5f));
  return int8_t(rounded < -127 ? -127 : rounded > 127 ? 127 : rounded);
}

CO2_HOST_DEVICE inline float int8_value(int8_t code, float scale) { return float(code) * scale; }

// FP4 E2M1 (the OCP microscaling element): a sign bit and the magnitudes 0, 0.5, 1, 1.5, 2, 3,
// 4, 6 in three bits, times the group's scale s = max|x| / 6. Spaced by powers of two, these keep
// more of a heavy-tailed group's small values than int4's evenly spaced 15 levels (docs/algorithm.md,
// "Compressed outer all-reduce": 0.12 against 0.16 relative RMS error on Laplace values, 0.15
// against 0.22 on Student-t(3), groups of 64).
constexpr float kFp4Top = 6.0f;
CO2_HOST_DEVICE inline GroupScale fp4_scale_of(float absmax, bool finite) {
  return group_scale_of(absmax, finite, kFp4Top);
}

// The nearest magnitude to |x| * inverse, ties to the even code (as the OCP format rounds),
// as a count of the midpoints below it: no branch, no table, one definition for every caller.
// The sign is bit 3. A NaN (whose group's scale is NaN anyway) gives code 0.
CO2_HOST_DEVICE inline uint8_t fp4_code(float x, float inverse) {
  const float r = x * inverse;
  const float m = r < 0.0f ? -r : r;
  const uint8_t magnitude = uint8_t((m > 0.25f) + (m >= 0.75f) + (m > 1.25f) + (m >= 1.75f) +
                                    (m > 2.5f) + (m >= 3.5f) + (m > 5.0f));
  return uint8_t((r < 0.0f ? 8u : 0u) | magnitude);
}

// The code's value as fp32 bits (exact: each magnitude has at most two significant bits), no
// branch or table, so that a loop of it vectorises. Magnitude m (the low three bits) is 0, 0.5
// (2^-1: 126 << 23), or for m >= 2 the exponent m / 2 - 1 with the mantissa's top bit m & 1,
// which (m + 252) << 22 spells; the sign is bit 3.
CO2_HOST_DEVICE inline float fp4_value(uint8_t code, float scale) {
  const uint32_t m = code & 7u;
  const uint32_t magnitude = m >= 2u ? (m + 252u) << 22 : m == 1u ? 126u << 23 : 0u;
  const uint32_t sign = uint32_t(code & 8u) << 28;
  return param_detail::float_of(sign | magnitude) * scale;
}

}  // namespace co2

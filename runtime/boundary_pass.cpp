#include "runtime/boundary_pass.hpp"

namespace co2 {
namespace {

template <bool kUpdate, bool kMomentum, bool kNesterov, bool kValueClip>
PassResult dispatch_delta(const PassFlags& f, float* p, float* a, float* m, float* c, size_t n,
                          const OuterCoefficients& k) {
  if (f.prepare)
    return boundary_pass_segment<kUpdate, kMomentum, kNesterov, kValueClip, false, true>(p, a, m, c, n, k);
  return f.write_delta
             ? boundary_pass_segment<kUpdate, kMomentum, kNesterov, kValueClip, true>(p, a, m, c, n, k)
             : boundary_pass_segment<kUpdate, kMomentum, kNesterov, kValueClip, false>(p, a, m, c, n, k);
}

template <bool kUpdate, bool kMomentum, bool kNesterov>
PassResult dispatch_clip(const PassFlags& f, float* p, float* a, float* m, float* c, size_t n,
                         const OuterCoefficients& k) {
  return f.value_clip ? dispatch_delta<kUpdate, kMomentum, kNesterov, true>(f, p, a, m, c, n, k)
                      : dispatch_delta<kUpdate, kMomentum, kNesterov, false>(f, p, a, m, c, n, k);
}

template <bool kUpdate, bool kMomentum>
PassResult dispatch_nesterov(const PassFlags& f, float* p, float* a, float* m, float* c, size_t n,
                             const OuterCoefficients& k) {
  return f.nesterov ? dispatch_clip<kUpdate, kMomentum, true>(f, p, a, m, c, n, k)
                    : dispatch_clip<kUpdate, kMomentum, false>(f, p, a, m, c, n, k);
}

}  // namespace

PassResult run_boundary_pass(const PassFlags& f, float* p, float* a, float* m, float* c, size_t n,
                             const OuterCoefficients& k) {
  if (!f.update) return boundary_pass_segment<false, false, false, false, true>(p, a, m, c, n, k);
  return f.momentum ? dispatch_nesterov<true, true>(f, p, a, m, c, n, k)
                    : dispatch_nesterov<true, false>(f, p, a, m, c, n, k);
}

double momentum_candidate_sum_squares(const float* m, const float* c, size_t n,
                                      const OuterCoefficients& k) {
  NormAccumulator norm;
  size_t i = 0;
  auto element = [&](size_t j, int lane) {
    const float u = momentum_candidate(m ? m[j] : 0.0f, c[j], k);
    norm.lane[lane] += double(u) * double(u);
  };
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int lane = 0; lane < kNormLanes; ++lane) element(i + lane, lane);
  for (int lane = 0; i < n; ++i, ++lane) element(i, lane);
  return norm.total();
}

bool apply_prepared_segment(float* __restrict__ p, float* __restrict__ a, const float* __restrict__ c,
                            size_t n) {
  float probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  auto element = [&](size_t j, int lane) {
    const float delta = a[j] - p[j];  // the fused pass's expression: bit-identical deltas
    probe[lane] += delta * 0.0f;
    a[j] = delta;
    p[j] = c[j];
  };
  size_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int lane = 0; lane < kNormLanes; ++lane) element(i + lane, lane);
  for (int lane = 0; i < n; ++i, ++lane) element(i, lane);
  float total = 0.0f;
  for (float v : probe) total += v;
  return total == 0.0f;
}

bool eager_boundary_segment(float* p, const float* a, const float* next, float* e, float* q,
                            float* delta, size_t n, const EagerCoefficients& k) {
  float probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  // `delta` may alias `a` and `next` may alias `a`: every element is read before it is written.
  auto element = [&](size_t j, int lane) {
    const float d = (a[j] + e[j]) - p[j];
    const float y = next[j];
    probe[lane] += d * 0.0f;
    delta[j] = d;
    float filtered = d;
    if (k.momentum) {
      filtered = k.beta * q[j] + d;
      q[j] = filtered;
    }
    const float offset = -k.scale * (k.nesterov ? k.beta * filtered + d : filtered);
    e[j] = offset;
    p[j] = y + offset;
  };
  size_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int lane = 0; lane < kNormLanes; ++lane) element(i + lane, lane);
  for (int lane = 0; i < n; ++i, ++lane) element(i, lane);
  float total = 0.0f;
  for (float v : probe) total += v;
  return total == 0.0f;
}

bool all_finite(const float* x, size_t n) {
  float probe[kNormLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + kNormLanes <= n; i += kNormLanes)
    for (int lane = 0; lane < kNormLanes; ++lane) probe[lane] += x[i + lane] * 0.0f;
  for (int lane = 0; i < n; ++i, ++lane) probe[lane] += x[i] * 0.0f;
  float total = 0.0f;
  for (float v : probe) total += v;
  return total == 0.0f;
}

}  // namespace co2

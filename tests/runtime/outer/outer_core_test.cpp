// The outer core (runtime/outer/) against plain float64 formulas: every element function, the
// per-segment scalars (lambda from a gap history, the norm-clip scale from a sum of squares, the
// gap an update leaves), and the host's plan of a segment's update built from them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/outer/coefficients.hpp"
#include "runtime/outer/elements.hpp"
#include "runtime/outer/update_plan.hpp"

namespace co2 {
namespace {

// Relative agreement of an fp32 result with its float64 formula: a few fp32 roundings.
void expect_close(double expected, float actual, double ulps = 4.0) {
  EXPECT_NEAR(double(actual), expected, ulps * 6e-8 * (std::fabs(expected) + 1e-30)) << "expected " << expected;
}

std::vector<float> uniform(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(OuterElements, DeltaIsTheStoredStartMinusTheParameter) {
  const std::vector<float> start = uniform(1000, 2.0f, 1), params = uniform(1000, 2.0f, 2);
  for (size_t i = 0; i < start.size(); ++i) {
    // The difference of two floats of similar size is exact in float64; fp32 rounds it once.
    EXPECT_EQ(delta_element(start[i], params[i]), float(double(start[i]) - double(params[i])));
    const Bf16 pb = narrow<Bf16>(params[i]);
    const double stored_bf16 = double(widen(narrow<Bf16>(start[i])));
    EXPECT_EQ(delta_element(start[i], pb), float(stored_bf16 - double(widen(pb))));
    const Fp16 ph = narrow<Fp16>(params[i]);
    const double stored_fp16 = double(widen(narrow<Fp16>(start[i])));
    EXPECT_EQ(delta_element(start[i], ph), float(stored_fp16 - double(widen(ph))));
    // R(start) is what a 16-bit parameter holds: at most half an ulp (2^-8 relative for bf16) away.
    EXPECT_LE(std::fabs(stored_bf16 - start[i]), std::fabs(start[i]) * 0x1p-8 + 1e-30);
  }
}

TEST(OuterElements, UpdateMatchesFloat64) {
  const std::vector<float> a = uniform(500, 1.0f, 3), m = uniform(500, 0.2f, 4), c = uniform(500, 0.3f, 5);
  OuterCoefficients k;
  k.alpha = 0.7f;
  k.beta = 0.6f;
  k.lambda = 0.8f;
  k.norm_scale = 0.5f;
  for (size_t i = 0; i < a.size(); ++i) {
    const double u = double(k.beta) * m[i] + double(k.lambda) * c[i];
    uint32_t clamped = 0;
    const float m_new = clip_momentum<false>(momentum_candidate(m[i], c[i], k), k, &clamped);
    expect_close(u * k.norm_scale, m_new, 8.0 * (std::fabs(double(k.beta) * m[i]) + std::fabs(double(k.lambda) * c[i])) /
                                              (std::fabs(u) + 1e-30));
    EXPECT_EQ(clamped, 0u);
    const float plain = outer_step<false>(m_new, c[i], k);
    EXPECT_EQ(plain, m_new);
    const double nesterov = double(k.beta) * m_new + double(k.lambda) * c[i];
    expect_close(nesterov, outer_step<true>(m_new, c[i], k),
                 8.0 * (std::fabs(double(k.beta) * m_new) + std::fabs(double(k.lambda) * c[i])) / (std::fabs(nesterov) + 1e-30));
    const double anchor = double(a[i]) - double(k.alpha) * plain;
    expect_close(anchor, next_anchor(anchor_base(a[i], k), plain, k),
                 8.0 * (std::fabs(double(a[i])) + std::fabs(double(k.alpha) * plain)) / (std::fabs(anchor) + 1e-30));
  }
}

TEST(OuterElements, ValueClipClampsAndCounts) {
  OuterCoefficients k;
  k.clip_value = 0.25f;
  uint32_t clamped = 0;
  EXPECT_EQ(clip_momentum<true>(0.5f, k, &clamped), 0.25f);
  EXPECT_EQ(clip_momentum<true>(-0.5f, k, &clamped), -0.25f);
  EXPECT_EQ(clip_momentum<true>(0.125f, k, &clamped), 0.125f);
  EXPECT_EQ(clip_momentum<true>(-0.25f, k, &clamped), -0.25f);
  EXPECT_EQ(clamped, 2u);
}

TEST(OuterElements, AnchorWeightZeroSendsValues) {
  OuterCoefficients k;
  k.anchor_weight = anchor_weight_of(/*buffer_values=*/true, /*is_parameter=*/false);
  EXPECT_EQ(k.anchor_weight, 0.0f);
  EXPECT_EQ(delta_element(anchor_base(3.0f, k), 1.5f), -1.5f);
  EXPECT_EQ(anchor_weight_of(true, true), 1.0f);
  EXPECT_EQ(anchor_weight_of(false, false), 1.0f);
}

TEST(OuterElements, ShardedChainRestoresTheAverage) {
  const std::vector<float> cur = uniform(200, 1.0f, 11), b = uniform(200, 1.0f, 12), reduced = uniform(200, 0.5f, 13);
  for (size_t i = 0; i < cur.size(); ++i) {
    const float bf16 = start_difference<Bf16>(cur[i], b[i]);
    EXPECT_EQ(bf16, float(double(widen(narrow<Bf16>(cur[i]))) - double(widen(narrow<Bf16>(b[i])))));
    EXPECT_EQ(start_difference<float>(cur[i], b[i]), float(double(cur[i]) - double(b[i])));
    EXPECT_EQ(restored_average(reduced[i], bf16, 1.0f), float(double(reduced[i]) + double(bf16)));
    EXPECT_EQ(restored_average(reduced[i], bf16, 0.0f), reduced[i]);
  }
  EXPECT_EQ(value_delta(2.5f), -2.5f);
  EXPECT_TRUE(std::signbit(value_delta(0.0f)));  // -p exactly, not 0 - p
  EXPECT_EQ(value_delta(narrow<Fp16>(0.5f)), -0.5f);
}

TEST(OuterElements, EagerCorrectionMatchesFloat64) {
  const std::vector<float> d = uniform(300, 0.1f, 6), q = uniform(300, 0.1f, 7);
  for (bool nesterov : {false, true}) {
    EagerCoefficients k;
    k.beta = 0.9f;
    k.scale = 0.25f;
    k.momentum = true;
    k.nesterov = nesterov;
    for (size_t i = 0; i < d.size(); ++i) {
      const double filtered = double(k.beta) * q[i] + d[i];
      const float f = eager_filtered(d[i], q[i], k);
      expect_close(filtered, f, 8.0 * (std::fabs(double(k.beta) * q[i]) + std::fabs(double(d[i]))) /
                                    (std::fabs(filtered) + 1e-30));
      const double inner = nesterov ? double(k.beta) * f + d[i] : double(f);
      expect_close(-double(k.scale) * inner, eager_offset(d[i], f, k),
                   8.0 * (std::fabs(double(k.beta) * f) + std::fabs(double(d[i]))) / (std::fabs(inner) + 1e-30));
    }
  }
  EagerCoefficients plain;
  plain.scale = 0.5f;
  EXPECT_EQ(eager_filtered(0.3f, 99.0f, plain), 0.3f);  // no stored momentum: q' = d
}

TEST(OuterElements, FiniteProbeAndFeedBack) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(finite_probe(1e30f), 0.0f);
  EXPECT_TRUE(std::isnan(finite_probe(inf)));
  EXPECT_TRUE(std::isnan(finite_probe(nan)));
  EXPECT_EQ(fed_back(-2.5f), -2.5f);
  EXPECT_EQ(fed_back(inf), 0.0f);
  EXPECT_EQ(fed_back(nan), 0.0f);
  EXPECT_EQ(wire_dropped(1.0f, 0.75f, 4.0f), 1.0f);
}

TEST(OuterElements, Int8CodesRoundTripWithinHalfAStep) {
  const std::vector<float> x = uniform(128, 3.0f, 8);
  double absmax = 0.0;
  for (float v : x) absmax = std::max(absmax, std::fabs(double(v)));
  const GroupScale s = int8_scale_of(float(absmax), true);
  expect_close(absmax / 127.0, s.scale);
  for (float v : x) {
    const int8_t code = int8_code(v, s.inverse);
    EXPECT_EQ(double(code), std::round(double(v) * s.inverse)) << v;  // half away from zero
    EXPECT_LE(std::fabs(double(int8_value(code, s.scale)) - v), 0.5 * s.scale * (1 + 1e-5));
  }
  EXPECT_EQ(int8_code(1e30f, 1.0f), 127);
  EXPECT_EQ(int8_code(-1e30f, 1.0f), -127);
  const GroupScale tiny = int8_scale_of(1e-40f, true);
  EXPECT_EQ(tiny.scale, 0.0f);
  EXPECT_EQ(tiny.inverse, 0.0f);
  EXPECT_TRUE(std::isnan(int8_scale_of(0.0f, false).scale));
}

TEST(OuterCoefficients, PenaltiesMatchFloat64) {
  double sum = 0.0;
  uint64_t updates = 0;
  EXPECT_EQ(penalty_lambda(kPenaltyNone, 2.0, 5.0, &sum, &updates), 1.0);
  EXPECT_EQ(penalty_lambda(kPenaltyConstant, 4.0, 5.0, &sum, &updates), 0.25);
  EXPECT_EQ(updates, 0u);  // only the gap penalty keeps a history
  const std::vector<double> gaps = {0.0, 2.0, 1.0, 4.0, 0.5};
  double reference_sum = 0.0;
  for (size_t n = 0; n < gaps.size(); ++n) {
    reference_sum += gaps[n];
    const double mean = reference_sum / double(n + 1);
    const double expected = gaps[n] == 0.0 ? 1.0 : 1.0 / (1.0 + gaps[n] / (mean + 1e-12));
    EXPECT_DOUBLE_EQ(penalty_lambda(kPenaltyGap, 1.0, gaps[n], &sum, &updates), expected);
    EXPECT_EQ(updates, n + 1);
    EXPECT_DOUBLE_EQ(sum, reference_sum);
  }
}

TEST(OuterCoefficients, NormScaleAndGap) {
  EXPECT_EQ(norm_clip_scale(4.0, 3.0), 1.0);  // ||u|| = 2 <= phi
  EXPECT_DOUBLE_EQ(norm_clip_scale(16.0, 1.0), 0.25);
  EXPECT_DOUBLE_EQ(step_gap(0.5, 9.0), 1.5);
  const OuterCoefficients buffer = update_coefficients_of(false, 0.0f, 0.7f, 0.9f, 2.0, 0.5, 0.25);
  EXPECT_EQ(buffer.alpha, 1.0f);
  EXPECT_EQ(buffer.beta, 0.0f);
  EXPECT_EQ(buffer.lambda, 1.0f);
  EXPECT_EQ(buffer.norm_scale, 1.0f);
  EXPECT_EQ(buffer.anchor_weight, 0.0f);
  const OuterCoefficients trained = update_coefficients_of(true, 1.0f, 0.7f, 0.9f, 2.0, 0.5, 0.25);
  EXPECT_EQ(trained.alpha, 0.7f);
  EXPECT_EQ(trained.beta, 0.9f);
  EXPECT_EQ(trained.lambda, 0.5f);
  EXPECT_EQ(trained.norm_scale, 0.25f);
  EXPECT_EQ(trained.clip_value, 2.0f);
}

// The host's plan of one segment: lambda from the gap history, the norm-clip scale from the
// momentum candidate's norm, the statistics, and the gap the update leaves, against float64.
TEST(OuterUpdatePlan, SegmentUpdateMatchesFloat64) {
  const size_t n = 1001;
  const std::vector<float> m = uniform(n, 0.5f, 9), c = uniform(n, 0.5f, 10);
  OuterSettings o;
  o.outer_lr = 0.75;
  o.beta = 0.5;
  o.clip = Clip::Norm;
  o.clip_threshold = 1.0;
  o.penalty = Penalty::Gap;
  Segment seg;
  seg.count = n;
  GapHistory h{2.0, 3.0, 2};
  PassFlags flags{false, false, false, false, false};
  OuterCoefficients k;
  UpdateSummary sum = empty_summary();
  update_coefficients(o, seg, h, m.data(), c.data(), &flags, &k, &sum);
  const double lambda = 1.0 / (1.0 + 2.0 / (5.0 / 3.0 + 1e-12));
  EXPECT_EQ(h.updates, 3u);
  EXPECT_DOUBLE_EQ(h.gap_sum, 5.0);
  EXPECT_EQ(k.lambda, float(lambda));
  double squares = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double u = double(float(o.beta)) * m[i] + double(float(lambda)) * c[i];
    squares += u * u;
  }
  const double scale = std::min(1.0, o.clip_threshold / std::sqrt(squares));
  ASSERT_LT(scale, 1.0);  // the case is meant to clip
  EXPECT_NEAR(k.norm_scale, scale, 1e-6 * scale);
  EXPECT_TRUE(flags.update && flags.momentum && !flags.value_clip && !flags.nesterov);
  EXPECT_EQ(sum.scaled_segments, 1u);
  EXPECT_NEAR(sum.scale_min, scale, 1e-6 * scale);
  EXPECT_DOUBLE_EQ(sum.penalty_min, lambda);
  record_update(seg, 0.75, 16.0, h);
  EXPECT_DOUBLE_EQ(h.last_step_norm, 3.0);

  // A BUFFER segment is only averaged and keeps no history.
  Segment buffer;
  buffer.role = Role::Buffer;
  buffer.count = n;
  GapHistory untouched;
  OuterSettings co2 = o;
  co2.buffer_values = true;
  update_coefficients(co2, buffer, untouched, m.data(), c.data(), &flags, &k, &sum);
  EXPECT_EQ(untouched.updates, 0u);
  EXPECT_EQ(k.alpha, 1.0f);
  EXPECT_EQ(k.anchor_weight, 0.0f);
  record_update(buffer, 0.75, 16.0, untouched);
  EXPECT_EQ(untouched.last_step_norm, 0.0);
}

TEST(OuterUpdatePlan, EagerCoefficientsDivideByParticipants) {
  OuterSettings o;
  o.outer_lr = 0.8;
  o.beta = 0.3;
  o.nesterov = true;
  const EagerCoefficients k = eager_coefficients_of(o, 4, true);
  EXPECT_EQ(k.scale, float(0.8 / 4.0));
  EXPECT_EQ(k.beta, 0.3f);
  EXPECT_TRUE(k.momentum && k.nesterov);
}

}  // namespace
}  // namespace co2

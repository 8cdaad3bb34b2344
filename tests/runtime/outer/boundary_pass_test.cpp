// The fused pass element by element against plain double arithmetic, and its side results
// (step norm, clamp count, non-finite probe); the split pass (prepare, then apply) against the
// fused one, bit for bit.
#include "runtime/outer/boundary_pass.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace co2 {
namespace {

struct Arrays {
  std::vector<float> p, a, m, c;
  explicit Arrays(size_t n, uint32_t seed) : p(n), a(n), m(n), c(n) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      a[i] = u(rng);
      p[i] = a[i] + 0.1f * u(rng);
      m[i] = 0.2f * u(rng);
      c[i] = 0.3f * u(rng);
    }
  }
};

class BoundaryPassSizes : public ::testing::TestWithParam<size_t> {};

TEST_P(BoundaryPassSizes, MatchesDoubleReferenceWithNesterovAndValueClip) {
  const size_t n = GetParam();
  Arrays x(n, 7);
  const Arrays before = x;
  OuterCoefficients k;
  k.alpha = 0.7f;
  k.beta = 0.9f;
  k.lambda = 0.5f;
  k.clip_value = 0.25f;
  const PassResult r = run_boundary_pass({true, true, true, true, true}, x.p.data(), x.a.data(), x.m.data(),
                                         x.c.data(), n, k);
  double squares = 0.0;
  uint32_t clamped = 0;
  for (size_t i = 0; i < n; ++i) {
    const double u = 0.9 * before.m[i] + 0.5 * before.c[i];
    double m_new = u;
    if (std::abs(u) > 0.25) {
      m_new = u > 0 ? 0.25 : -0.25;
      ++clamped;
    }
    const double s = 0.9 * m_new + 0.5 * before.c[i];
    const double a_new = before.a[i] - 0.7 * s;
    squares += s * s;
    // A handful of fp32 roundings of values below 2 in magnitude: 8 ulps of 2 bound them.
    const double tol = 8 * std::numeric_limits<float>::epsilon() * 2;
    ASSERT_NEAR(x.m[i], m_new, tol) << i;
    ASSERT_NEAR(x.a[i], a_new, tol) << i;
    ASSERT_EQ(x.p[i], x.a[i]) << i;
    ASSERT_EQ(x.c[i], before.a[i] - before.p[i]) << i;  // the delta is one exact fp32 subtraction
  }
  EXPECT_EQ(r.clamped, clamped);
  EXPECT_NEAR(r.step_sum_squares, squares, 1e-5 * squares + 1e-12);
  EXPECT_TRUE(r.delta_finite);
}

INSTANTIATE_TEST_SUITE_P(Sizes, BoundaryPassSizes, ::testing::Values(1, 7, 8, 9, 127, 128, 129, 1000, 100003));

// prepare (m and the next anchor into c; a and p untouched) then apply (a <- a - p, p <- c, and
// the engine swaps a and c) gives what the fused pass gives, bit for bit, for every flag set.
TEST_P(BoundaryPassSizes, SplitPassIsBitIdenticalToTheFusedPass) {
  const size_t n = GetParam();
  for (int variant = 0; variant < 8; ++variant) {
    const bool momentum = variant & 1, nesterov = variant & 2, value_clip = variant & 4;
    Arrays fused(n, 13), split(n, 13);
    const Arrays before = split;
    OuterCoefficients k;
    k.alpha = 0.7f;
    k.beta = 0.9f;
    k.lambda = 0.6f;
    k.clip_value = 0.2f;
    k.norm_scale = value_clip ? 1.0f : 0.8f;
    const PassResult rf = run_boundary_pass({true, momentum, nesterov, value_clip, true}, fused.p.data(),
                                            fused.a.data(), fused.m.data(), fused.c.data(), n, k);
    PassFlags prepare{true, momentum, nesterov, value_clip, false};
    prepare.prepare = true;
    const PassResult rs = run_boundary_pass(prepare, nullptr, split.a.data(), split.m.data(), split.c.data(), n, k);
    ASSERT_EQ(split.a, before.a) << "prepare leaves the anchor alone";
    ASSERT_EQ(split.p, before.p) << "prepare leaves the parameters alone";
    EXPECT_TRUE(apply_prepared_segment(split.p.data(), split.a.data(), split.c.data(), n));
    std::swap(split.a, split.c);
    EXPECT_EQ(split.a, fused.a) << "variant " << variant;
    EXPECT_EQ(split.m, fused.m) << "variant " << variant;
    EXPECT_EQ(split.c, fused.c) << "variant " << variant;
    EXPECT_EQ(split.p, fused.p) << "variant " << variant;
    EXPECT_EQ(rs.step_sum_squares, rf.step_sum_squares) << "variant " << variant;
    EXPECT_EQ(rs.clamped, rf.clamped) << "variant " << variant;
  }
}

// 16-bit parameters: every pass equals the fp32 pass run on the widened parameters, with the
// written parameters rounded (runtime/outer/param_types.hpp), for every flag set and both halves,
// except the deltas: a 16-bit rank trained from R(start), not from the fp32 start, so its delta
// is R(start) - p (issue 23, item 6; the identity for fp32).
template <typename P>
void check_typed_passes(size_t n) {
  for (int variant = 0; variant < 16; ++variant) {
    const bool momentum = variant & 1, nesterov = variant & 2, value_clip = variant & 4, prepare = variant & 8;
    Arrays wide(n, 17), half_state(n, 17);
    std::vector<P> half(n);
    narrow_into(wide.p.data(), half.data(), n);
    widen_into(half.data(), wide.p.data(), n);  // both start from the same representable values
    OuterCoefficients k;
    k.alpha = 0.7f;
    k.beta = 0.9f;
    k.lambda = 0.6f;
    k.clip_value = 0.2f;
    PassFlags flags{true, momentum, nesterov, value_clip, !prepare};
    flags.prepare = prepare;
    const std::vector<float> anchor_before = wide.a, params_before = wide.p;
    const PassResult rw = run_boundary_pass(flags, wide.p.data(), wide.a.data(), wide.m.data(), wide.c.data(), n, k);
    const PassResult rh =
        run_boundary_pass(flags, half.data(), half_state.a.data(), half_state.m.data(), half_state.c.data(), n, k);
    ASSERT_EQ(half_state.a, wide.a) << "variant " << variant;
    ASSERT_EQ(half_state.m, wide.m) << "variant " << variant;
    if (prepare) {
      ASSERT_EQ(half_state.c, wide.c) << "variant " << variant;  // the next anchor
    } else {
      for (size_t i = 0; i < n; ++i)
        ASSERT_EQ(half_state.c[i], widen(narrow<P>(anchor_before[i])) - params_before[i]) << variant << " " << i;
    }
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(half[i].bits, narrow<P>(wide.p[i]).bits) << "variant " << variant << " " << i;
    EXPECT_EQ(rh.step_sum_squares, rw.step_sum_squares);
    EXPECT_EQ(rh.clamped, rw.clamped);
    if (!prepare) {  // the apply half and the eager correction, from the prepared state
      std::vector<float> a = wide.a, e(n, 0.01f), q(n, 0.02f), delta(n);
      std::vector<float> a2 = a, e2 = e, q2 = q, delta2(n);
      std::vector<float> p_wide(n);
      widen_into(half.data(), p_wide.data(), n);
      EagerCoefficients ek{0.5f, 0.35f, true, nesterov};
      // The fp32 pass from the rounded start R(a + e) gives the 16-bit pass's delta, e and q.
      std::vector<float> start(n);
      for (size_t i = 0; i < n; ++i) start[i] = widen(narrow<P>(a[i] + e[i]));
      std::vector<float> offset(n, 0.0f);  // in: the start already holds e; out: the new e
      EXPECT_TRUE(eager_boundary_segment(p_wide.data(), start.data(), wide.c.data(), offset.data(), q.data(), delta.data(), n, ek));
      EXPECT_TRUE(eager_boundary_segment(half.data(), a2.data(), wide.c.data(), e2.data(), q2.data(), delta2.data(), n, ek));
      ASSERT_EQ(delta2, delta);
      ASSERT_EQ(e2, offset);
      ASSERT_EQ(q2, q);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(half[i].bits, narrow<P>(p_wide[i]).bits) << i;
      widen_into(half.data(), p_wide.data(), n);
      std::vector<float> rounded_anchor(n);
      for (size_t i = 0; i < n; ++i) rounded_anchor[i] = widen(narrow<P>(a[i]));
      EXPECT_TRUE(apply_prepared_segment(p_wide.data(), rounded_anchor.data(), wide.c.data(), n));
      EXPECT_TRUE(apply_prepared_segment(half.data(), a2.data(), wide.c.data(), n));
      ASSERT_EQ(a2, rounded_anchor);  // R(a) - p
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(half[i].bits, narrow<P>(p_wide[i]).bits) << i;
    }
  }
}

TEST_P(BoundaryPassSizes, Bf16AndFp16ParametersFollowTheFp32Pass) {
  check_typed_passes<Bf16>(GetParam());
  check_typed_passes<Fp16>(GetParam());
}

TEST(BoundaryPass, ApplyPreparedDetectsNonFiniteDelta) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Arrays x(1001, 3);
    x.p[555] = bad;
    EXPECT_FALSE(apply_prepared_segment(x.p.data(), x.a.data(), x.c.data(), x.p.size()));
  }
}

TEST(BoundaryPass, NormDependsOnlyOnValuesAndSize) {
  // The same data through the pass twice gives bit-identical norms (fixed lane order).
  for (size_t n : {size_t(5), size_t(1000), size_t(65537)}) {
    Arrays x(n, 11), y(n, 11);
    OuterCoefficients k;
    k.beta = 0.5f;
    const PassResult rx = run_boundary_pass({true, true, false, false, true}, x.p.data(), x.a.data(), x.m.data(),
                                            x.c.data(), n, k);
    const PassResult ry = run_boundary_pass({true, true, false, false, true}, y.p.data(), y.a.data(), y.m.data(),
                                            y.c.data(), n, k);
    EXPECT_EQ(rx.step_sum_squares, ry.step_sum_squares);
  }
}

TEST(BoundaryPass, DetectsNonFiniteDelta) {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Arrays x(1001, 3);
    x.p[777] = bad;
    const PassResult r = run_boundary_pass({false, false, false, false, true}, x.p.data(), x.a.data(), nullptr,
                                           x.c.data(), x.p.size(), OuterCoefficients{});
    EXPECT_FALSE(r.delta_finite);
  }
}

// Finite a, m and c whose update overflows (a - alpha*s beyond FLT_MAX): the pass reports it,
// and update_result_finite predicts it without writing anything, for every flag combination.
TEST(BoundaryPass, DetectsAnUpdateThatOverflowsFromFiniteInputs) {
  for (int variant = 0; variant < 8; ++variant) {
    PassFlags flags{true, true, (variant & 1) != 0, (variant & 2) != 0, false};
    flags.prepare = (variant & 4) != 0;
    OuterCoefficients k;
    k.alpha = 1e6f;
    k.beta = 0.5f;
    k.clip_value = 1e35f;
    Arrays x(1001, 7);
    x.a[600] = 3e38f;
    x.c[600] = -1e33f;
    const Arrays before = x;
    EXPECT_FALSE(update_result_finite(flags, x.a.data(), x.m.data(), x.c.data(), x.a.size(), k)) << variant;
    EXPECT_EQ(x.m, before.m);
    EXPECT_EQ(x.c, before.c);
    const PassResult r = run_boundary_pass(flags, x.p.data(), x.a.data(), x.m.data(), x.c.data(), x.a.size(), k);
    EXPECT_FALSE(r.result_finite) << variant;
    Arrays sane(1001, 7);
    EXPECT_TRUE(update_result_finite(flags, sane.a.data(), sane.m.data(), sane.c.data(), sane.a.size(), k)) << variant;
    EXPECT_TRUE(run_boundary_pass(flags, sane.p.data(), sane.a.data(), sane.m.data(), sane.c.data(), sane.a.size(), k)
                    .result_finite)
        << variant;
  }
}

TEST(BoundaryPass, RoundZeroOnlyWritesDeltaAndResets) {
  Arrays x(33, 5);
  const Arrays before = x;
  run_boundary_pass({false, false, false, false, true}, x.p.data(), x.a.data(), nullptr, x.c.data(), 33,
                    OuterCoefficients{});
  for (size_t i = 0; i < 33; ++i) {
    EXPECT_EQ(x.a[i], before.a[i]);
    EXPECT_EQ(x.p[i], before.a[i]);
    EXPECT_EQ(x.c[i], before.a[i] - before.p[i]);
  }
}

TEST(BoundaryPass, NormClipPrepassAndFiniteScan) {
  Arrays x(1000, 9);
  OuterCoefficients k;
  k.beta = 0.9f;
  k.lambda = 0.5f;
  double expected = 0.0;
  for (size_t i = 0; i < 1000; ++i) {
    const double u = double(0.9f * x.m[i] + 0.5f * x.c[i]);
    expected += u * u;
  }
  EXPECT_NEAR(momentum_candidate_sum_squares(x.m.data(), x.c.data(), 1000, k), expected, 1e-9 * expected);
  EXPECT_TRUE(all_finite(x.c.data(), 1000));
  x.c[999] = -std::numeric_limits<float>::infinity();
  EXPECT_FALSE(all_finite(x.c.data(), 1000));
}

}  // namespace
}  // namespace co2

// The penalty and clip-scale functions the device kernels share with the host engine.
namespace co2 {
namespace {

TEST(SharedElementMath, GapPenaltyFollowsTheRunningMean) {
  double sum = 0.0;
  uint64_t updates = 0;
  EXPECT_EQ(gap_penalty_lambda(0.0, &sum, &updates), 1.0);  // no previous step: no penalty
  EXPECT_EQ(updates, 1u);
  // A steady gap: g equals the mean of (0, g), i.e. g / (g/2) = 2 -> 1/(1+2).
  EXPECT_NEAR(gap_penalty_lambda(2.0, &sum, &updates), 1.0 / 3.0, 1e-12);
  EXPECT_EQ(sum, 2.0);
  EXPECT_EQ(updates, 2u);
  // mean of (0, 2, 2) = 4/3: lambda = 1/(1 + 2/(4/3)) = 0.4
  EXPECT_NEAR(gap_penalty_lambda(2.0, &sum, &updates), 0.4, 1e-9);
}

TEST(SharedElementMath, NormClipScale) {
  EXPECT_EQ(norm_clip_scale(0.0, 1.0), 1.0);
  EXPECT_EQ(norm_clip_scale(0.25, 1.0), 1.0);     // norm 0.5 below phi
  EXPECT_NEAR(norm_clip_scale(16.0, 1.0), 0.25, 1e-15);  // norm 4: scaled to phi
}

}  // namespace
}  // namespace co2

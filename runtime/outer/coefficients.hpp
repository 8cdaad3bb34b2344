// Per-segment scalars of the outer update, written once (docs/architecture.md, "The outer core"):
// the staleness penalty lambda from the segment's gap history, the norm-clip scale from its
// partial sums of squares, the gap g = alpha*||s|| an update leaves for the next one, and the
// OuterCoefficients a pass runs with. CO2_HOST_DEVICE: the host (runtime/outer/update_plan.cpp)
// and the device's coefficient kernels (runtime/backends/device/kernels.cu) call these functions.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/base/host_device.hpp"
#include "runtime/outer/elements.hpp"

namespace co2 {

// What the gap penalty remembers of one segment between updates.
struct GapHistory {
  double last_step_norm = 0.0;  // alpha * ||s|| of the previous update (g)
  double gap_sum = 0.0;         // sum of g over the updates so far
  uint64_t updates = 0;
};

// Gap penalty of one segment at an update (docs/algorithm.md): g = alpha*||s|| of the previous
// update; the history (sum of g, number of updates) advances by this update.
CO2_HOST_DEVICE inline double gap_penalty_lambda(double g, double* gap_sum, uint64_t* updates) {
  const double sum = *gap_sum + g;
  const uint64_t n = *updates + 1;
  *gap_sum = sum;
  *updates = n;
  if (g == 0.0) return 1.0;
  const double mean = sum / double(n);
  return 1.0 / (1.0 + g / (mean + 1e-12));
}

// The penalties, numbered as engine.hpp's Penalty (the device's Config carries the number).
constexpr int kPenaltyNone = 0, kPenaltyConstant = 1, kPenaltyGap = 2;

// Lambda of one PARAMETER segment at an update; the gap penalty advances the history
// (gap_sum, updates) from its last g.
CO2_HOST_DEVICE inline double penalty_lambda(int penalty, double penalty_constant, double g, double* gap_sum,
                                             uint64_t* updates) {
  if (penalty == kPenaltyConstant) return 1.0 / penalty_constant;
  if (penalty == kPenaltyGap) return gap_penalty_lambda(g, gap_sum, updates);
  return 1.0;
}

// Norm clipping factor min(1, phi/||u||) of a segment, from its sum of squares.
CO2_HOST_DEVICE inline double norm_clip_scale(double sum_squares, double phi) {
  const double norm = sqrt(sum_squares);
  return norm > phi ? phi / norm : 1.0;
}

// g of the next update: alpha*||s||, from the segment's sum of s^2.
CO2_HOST_DEVICE inline double step_gap(double alpha, double step_sum_squares) {
  return alpha * sqrt(step_sum_squares);
}

// The coefficients of one segment's update. PARAMETER segments take the settings, lambda and the
// norm-clip scale; BUFFER segments are only averaged (alpha 1, beta 0, lambda 1, no clip).
CO2_HOST_DEVICE inline OuterCoefficients update_coefficients_of(bool is_parameter, float anchor_weight, float alpha,
                                                                float beta, double clip_threshold, double lambda,
                                                                double norm_scale) {
  OuterCoefficients k;
  k.anchor_weight = anchor_weight;
  if (!is_parameter) return k;
  k.alpha = alpha;
  k.beta = beta;
  k.lambda = float(lambda);
  k.norm_scale = float(norm_scale);
  k.clip_value = float(clip_threshold);
  return k;
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

}  // namespace co2

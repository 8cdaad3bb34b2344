#include "runtime/outer/update_plan.hpp"

#include <algorithm>

namespace co2 {

static_assert(int(Penalty::None) == kPenaltyNone && int(Penalty::Constant) == kPenaltyConstant &&
                  int(Penalty::Gap) == kPenaltyGap,
              "the core numbers the penalties as options.hpp does");

float anchor_weight_of(bool buffer_values, const Segment& seg) {
  return anchor_weight_of(buffer_values, seg.role == Role::Parameter);
}

double segment_lambda(const OuterSettings& o, GapHistory& h) {
  return penalty_lambda(int(o.penalty), o.penalty_constant, h.last_step_norm, &h.gap_sum, &h.updates);
}

void segment_coefficients(const OuterSettings& o, const Segment& seg, double lambda, double norm_scale,
                          bool momentum, PassFlags* flags, OuterCoefficients* k) {
  const bool trained = seg.role == Role::Parameter;
  flags->update = true;
  *k = update_coefficients_of(trained, anchor_weight_of(o.buffer_values, seg), float(o.outer_lr), float(o.beta),
                              o.clip_threshold, lambda, norm_scale);
  if (!trained) return;
  flags->momentum = momentum;
  flags->nesterov = o.nesterov;
  flags->value_clip = o.clip == Clip::Value;
}

void update_coefficients(const OuterSettings& o, const Segment& seg, GapHistory& h, const float* m,
                         const float* c, PassFlags* flags, OuterCoefficients* k, UpdateSummary* sum) {
  const bool trained = seg.role == Role::Parameter;
  const double lambda = trained ? segment_lambda(o, h) : 1.0;
  segment_coefficients(o, seg, lambda, 1.0, m != nullptr, flags, k);
  if (!trained) return;
  double scale = 1.0;
  if (o.clip == Clip::Norm) {
    scale = norm_clip_scale(momentum_candidate_sum_squares(m, c, seg.count, *k), o.clip_threshold);
    segment_coefficients(o, seg, lambda, scale, m != nullptr, flags, k);
  }
  summarize_segment(lambda, scale, sum);
}

void record_update(const Segment& seg, double alpha, double step_sum_squares, GapHistory& h) {
  if (seg.role == Role::Parameter) h.last_step_norm = step_gap(alpha, step_sum_squares);
}

EagerCoefficients eager_coefficients_of(const OuterSettings& o, int participants, bool momentum) {
  EagerCoefficients k;
  k.beta = float(o.beta);
  k.scale = float(o.outer_lr / double(participants));
  k.momentum = momentum;
  k.nesterov = o.nesterov;
  return k;
}

}  // namespace co2

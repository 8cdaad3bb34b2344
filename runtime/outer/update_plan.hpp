// The host's plan of one outer update, per segment: the settings it takes, the flags and
// OuterCoefficients of its pass, the gap-history bookkeeping and the statistics it reports. Every
// backend on the host (runtime/backends/host_backend.cpp, runtime/backends/sharded_backend.cpp) calls these; the
// scalar formulas themselves are runtime/outer/coefficients.hpp's, shared with the device.
#pragma once

#include <cstdint>

#include "runtime/outer/boundary_pass.hpp"
#include "runtime/outer/layout.hpp"
#include "runtime/outer/coefficients.hpp"
#include "runtime/outer/options.hpp"
#include "runtime/outer/update_summary.hpp"

namespace co2 {

// What one outer update takes from the configuration. co2 takes it when a round's deltas are
// submitted (their average is applied a round later); diloco at the boundary.
struct OuterSettings {
  double outer_lr = 1.0;
  double beta = 0.0;  // resolved
  bool nesterov = false;
  Clip clip = Clip::None;
  double clip_threshold = 1.0;
  Penalty penalty = Penalty::None;
  double penalty_constant = 1.0;
  bool buffer_values = false;  // co2: BUFFER segments carry values (OuterCoefficients::anchor_weight)
};

// anchor_weight of `seg` under buffer_values (OuterCoefficients::anchor_weight).
float anchor_weight_of(bool buffer_values, const Segment& seg);

// Lambda of one PARAMETER segment for an update; advances the gap history `h` by it.
double segment_lambda(const OuterSettings& o, GapHistory& h);
// Flags and coefficients of one segment's update with lambda and the norm-clip scale given.
// PARAMETER segments take the settings; BUFFER segments are only averaged (alpha = 1, beta = 0,
// lambda = 1, no clip).
void segment_coefficients(const OuterSettings& o, const Segment& seg, double lambda, double norm_scale,
                          bool momentum, PassFlags* flags, OuterCoefficients* k);
// Flags and coefficients of one whole segment's outer update: lambda (advancing h), then with norm
// clipping the scale from the sum of squares of the momentum candidate beta*m + lambda*c (m may be
// null); the statistics into sum.
void update_coefficients(const OuterSettings& o, const Segment& seg, GapHistory& h, const float* m,
                         const float* c, PassFlags* flags, OuterCoefficients* k, UpdateSummary* sum);
// An update of a PARAMETER segment was applied: g of the next update into h (nothing for other
// segments). step_sum_squares: the segment's sum of s^2, whole or summed over the shards.
void record_update(const Segment& seg, double alpha, double step_sum_squares, GapHistory& h);

// The eager correction's coefficients with `participants` outer participants (W) and a stored
// momentum of the rank's own deltas or none.
EagerCoefficients eager_coefficients_of(const OuterSettings& o, int participants, bool momentum);

}  // namespace co2

// The host's plan of one outer update, per segment: the settings it takes, the flags and
// OuterCoefficients of its pass, the gap-history bookkeeping and the statistics it reports. Every
// backend on the host (runtime/backends/host_backend.cpp, runtime/backends/sharded_backend.cpp) calls these; the
// scalar formulas themselves are runtime/outer/coefficients.hpp's, shared with the device.
#pragma once

#include <cstdint>
#include <limits>

#include "runtime/outer/boundary_pass.hpp"
#include "runtime/outer/layout.hpp"
#include "runtime/outer/coefficients.hpp"
#include "runtime/outer/options.hpp"

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

// What an outer update reports to the statistics.
struct UpdateSummary {
  double penalty_min = std::numeric_limits<double>::infinity();
  double penalty_max = 0.0;
  double scale_min = 1.0;
  uint64_t clamped = 0;
  uint64_t trained_elements = 0;
  uint64_t scaled_segments = 0;
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
// The statistics of one PARAMETER segment's lambda and norm-clip scale.
void summarize_segment(const OuterSettings& o, double lambda, double norm_scale, UpdateSummary* sum);
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

// What one outer update reports to the statistics (penalty range, clipping), folded per segment
// and merged across parts by the same functions on the host, in the sharded chain and in the
// device's fold kernel: the figures of an update are written once.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/base/host_device.hpp"

namespace co2 {

// A plain aggregate (a kernel keeps an array of them in shared memory): start from
// empty_summary().
struct UpdateSummary {
  double penalty_min, penalty_max;  // over PARAMETER segments
  double scale_min;                 // norm clipping's smallest scale (1: none clipped)
  uint64_t clamped;                 // value clipping: clamped momentum elements
  uint64_t trained_elements;        // PARAMETER elements updated
  uint64_t scaled_segments;         // norm clipping: segments with scale < 1
};

CO2_HOST_DEVICE inline UpdateSummary empty_summary() { return UpdateSummary{HUGE_VAL, 0.0, 1.0, 0, 0, 0}; }

// One PARAMETER segment's penalty lambda and norm-clip scale (1 when not clipped by norm).
CO2_HOST_DEVICE inline void summarize_segment(double lambda, double norm_scale, UpdateSummary* sum) {
  sum->penalty_min = fmin(sum->penalty_min, lambda);
  sum->penalty_max = fmax(sum->penalty_max, lambda);
  sum->scale_min = fmin(sum->scale_min, norm_scale);
  sum->scaled_segments += norm_scale < 1.0;
}

// A pass over `elements` PARAMETER elements (a segment, or a shard's part of one) that clamped
// `clamped` of them.
CO2_HOST_DEVICE inline void summarize_pass(uint64_t elements, uint64_t clamped, UpdateSummary* sum) {
  sum->trained_elements += elements;
  sum->clamped += clamped;
}

// `part` (another thread's or shard's summary) merged into `sum`.
CO2_HOST_DEVICE inline void merge_summary(const UpdateSummary& part, UpdateSummary* sum) {
  sum->penalty_min = fmin(sum->penalty_min, part.penalty_min);
  sum->penalty_max = fmax(sum->penalty_max, part.penalty_max);
  sum->scale_min = fmin(sum->scale_min, part.scale_min);
  sum->scaled_segments += part.scaled_segments;
  summarize_pass(part.trained_elements, part.clamped, sum);
}

}  // namespace co2

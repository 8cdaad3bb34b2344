// The backends' shared access to the state: the parameters packed and hashed as fp32 words, the
// outer wire's segments and error feedback, the settings of an update.
#include "runtime/backends/backend_state.hpp"

#include <algorithm>

#include "runtime/base/checksum.hpp"

namespace co2 {

void wait_pending(BackendState& s) {
  auto request = std::move(s.pending);
  s.pending.reset();
  s.wait_collective(request);
}

OuterSettings outer_settings_of(const BackendState& s) {
  OuterSettings o;
  o.outer_lr = s.config.outer_lr;
  o.beta = s.beta;
  o.nesterov = s.config.nesterov;
  o.clip = s.config.clip;
  o.clip_threshold = s.config.clip_threshold;
  o.penalty = s.config.penalty;
  o.penalty_constant = s.config.penalty_constant;
  o.buffer_values = s.buffer_values();
  return o;
}

void pack_parameters(const BackendState& s, float* out) {
  for (const Segment& seg : s.segments)
    if (seg.role != Role::Excluded)
      with_params(seg, [&](auto* p) { widen_into(p, out + seg.state_offset, seg.count); });
}

void unpack_parameters(BackendState& s, const float* in, bool buffers_only) {
  for (Segment& seg : s.segments) {
    if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
    with_params(seg, [&](auto* p) { narrow_into(in + seg.state_offset, p, seg.count); });
  }
}

uint64_t parameters_checksum(const BackendState& s, bool trained_only) {
  // Widening is exact and one-to-one, so the fp32 words identify the parameters of any dtype.
  WordHasher hasher;
  float chunk[1024];
  for (const Segment& seg : s.segments) {
    if (seg.role == Role::Excluded || (trained_only && seg.role != Role::Parameter)) continue;
    if (seg.dtype == ParamDType::F32) {
      hasher.update(static_cast<const float*>(seg.data), seg.count);
      continue;
    }
    for (size_t i = 0; i < seg.count; i += 1024) {
      const size_t n = std::min<size_t>(1024, seg.count - i);
      with_params(seg, [&](auto* p) { widen_into(p + i, chunk, n); });
      hasher.update(chunk, n);
    }
  }
  return hasher.digest();
}

SegmentStarts wire_segments(const BackendState& s, size_t origin) {
  return SegmentStarts{s.segment_starts.data(), s.segment_starts.size(), origin};
}

namespace {
// Only a segment whose averages accumulate in the anchor makes up in the next round what this
// one's encodings dropped. co2's BUFFER values replace the anchor's (anchor weight 0): a
// residual added to them would shift every later value and never cancel.
bool fed_back(const BackendState& s, const Segment& seg) {
  return seg.role != Role::Excluded && anchor_weight_of(s.buffer_values(), seg) == 1.0f;
}
}  // namespace

// A non-finite residual (the round after a NaN or Inf delta) is not fed back: it would make
// every later average non-finite too.
WireCompression outer_wire(BackendState& s, float* state, size_t begin, size_t count) {
  count = std::min(count, s.state_count - begin);
  WireCompression wire;
  wire.format = s.config.wire_format;
  wire.segments = wire_segments(s, begin);
  if (s.error_feedback()) {
    const float* dropped = s.residual.data();
    for (const Segment& seg : s.segments) {
      if (!fed_back(s, seg)) continue;
      const size_t first = std::max(seg.state_offset, begin);
      const size_t last = std::min(seg.state_offset + seg.count, begin + count);
      for (size_t i = first; i < last; ++i) state[i] += fed_back(dropped[i]);
    }
    wire.residual = s.residual.data() + begin;
  }
  s.counters.wire_bytes_last_round = s.outer_wire_bytes;
  s.counters.wire_bytes_total += s.outer_wire_bytes;
  return wire;
}

}  // namespace co2

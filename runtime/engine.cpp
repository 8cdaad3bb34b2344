// Rounds and outer updates. docs/algorithm.md is the specification of everything here.
#include "runtime/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "runtime/boundary_pass.hpp"
#include "runtime/checksum.hpp"
#include "runtime/collectives.hpp"
#include "runtime/device/device_path.hpp"
#include "runtime/device/selection.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/log.hpp"
#include "runtime/observe.hpp"

namespace co2 {

namespace {

uint64_t elapsed_ns(Clock::time_point from, Clock::time_point to) {
  return to > from ? uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count())
                   : 0;
}

bool is_finite_in(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

uint32_t as_count(double value, const char* what, double min) {
  require(std::isfinite(value) && value == std::floor(value) && value >= min && value <= 1e9,
          Status::InvalidArgument,
          std::string(what) + " must be an integer in [" + std::to_string(int64_t(min)) +
              ", 1e9], got " + std::to_string(value));
  return uint32_t(value);
}

Role parse_role(int role) {
  require(role >= 0 && role <= 2, Status::UnknownEnum,
          "unknown tensor role " + std::to_string(role) +
              " (expected CO2_ROLE_PARAMETER, CO2_ROLE_BUFFER or CO2_ROLE_EXCLUDED)");
  return Role(role);
}

void validate_storage(const StorageDesc& storage) {
  switch (storage.dtype) {
    case int(ParamDType::F32):
    case int(ParamDType::BF16):
    case int(ParamDType::F16):
      break;
    case 3:
      fail(Status::Unsupported,
           "fp64 parameters are not supported: train in float32 (model.float()) or in bf16/fp16 "
           "parameters with the engine's fp32 outer state (model.bfloat16())");
    case 4:
    case 5:
      fail(Status::InvalidArgument, "dtype " + std::to_string(storage.dtype) +
                                        " is for raw collectives only, not a parameter dtype");
    default:
      fail(Status::UnknownEnum, "unknown dtype " + std::to_string(storage.dtype));
  }
  switch (storage.device) {
    case int(DeviceKind::Host):
      break;
    case int(DeviceKind::Cuda):
      // The device kernels read fp32 parameters only (docs/capi.md, "Parameter dtypes").
      require(storage.dtype == int(ParamDType::F32), Status::Unsupported,
              std::string(storage.dtype == int(ParamDType::BF16) ? "bf16" : "fp16") +
                  " parameters are supported on host tensors only: CUDA tensors must be fp32 for now");
      require(device_path_built(), Status::Unsupported,
              "CUDA tensors need a build with the cuda option (this libco2 was built without CUDA)");
      break;
    default:
      fail(Status::UnknownEnum, "unknown device kind " + std::to_string(storage.device));
  }
  require(storage.device_index >= 0, Status::InvalidArgument, "device_index must be >= 0");
}

// All tensors of an engine live in one place; the first CUDA one brings up the device path.
void note_placement(Engine::State& s, const StorageDesc& storage) {
  require(s.placement < 0 || (s.placement == storage.device && s.device_index == storage.device_index),
          Status::InvalidArgument,
          "an engine's tensors must all live on the host or all on one CUDA device (got device kind " +
              std::to_string(storage.device) + " index " + std::to_string(storage.device_index) +
              " after kind " + std::to_string(s.placement) + " index " + std::to_string(s.device_index) + ")");
  if (s.placement < 0 && storage.device == int(DeviceKind::Cuda)) s.device = make_device_path(storage.device_index);
  s.placement = storage.device;
  s.device_index = storage.device_index;
}

// A rejected first tensor or flat storage leaves the engine without a placement, as before.
class PlacementRollback {
 public:
  explicit PlacementRollback(Engine::State& s) : s_(s) {}
  ~PlacementRollback() {
    if (armed_ && s_.segments.empty() && !s_.flat) {
      s_.placement = -1;
      s_.device.reset();
    }
  }
  void dismiss() { armed_ = false; }

 private:
  Engine::State& s_;
  bool armed_ = true;
};

// Marks the caller's return to its own compute when an engine call leaves, normally or not.
struct AdvisorExitGuard {
  TauAdvisor& advisor;
  ~AdvisorExitGuard() { advisor.caller_left(Clock::now()); }
};

bool ranges_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

// The compressed outer all-reduce runs on host buffers over point-to-point transports only.
void check_wire_placement(const Engine::State& s, const StorageDesc& storage) {
  require(storage.device != int(DeviceKind::Cuda) || s.config.wire_format == WireFormat::F32,
          Status::Unsupported,
          std::string("wire_format ") + wire_format_name(s.config.wire_format) +
              " is implemented for host tensors only: an engine on CUDA tensors needs CO2_WIRE_FP32");
}

}  // namespace

void validate(const EngineConfig& c) {
  require(int(c.algorithm) >= 0 && int(c.algorithm) <= 3, Status::UnknownEnum,
          "unknown algorithm " + std::to_string(int(c.algorithm)));
  require(int(c.penalty) >= 0 && int(c.penalty) <= 2, Status::UnknownEnum,
          "unknown penalty policy " + std::to_string(int(c.penalty)));
  require(int(c.clip) >= 0 && int(c.clip) <= 2, Status::UnknownEnum,
          "unknown clip policy " + std::to_string(int(c.clip)));
  require(int(c.eager) >= -1 && int(c.eager) <= 1, Status::InvalidArgument,
          "eager must be 0 (delayed), 1 (eager) or CO2_EAGER_AUTO (-1)");
  require(c.tau >= 1, Status::InvalidArgument, "tau must be >= 1");
  require(is_finite_in(c.outer_lr, 0.0, 1e6), Status::InvalidArgument,
          "outer_lr must be finite and >= 0");
  require(c.outer_momentum < 0.0 ? c.outer_momentum == -1.0 : is_finite_in(c.outer_momentum, 0.0, 0.999999),
          Status::InvalidArgument,
          "outer_momentum must be in [0, 1) or CO2_OUTER_MOMENTUM_AUTO (-1)");
  require(is_finite_in(c.penalty_constant, 1e-12, 1e12), Status::InvalidArgument,
          "penalty_constant must be > 0");
  require(is_finite_in(c.clip_threshold, 1e-30, 1e30), Status::InvalidArgument,
          "clip_threshold must be > 0");
  require(is_finite_in(c.inner_lr, 0.0, 1e30), Status::InvalidArgument, "inner_lr must be >= 0");
  wire_format_of(int(c.wire_format));
  require(c.wire_format == WireFormat::F32 || c.algorithm == Algorithm::Co2 || c.algorithm == Algorithm::Diloco,
          Status::InvalidArgument,
          std::string("wire_format ") + wire_format_name(c.wire_format) +
              " compresses the outer all-reduce of co2 and diloco; sync and localsgd average in fp32 "
              "(use CO2_WIRE_FP32)");
}

double default_outer_momentum(int outer_participants) {
  if (outer_participants <= 16) return 0.0;
  if (outer_participants <= 32) return 0.2;
  if (outer_participants <= 64) return 0.5;
  return 0.6;
}

// ------------------------------------------------------------------------------------------
// Boundary machinery, as free functions over the state.
// ------------------------------------------------------------------------------------------
namespace {

using S = Engine::State;

void require_committed(const S& s) {
  require(s.committed, Status::InvalidState,
          "the layout is not committed yet: register tensors, then call co2_engine_commit");
}

void check_comm(const S& s) {
  if (s.comm->error_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
}


// The outer average's wire (co2, diloco): compressed as configured; with error feedback the
// deltas in `data` first take what the previous outer all-reduce's encodings dropped, and the
// residual buffer then receives this one's drops. A non-finite residual (the round after a
// NaN or Inf delta) is not fed back: it would make every later average non-finite too.
WireCompression outer_wire(S& s, float* data) {
  WireCompression wire;
  wire.format = s.config.wire_format;
  if (s.error_feedback()) {
    const float* dropped = s.residual.data();
    for (size_t i = 0; i < s.state_count; ++i) data[i] += std::isfinite(dropped[i]) ? dropped[i] : 0.0f;
    wire.residual = s.residual.data();
  }
  s.stats.wire_bytes_last_round = s.outer_wire_bytes;
  s.stats.wire_bytes_total += s.outer_wire_bytes;
  return wire;
}

// A blocking all-reduce (average) of `count` floats that reports whether the result is finite.
bool average_blocking(S& s, float* data, size_t count, Purpose purpose) {
  auto finite = std::make_shared<std::atomic<bool>>(true);
  const WireCompression wire = purpose == Purpose::OuterAverage ? outer_wire(s, data) : WireCompression{};
  auto request = s.comm->allreduce_then(
      data, count, DataType::F32, ReduceOp::Avg,
      [finite, data, count] { finite->store(all_finite(data, count)); },
      s.id(purpose), wire);
  s.stats.bytes_reduced += count * sizeof(float);
  wait_charged(s, request);
  return finite->load();
}


float* momentum_of(S& s) { return s.momentum.empty() ? nullptr : s.momentum.data(); }

// Waits for the pending average (co2). Returns whether an average is now in comm_buffer, and
// sets *finite.
bool collect_average(S& s, bool* finite) {
  *finite = true;
  if (s.pending) {
    auto request = std::move(s.pending);
    s.pending.reset();
    wait_charged(s, request);
    *finite = s.pending_result_finite.load();
    s.average_ready = false;
    return true;
  }
  if (s.average_ready) {  // collected by save, or restored from a checkpoint
    s.average_ready = false;
    *finite = s.ready_average_finite;
    if (*finite && !s.prepared.ready) {  // restored from a format without the prepared update
      s.prepared.settings = outer_settings_of(s);
      s.prepared.history = s.history;
      *finite = prepare_update(s.segments, s.anchor.data(), momentum_of(s), s.comm_buffer.data(), s.prepared);
    }
    return true;
  }
  return false;
}

// Lambda of one PARAMETER segment for an update; records g in the gap history `h`.
double segment_lambda(const OuterSettings& o, GapHistory& h) {
  switch (o.penalty) {
    case Penalty::None:
      return 1.0;
    case Penalty::Constant:
      return 1.0 / o.penalty_constant;
    case Penalty::Gap:
      return gap_penalty_lambda(h.last_step_norm, &h.gap_sum, &h.updates);
  }
  return 1.0;
}

// 0 for a BUFFER segment whose values travel instead of its delta (co2), else 1.
float buffer_anchor_weight(bool buffer_values, const Segment& seg) {
  return buffer_values && seg.role == Role::Buffer ? 0.0f : 1.0f;
}

// The coefficients of a pass that only writes deltas (no update).
OuterCoefficients delta_coefficients(const S& s, const Segment& seg) {
  OuterCoefficients k;
  k.anchor_weight = buffer_anchor_weight(s.config.algorithm == Algorithm::Co2, seg);
  return k;
}

// Flags and coefficients of one segment's outer update. PARAMETER segments take the settings and
// advance their gap history; BUFFER segments are only averaged: alpha = 1, beta = 0,
// lambda = 1, no clip. m and c (the average) feed norm clipping.
void update_coefficients(const OuterSettings& o, const Segment& seg, GapHistory& h, const float* m,
                         const float* c, PassFlags* flags, OuterCoefficients* k, UpdateSummary* sum) {
  flags->update = true;
  k->anchor_weight = buffer_anchor_weight(o.buffer_values, seg);
  if (seg.role != Role::Parameter) return;
  const double lambda = segment_lambda(o, h);
  sum->penalty_min = std::min(sum->penalty_min, lambda);
  sum->penalty_max = std::max(sum->penalty_max, lambda);
  k->alpha = float(o.outer_lr);
  k->beta = float(o.beta);
  k->lambda = float(lambda);
  flags->momentum = m != nullptr;
  flags->nesterov = o.nesterov;
  flags->value_clip = o.clip == Clip::Value;
  k->clip_value = float(o.clip_threshold);
  if (o.clip == Clip::Norm) {
    const double scale =
        norm_clip_scale(momentum_candidate_sum_squares(m, c, seg.count, *k), o.clip_threshold);
    k->norm_scale = float(scale);
    sum->scale_min = std::min(sum->scale_min, scale);
    sum->scaled_segments += scale < 1.0;
  }
}

void record_update(const Segment& seg, const PassResult& r, const OuterCoefficients& k, GapHistory& h,
                   UpdateSummary* sum) {
  if (seg.role != Role::Parameter) return;
  h.last_step_norm = double(k.alpha) * std::sqrt(r.step_sum_squares);
  sum->clamped += r.clamped;
  sum->trained_elements += seg.count;
}

// An applied update counts; its figures (when known) become the last_* statistics.
void commit_update(S& s, Clip clip, const UpdateSummary* sum) {
  ++s.stats.outer_updates;
  if (!sum) return;
  s.stats.last_penalty_min = s.num_trained ? sum->penalty_min : 1.0;
  s.stats.last_penalty_max = s.num_trained ? sum->penalty_max : 1.0;
  s.stats.last_clip_scale_min = sum->scale_min;
  if (clip == Clip::Value)
    s.stats.last_clip_fraction = sum->trained_elements ? double(sum->clamped) / double(sum->trained_elements) : 0.0;
  else if (clip == Clip::Norm)
    s.stats.last_clip_fraction = s.num_trained ? double(sum->scaled_segments) / double(s.num_trained) : 0.0;
  else
    s.stats.last_clip_fraction = 0.0;
}

// co2 without an update to apply: comm_buffer <- a - p, p <- a. Returns whether every delta
// was finite.
bool write_deltas(S& s) {
  const TraceSpan pass(s.trace.get(), "delta pass");
  bool delta_finite = true;
  for (const Segment& seg : s.segments) {
    if (seg.role == Role::Excluded) continue;
    const size_t off = seg.state_offset;
    const PassFlags flags{false, false, false, false, true};
    const PassResult r = with_params(seg, [&](auto* p) {
      return run_boundary_pass(flags, p, s.anchor.data() + off, nullptr, s.comm_buffer.data() + off, seg.count,
                               delta_coefficients(s, seg));
    });
    delta_finite = delta_finite && r.delta_finite;
  }
  return delta_finite;
}

}  // namespace

// The first half of the split pass: from the average in `comm`, the new momentum (in place) and
// the next anchor (into `comm`); `anchor` is only read. Runs on the progress thread for co2.
// Returns false, leaving the anchor and momentum as they were, when the result would not be
// finite (an overflow from finite inputs); `comm` no longer holds the average then.
bool prepare_update(const std::vector<Segment>& segments, float* anchor, float* momentum, float* comm,
                    PreparedUpdate& prepared, bool params_follow) {
  prepared.ready = false;
  prepared.summary = UpdateSummary{};
  struct Planned {
    PassFlags flags{false, false, false, false, false};
    OuterCoefficients k;
  };
  std::vector<Planned> plan(segments.size());
  for (size_t index = 0; index < segments.size(); ++index) {
    const Segment& seg = segments[index];
    if (seg.role == Role::Excluded) continue;
    const size_t off = seg.state_offset;
    Planned& p = plan[index];
    p.flags.prepare = true;
    update_coefficients(prepared.settings, seg, prepared.history[index], momentum ? momentum + off : nullptr,
                        comm + off, &p.flags, &p.k, &prepared.summary);
    // The pass writes the momentum in place: with one, an overflow must be ruled out first.
    if (momentum && !update_result_finite(p.flags, anchor + off, momentum + off, comm + off, seg.count, p.k))
      return false;
  }
  bool finite = true;
  for (size_t index = 0; index < segments.size(); ++index) {
    const Segment& seg = segments[index];
    if (seg.role == Role::Excluded) continue;
    const size_t off = seg.state_offset;
    float* m = momentum ? momentum + off : nullptr;
    const PassResult r = with_params(seg, [&](auto* p) {
      return run_boundary_pass(plan[index].flags, params_follow ? p : nullptr, anchor + off, m, comm + off,
                               seg.count, plan[index].k);
    });
    finite = finite && r.result_finite;
    record_update(seg, r, plan[index].k, prepared.history[index], &prepared.summary);
  }
  prepared.summary_known = true;
  prepared.ready = finite;
  return finite;
}

OuterSettings outer_settings_of(const Engine::State& s) {
  OuterSettings o;
  o.outer_lr = s.config.outer_lr;
  o.beta = s.beta;
  o.nesterov = s.config.nesterov;
  o.clip = s.config.clip;
  o.clip_threshold = s.config.clip_threshold;
  o.penalty = s.config.penalty;
  o.penalty_constant = s.config.penalty_constant;
  o.buffer_values = s.config.algorithm == Algorithm::Co2;
  return o;
}

namespace {

// co2: the all-reduce of this round's deltas. Its update is prepared on the progress thread as
// soon as the average is known to be finite, with the settings in effect now; "finite" covers
// the prepared next anchor too.
void submit_average_async(S& s) {
  s.pending_result_finite.store(true);
  s.prepared.ready = false;
  s.prepared.settings = outer_settings_of(s);
  s.prepared.history = s.history;
  float* data = s.comm_buffer.data();
  float* anchor = s.anchor.data();
  float* momentum = momentum_of(s);
  const size_t count = s.state_count;
  std::atomic<bool>* finite = &s.pending_result_finite;
  const std::vector<Segment>* segments = &s.segments;  // fixed after commit
  PreparedUpdate* prepared = &s.prepared;
  Trace* trace = s.trace.get();  // outlives the collective: the engine waits for it
  const WireCompression wire = outer_wire(s, data);
  s.pending = s.comm->allreduce_then(data, count, DataType::F32, ReduceOp::Avg, [=] {
    const Clock::time_point start = trace ? Clock::now() : Clock::time_point{};
    finite->store(all_finite(data, count) && prepare_update(*segments, anchor, momentum, data, *prepared));
    if (trace) trace->span(Trace::Lane::BulkLane, "prepare pass", start, Clock::now());
  }, s.id(Purpose::OuterAverage), wire);
  s.stats.bytes_reduced += count * sizeof(float);
}

// After the prepared next anchor was swapped in: its gap history and statistics become the
// engine's.
void adopt_prepared(S& s) {
  std::swap(s.history, s.prepared.history);
  commit_update(s, s.prepared.settings.clip, s.prepared.summary_known ? &s.prepared.summary : nullptr);
  s.prepared.ready = false;
}

// Swaps in the prepared update (prepared.ready): the anchor becomes the next anchor and the
// parameters follow it (params_current: they already did, in the prepare pass). write_delta:
// comm_buffer receives this round's deltas a - p instead. Returns whether every delta was finite.
bool apply_prepared(S& s, bool write_delta, bool params_current = false) {
  const TraceSpan pass(s.trace.get(), "apply pass");
  bool delta_finite = true;
  if (write_delta) {
    for (const Segment& seg : s.segments)
      if (seg.role != Role::Excluded)
        delta_finite = with_params(seg, [&](auto* p) {
                         return apply_prepared_segment(p, s.anchor.data() + seg.state_offset,
                                                       s.comm_buffer.data() + seg.state_offset, seg.count,
                                                       delta_coefficients(s, seg).anchor_weight);
                       }) && delta_finite;
    std::swap(s.anchor, s.comm_buffer);
  } else {
    std::swap(s.anchor, s.comm_buffer);
    if (!params_current) set_parameters_to_anchor(s);
  }
  adopt_prepared(s);
  return delta_finite;
}

void clear_eager_state(S& s) {
  if (!s.eager_offset.empty()) std::memset(s.eager_offset.data(), 0, s.state_count * sizeof(float));
  if (!s.eager_momentum.empty()) std::memset(s.eager_momentum.data(), 0, s.state_count * sizeof(float));
}

// A co2 boundary under the eager policy (docs/algorithm.md, "The eager policy"): the anchor
// follows the delayed rule exactly as without it; each PARAMETER segment's delta is taken from
// the point the rank started at (anchor + its offset) and the next round starts from the next
// anchor plus the new offset. BUFFER segments are only averaged, as always. update: an arrived,
// finite average, whose update collect_average prepared, is applied. Returns whether every delta
// was finite.
bool eager_boundary(S& s, bool update) {
  const TraceSpan pass(s.trace.get(), "eager pass");
  const OuterSettings o = outer_settings_of(s);
  EagerCoefficients k;
  k.beta = float(o.beta);
  k.scale = float(o.outer_lr / double(s.comm->size()));
  k.momentum = !s.eager_momentum.empty();
  k.nesterov = o.nesterov;
  bool delta_finite = true;
  for (const Segment& seg : s.segments) {
    if (seg.role == Role::Excluded) continue;
    const size_t off = seg.state_offset;
    float* anchor = s.anchor.data() + off;
    float* comm = s.comm_buffer.data() + off;
    // With an update the comm buffer holds the next anchor and the delta goes into the anchor's
    // buffer (the two swap below); without one the anchor stays and the delta goes to comm.
    float* next = update ? comm : anchor;
    float* delta = update ? anchor : comm;
    const bool finite = with_params(seg, [&](auto* p) {
      if (seg.role == Role::Parameter)
        return eager_boundary_segment(p, anchor, next, s.eager_offset.data() + off,
                                      k.momentum ? s.eager_momentum.data() + off : nullptr, delta, seg.count, k);
      const OuterCoefficients k_buffer = delta_coefficients(s, seg);
      if (update) return apply_prepared_segment(p, anchor, comm, seg.count, k_buffer.anchor_weight);
      const PassFlags flags{false, false, false, false, true};
      return run_boundary_pass(flags, p, anchor, nullptr, comm, seg.count, k_buffer).delta_finite;
    });
    delta_finite = delta_finite && finite;
  }
  if (update) {
    std::swap(s.anchor, s.comm_buffer);
    adopt_prepared(s);
  }
  if (!delta_finite) {
    // This rank's NaN travels in the all-reduce and every rank skips that average; meanwhile the
    // rank restarts from the anchor instead of carrying the NaN in its offset.
    clear_eager_state(s);
    set_parameters_to_anchor(s);
  }
  return delta_finite;
}

// Packs the PARAMETER and BUFFER parameters into `out` (state order).
// Parameters of other dtypes are widened to fp32 (exact).
void pack_parameters(const S& s, float* out) {
  for (const Segment& seg : s.segments)
    if (seg.role != Role::Excluded)
      with_params(seg, [&](auto* p) { widen_into(p, out + seg.state_offset, seg.count); });
}

// Rounds to the parameters' dtype (nearest even).
void unpack_parameters(S& s, const float* in, bool buffers_only) {
  for (Segment& seg : s.segments) {
    if (seg.role == Role::Excluded || (buffers_only && seg.role != Role::Buffer)) continue;
    with_params(seg, [&](auto* p) { narrow_into(in + seg.state_offset, p, seg.count); });
  }
}

}  // namespace

// Blocks on a request, charging the time to the boundary-wait statistics.
void wait_charged(Engine::State& s, const std::shared_ptr<Request>& request) {
  const auto start = Clock::now();
  const Status status = request->wait_status();
  const auto end = Clock::now();
  const uint64_t waited = elapsed_ns(start, end);
  s.stats.boundary_wait_ns += waited;
  s.stats.last_boundary_wait_ns = waited;
  if (status != Status::Ok) {
    const std::string message = s.comm->error_message();
    fail(status, message.empty() ? "collective failed" : message);
  }
  const uint64_t collective = elapsed_ns(request->submitted_at(), request->completed_at());
  s.stats.collective_ns += collective;
  s.advisor.allreduce_completed(collective);
  observe_collective(s, *request, start, end);
}

uint64_t consensus_checksum(const Engine::State& s) {
  WordHasher hasher;
  if (s.has_anchor()) {
    hasher.update(s.anchor.data(), s.state_count);
  } else {
    // Widening is exact and one-to-one, so the fp32 words identify the parameters of any dtype.
    float chunk[1024];
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
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
  }
  return hasher.digest();
}

// All ranks compare a 64-bit value; every rank learns of a difference.
bool same_on_every_rank(Engine::State& s, uint64_t value, Purpose purpose) {
  const int w = s.comm->size();
  std::vector<int64_t> all(size_t(w), 0);
  int64_t mine;
  std::memcpy(&mine, &value, sizeof mine);
  auto request = s.comm->allgather(&mine, all.data(), 1, DataType::I64, s.id(purpose));
  if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  observe_control_collective(s, *request);
  return std::all_of(all.begin(), all.end(), [&](int64_t v) { return v == all[0]; });
}

void check_anchor(Engine::State& s) {
  ++s.stats.anchor_checks;
  if (!same_on_every_rank(s, consensus_checksum(s), Purpose::AnchorCheck))
    fail(Status::AnchorMismatch,
         "anchor checksums differ across ranks: the ranks no longer train the same model "
         "(memory corruption or a non-deterministic framework step); restore a checkpoint");
}

void check_anchor_when_due(Engine::State& s) {
  const uint32_t k = s.config.anchor_check_interval;
  if (k && s.stats.rounds % k == 0) check_anchor(s);
}

void collect_pending_average(Engine::State& s) {
  if (!s.pending) return;
  bool finite = true;
  collect_average(s, &finite);
  s.average_ready = true;
  s.ready_average_finite = finite;
}

void set_parameters_to_anchor(Engine::State& s) { unpack_parameters(s, s.anchor.data(), false); }

void set_parameters_to_round_start(Engine::State& s) {
  set_parameters_to_anchor(s);
  if (s.eager_offset.empty()) return;
  for (const Segment& seg : s.segments) {
    if (seg.role != Role::Parameter) continue;
    const float* a = s.anchor.data() + seg.state_offset;
    const float* e = s.eager_offset.data() + seg.state_offset;
    with_params(seg, [&](auto* p) {
      using P = std::remove_pointer_t<decltype(p)>;
      for (size_t i = 0; i < seg.count; ++i) p[i] = narrow<P>(a[i] + e[i]);
    });
  }
}

namespace {

// --- boundaries of each algorithm; each returns false when it applied nothing because an
// average was not finite ---

bool co2_boundary(S& s) {
  bool finite = true;
  const bool have_average = collect_average(s, &finite);
  const bool update = have_average && finite;
  if (have_average && !finite) ++s.stats.nonfinite_rounds;
  const bool delta_finite =
      s.eager()  ? eager_boundary(s, update)
      : update ? apply_prepared(s, /*write_delta=*/true)
               : write_deltas(s);
  if (!delta_finite) ++s.stats.nonfinite_local;
  check_anchor_when_due(s);
  submit_average_async(s);
  return !have_average || finite;
}

bool diloco_boundary(S& s) {
  // c = a - p (a co2 engine's warm-up: -p for BUFFER segments), averaged with a blocking
  // all-reduce.
  float* comm = s.comm_buffer.data();
  for (const Segment& seg : s.segments) {
    if (seg.role == Role::Excluded) continue;
    const float* a = s.anchor.data() + seg.state_offset;
    float* c = comm + seg.state_offset;
    const float w = delta_coefficients(s, seg).anchor_weight;
    with_params(seg, [&](auto* p) {
      for (size_t i = 0; i < seg.count; ++i) c[i] = w * a[i] - widen(p[i]);
    });
  }
  // Prepared like co2's update, so that a result that overflows is found before the anchor
  // takes it. The parameters take the next anchor in the same pass; a refused update resets
  // them to the unchanged anchor.
  s.prepared.settings = outer_settings_of(s);
  s.prepared.history = s.history;
  if (!average_blocking(s, comm, s.state_count, Purpose::OuterAverage) ||
      !prepare_update(s.segments, s.anchor.data(), momentum_of(s), comm, s.prepared, /*params_follow=*/true)) {
    ++s.stats.nonfinite_rounds;
    set_parameters_to_anchor(s);
    return false;
  }
  apply_prepared(s, /*write_delta=*/false, /*params_current=*/true);
  check_anchor_when_due(s);
  return true;
}

// Blocking average of the parameters across ranks; buffers_only: only BUFFER segments take it.
// False (nothing changed) when the average was not finite.
bool average_parameters(S& s, bool buffers_only) {
  pack_parameters(s, s.comm_buffer.data());
  if (!average_blocking(s, s.comm_buffer.data(), s.state_count, Purpose::ParameterAverage)) {
    ++s.stats.nonfinite_rounds;
    return false;
  }
  unpack_parameters(s, s.comm_buffer.data(), buffers_only);
  return true;
}

bool localsgd_boundary(S& s) {
  if (!average_parameters(s, /*buffers_only=*/false)) return false;
  check_anchor_when_due(s);
  return true;
}

bool sync_boundary(S& s) {
  // Gradients were averaged by reduce_gradients; here only BUFFER segments are averaged.
  if (s.state_count > s.trained_count && !average_parameters(s, /*buffers_only=*/true)) return false;
  check_anchor_when_due(s);
  return true;
}

// co2: waits for the pending average and applies it; parameters = anchor. Returns false when
// the average was not finite (nothing applied).
bool apply_pending(S& s) {
  clear_eager_state(s);  // every rank's own deltas are in the average being applied
  bool finite = true;
  const bool have_average = collect_average(s, &finite);
  if (have_average && finite) {
    apply_prepared(s, /*write_delta=*/false);
    return true;
  }
  if (have_average) ++s.stats.nonfinite_rounds;
  set_parameters_to_anchor(s);
  return !have_average;
}

void throw_nonfinite() {
  fail(Status::NonFinite,
       "the averaged update contains NaN or Inf; nothing was applied on any rank (the anchor "
       "is unchanged): lower the learning rate or skip the offending data");
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Engine
// ------------------------------------------------------------------------------------------

Engine::Engine(std::shared_ptr<Communicator> comm, const EngineConfig& config)
    : state_(std::make_unique<State>()) {
  require(comm != nullptr, Status::InvalidArgument, "communicator is NULL");
  validate(config);
  State& s = *state_;
  s.comm = std::move(comm);
  s.owner = s.comm->register_owner();
  s.config = config;
  s.beta_auto = config.outer_momentum < 0.0;
  s.beta = s.beta_auto ? default_outer_momentum(s.comm->size()) : config.outer_momentum;
  s.round_tau = config.tau;
  s.stats.world_size = s.comm->size();
  s.stats.resolved_outer_momentum = s.beta;
  s.trace = Trace::from_environment(s.comm->rank(), s.owner);
}

Engine::~Engine() {
  if (state_ && state_->device) state_->device->drain(*state_);
  if (state_ && state_->pending) state_->pending->wait_status();
  if (state_) finish_observing(*state_);
}

void Engine::register_tensor(const TensorDesc& t) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed: register tensors before co2_engine_commit");
  require(!t.name.empty(), Status::InvalidArgument, "tensor name is empty");
  require(t.data != nullptr, Status::InvalidArgument, "tensor '" + t.name + "' has a NULL data pointer");
  require(t.count >= 1, Status::InvalidArgument, "tensor '" + t.name + "' has count 0");
  require(t.count <= (size_t(1) << 40), Status::InvalidArgument, "tensor '" + t.name + "' is implausibly large");
  check_wire_placement(s, t.storage);
  validate_storage(t.storage);
  const Role role = parse_role(t.role);
  const ParamDType dtype = ParamDType(t.storage.dtype);
  const size_t bytes = t.count * element_bytes(dtype);
  PlacementRollback rollback(s);
  note_placement(s, t.storage);
  if (s.device) s.device->check_device_memory(t.data, bytes, "tensor '" + t.name + "'");
  for (const Segment& seg : s.segments) {
    require(seg.name != t.name, Status::DuplicateTensor, "a tensor named '" + t.name + "' is already registered");
    require(!ranges_overlap(seg.data, seg.bytes(), t.data, bytes), Status::DuplicateTensor,
            "tensor '" + t.name + "' overlaps the memory of '" + seg.name +
                "' (tied weights: register the shared tensor once)");
  }
  require(!s.flat || !ranges_overlap(s.flat, s.flat_count * element_bytes(s.flat_dtype), t.data, bytes),
          Status::DuplicateTensor, "tensor '" + t.name + "' overlaps the engine's flat storage");
  s.segments.push_back(Segment{t.name, t.data, t.count, role, 0, dtype});
  rollback.dismiss();
}

void* Engine::alloc_flat(size_t count, const StorageDesc& storage) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(!s.flat, Status::InvalidState, "this engine already has flat storage (one per engine)");
  require(count >= 1 && count <= (size_t(1) << 40), Status::InvalidArgument, "flat storage count must be >= 1");
  check_wire_placement(s, storage);
  validate_storage(storage);
  PlacementRollback rollback(s);
  note_placement(s, storage);
  s.flat_dtype = ParamDType(storage.dtype);
  if (s.device) {
    s.flat = s.device->allocate_flat(s, count);
    s.flat_count = count;
    rollback.dismiss();
    return s.flat;
  }
  // 16-bit elements: half as many fp32 words, rounded up.
  const size_t words = (count * element_bytes(s.flat_dtype) + sizeof(float) - 1) / sizeof(float);
  s.owned_flat = FloatBuffer(words);  // may throw: the rollback then unpins the host
  rollback.dismiss();
  s.flat = s.owned_flat.data();
  s.flat_count = count;
  return s.flat;
}

void Engine::adopt_flat(void* data, size_t count, const StorageDesc& storage) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(!s.flat, Status::InvalidState, "this engine already has flat storage (one per engine)");
  require(data != nullptr, Status::InvalidArgument, "flat storage pointer is NULL");
  require(count >= 1 && count <= (size_t(1) << 40), Status::InvalidArgument, "flat storage count must be >= 1");
  check_wire_placement(s, storage);
  validate_storage(storage);
  const ParamDType dtype = ParamDType(storage.dtype);
  const size_t bytes = count * element_bytes(dtype);
  for (const Segment& seg : s.segments)
    require(!ranges_overlap(seg.data, seg.bytes(), data, bytes), Status::DuplicateTensor,
            "the adopted flat storage overlaps registered tensor '" + seg.name + "'");
  PlacementRollback rollback(s);
  note_placement(s, storage);
  if (s.device) s.device->check_device_memory(data, bytes, "the adopted flat storage");
  rollback.dismiss();
  s.flat = data;
  s.flat_count = count;
  s.flat_dtype = dtype;
}

void Engine::set_device_allocator(const DeviceAllocator& allocator) {
  State& s = *state_;
  require(device_path_built(), Status::Unsupported,
          "a device allocator needs a build with the cuda option (this libco2 was built without CUDA)");
  require(!s.committed && !(s.device && s.flat), Status::InvalidState,
          "set the allocator before co2_engine_alloc_flat and co2_engine_commit: device memory was already allocated");
  require((allocator.allocate == nullptr) == (allocator.release == nullptr), Status::InvalidArgument,
          "co2_allocator_t needs both allocate and release (or neither, for cudaMalloc)");
  s.allocator = allocator;
}

void Engine::add_segment(const SegmentDesc& d) {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is committed");
  require(s.flat != nullptr, Status::InvalidState, "no flat storage: call co2_engine_alloc_flat or co2_engine_adopt_flat first");
  require(!d.name.empty(), Status::InvalidArgument, "segment name is empty");
  require(d.count >= 1, Status::InvalidArgument, "segment '" + d.name + "' has count 0");
  require(d.offset < s.flat_count && d.count <= s.flat_count - d.offset, Status::InvalidArgument,
          "segment '" + d.name + "' [" + std::to_string(d.offset) + ", +" + std::to_string(d.count) +
              ") lies outside the flat storage of " + std::to_string(s.flat_count) + " elements");
  const Role role = parse_role(d.role);
  const size_t element = element_bytes(s.flat_dtype);
  void* data = static_cast<char*>(s.flat) + d.offset * element;
  for (const Segment& seg : s.segments) {
    require(seg.name != d.name, Status::DuplicateTensor, "a segment named '" + d.name + "' already exists");
    require(!ranges_overlap(seg.data, seg.bytes(), data, d.count * element), Status::DuplicateTensor,
            "segment '" + d.name + "' overlaps '" + seg.name + "'");
  }
  s.segments.push_back(Segment{d.name, data, d.count, role, 0, s.flat_dtype});
}

void Engine::commit() {
  State& s = *state_;
  require(!s.committed, Status::InvalidState, "the layout is already committed");
  check_comm(s);
  std::string why;
  device::choose_averaging(s.device ? device::Placement::Device : device::Placement::Host,
                           s.comm->collective_stream() != nullptr, &why);
  require(why.empty(), Status::InvalidArgument, why);
  ByteHasher layout;
  size_t offset = 0;
  s.num_trained = 0;
  s.trained_count = 0;
  for (Segment& seg : s.segments) {
    layout.update_string(seg.name);
    layout.update_u64(seg.count);
    layout.update_u64(uint64_t(seg.role));
    layout.update_u64(uint64_t(seg.dtype));
    if (seg.role == Role::Excluded) continue;
    seg.state_offset = offset;
    offset += seg.count;
    if (seg.role == Role::Parameter) {
      ++s.num_trained;
      s.trained_count += seg.count;
    }
  }
  require(offset > 0, Status::InvalidState,
          "nothing to train: register at least one PARAMETER or BUFFER tensor before commit");
  s.state_count = offset;
  // Host and CUDA ranks in one group would each run their own path to the same collective
  // sequence and only find out at the first anchor check: the placement is part of the layout
  // (mixed in for CUDA only, so that host checkpoints of 1.0 keep their layout hash).
  if (s.device) layout.update_u64(uint64_t(DeviceKind::Cuda));
  s.layout_hash = layout.digest();
  if (!same_on_every_rank(s, s.layout_hash, Purpose::LayoutHash))
    fail(Status::LayoutMismatch,
         "ranks registered different parameter layouts (names, counts, roles, dtypes, order, "
         "or host against CUDA tensors differ); every rank must register the same tensors in the "
         "same order, in the same kind of memory");

  s.history.assign(s.segments.size(), GapHistory{});
  // As a ring all-reduce sends it (a collective-kind transport's own algorithm may differ).
  collectives::Tuning tuning;
  tuning.chunk_bytes = s.comm->options().chunk_bytes;
  s.outer_wire_bytes = collectives::allreduce_wire_bytes(s.comm->rank(), s.comm->size(), s.state_count,
                                                         s.config.wire_format, tuning);
  s.eager_resolved = s.config.eager == Eager::On || (s.config.eager == Eager::Auto && !s.device);
  if (s.device) {
    require(!(s.config.eager == Eager::On && s.config.algorithm == Algorithm::Co2), Status::Unsupported,
            "the eager policy is implemented on the host only: CUDA tensors need eager = 0 or "
            "CO2_EAGER_AUTO (which runs the delayed update there)");
    if (s.config.eager == Eager::Auto && s.config.algorithm == Algorithm::Co2)
      log::info("eager policy: not implemented for CUDA tensors yet; this engine runs the delayed update");
    s.device->commit(s);
    s.committed = true;
    return;
  }
  s.comm_buffer = FloatBuffer(s.state_count);
  if (s.has_anchor()) {
    s.anchor = FloatBuffer(s.state_count);
    if (s.momentum_needed()) s.momentum = FloatBuffer(s.state_count);
  }
  if (s.eager()) {
    s.eager_offset = FloatBuffer(s.state_count);
    if (s.momentum_needed()) s.eager_momentum = FloatBuffer(s.state_count);
  }
  if (s.error_feedback()) s.residual = FloatBuffer(s.state_count);
  // Rank 0's values become everyone's parameters and anchor.
  pack_parameters(s, s.comm_buffer.data());
  auto request = s.comm->broadcast(s.comm_buffer.data(), s.state_count, DataType::F32, 0,
                                   s.id(Purpose::InitialBroadcast));
  if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  unpack_parameters(s, s.comm_buffer.data(), false);
  if (s.has_anchor()) std::memcpy(s.anchor.data(), s.comm_buffer.data(), s.state_count * sizeof(float));
  std::memset(s.comm_buffer.data(), 0, s.state_count * sizeof(float));
  s.committed = true;
}

bool Engine::step(void* stream) {
  State& s = *state_;
  require_committed(s);
  const Clock::time_point entered = Clock::now();
  if (s.trace) trace_caller_step(s, entered);
  s.advisor.caller_entered(entered);
  s.advisor.step_ended();
  const AdvisorExitGuard left{s.advisor};
  ++s.stats.steps;
  if (++s.steps_in_round < s.round_tau) return false;
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;  // a tau change takes effect here
  ++s.stats.rounds;
  const TraceSpan boundary(s.trace.get(), "boundary", "round", s.stats.rounds);
  check_comm(s);
  bool applied;
  const bool warmup = s.stats.rounds <= s.config.warmup_sync_rounds;
  if (s.device) {
    applied = s.device->boundary(s, stream);
    observe_round(s);  // on every rank, applied or not: the agreements stay paired
    if (!applied) throw_nonfinite();
    return true;
  }
  switch (s.config.algorithm) {
    case Algorithm::Co2:
      applied = warmup ? diloco_boundary(s) : co2_boundary(s);
      break;
    case Algorithm::Diloco:
      applied = diloco_boundary(s);
      break;
    case Algorithm::LocalSgd:
      applied = localsgd_boundary(s);
      break;
    case Algorithm::Sync:
    default:
      applied = sync_boundary(s);
      break;
  }
  observe_round(s);
  if (!applied) throw_nonfinite();
  return true;
}

void Engine::reduce_gradients(void* const* grads, size_t num_grads, void* stream) {
  State& s = *state_;
  require_committed(s);
  require(grads != nullptr, Status::InvalidArgument, "grads is NULL");
  require(num_grads == s.num_trained, Status::InvalidArgument,
          "num_grads is " + std::to_string(num_grads) + " but " + std::to_string(s.num_trained) +
              " PARAMETER tensors are registered");
  check_comm(s);
  const Clock::time_point entered = Clock::now();
  if (s.trace) trace_caller_step(s, entered);
  s.advisor.caller_entered(entered);
  const AdvisorExitGuard left{s.advisor};
  const TraceSpan call(s.trace.get(), "reduce-gradients");
  if (s.device) return s.device->reduce_gradients(s, grads, num_grads, stream);
  FloatBuffer* buffer = &s.comm_buffer;
  if (s.config.algorithm != Algorithm::Sync) {  // comm_buffer may hold an average in flight
    if (s.gradient_buffer.empty()) s.gradient_buffer = FloatBuffer(s.trained_count);
    buffer = &s.gradient_buffer;
  }
  float* packed = buffer->data();
  size_t offset = 0, i = 0;
  for (const Segment& seg : s.segments) {
    if (seg.role != Role::Parameter) continue;
    // Gradients have their parameter's dtype: widened here, summed in fp32, rounded back below.
    if (grads[i])
      with_params(seg, [&](auto* p) { widen_into(static_cast<decltype(p)>(grads[i]), packed + offset, seg.count); });
    else
      std::memset(packed + offset, 0, seg.count * sizeof(float));
    offset += seg.count;
    ++i;
  }
  if (!average_blocking(s, packed, s.trained_count, Purpose::GradientAverage))
    fail(Status::NonFinite,
         "the averaged gradient contains NaN or Inf; the gradients were left as they were: skip "
         "this optimizer step");
  offset = 0;
  i = 0;
  for (const Segment& seg : s.segments) {
    if (seg.role != Role::Parameter) continue;
    if (grads[i])
      with_params(seg, [&](auto* p) { narrow_into(packed + offset, static_cast<decltype(p)>(grads[i]), seg.count); });
    offset += seg.count;
    ++i;
  }
}

void Engine::finalize() {
  State& s = *state_;
  require_committed(s);
  const RoundsSettled settled(s, /*finalizing=*/true);
  const TraceSpan call(s.trace.get(), "finalize");
  s.advisor.pause();
  if (s.config.algorithm != Algorithm::Co2) return synchronize();
  check_comm(s);
  if (s.device) return s.device->finalize(s);
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;
  if (!apply_pending(s)) throw_nonfinite();
}

void Engine::synchronize() {
  State& s = *state_;
  require_committed(s);
  const RoundsSettled settled(s, /*finalizing=*/false);
  const TraceSpan call(s.trace.get(), "synchronize");
  s.advisor.pause();
  check_comm(s);
  if (s.device) return s.device->synchronize(s);
  const bool mid_round = s.steps_in_round > 0;
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;
  bool applied = true;
  switch (s.config.algorithm) {
    case Algorithm::Co2:
      // A boundary now, then wait for its average and apply it: nothing local is lost.
      if (mid_round) applied = co2_boundary(s);
      applied = apply_pending(s) && applied;
      break;
    case Algorithm::Diloco:
      if (mid_round) applied = diloco_boundary(s);
      else set_parameters_to_anchor(s);
      break;
    case Algorithm::LocalSgd:
      applied = localsgd_boundary(s);
      break;
    case Algorithm::Sync:
      applied = sync_boundary(s);
      break;
  }
  if (!applied) throw_nonfinite();
  check_anchor(s);
}

void Engine::consensus(ConsensusKind kind, float* out, size_t count) {
  State& s = *state_;
  require_committed(s);
  require(out != nullptr, Status::InvalidArgument, "output buffer is NULL");
  require(count == s.state_count, Status::InvalidArgument,
          "output count is " + std::to_string(count) + " but the consensus has " +
              std::to_string(s.state_count) + " elements (co2_engine_num_elements)");
  s.advisor.pause();
  if (s.device) return s.device->consensus(s, kind, out, count);
  switch (kind) {
    case ConsensusKind::Anchor:
      if (s.has_anchor()) {
        std::memcpy(out, s.anchor.data(), count * sizeof(float));
      } else {
        require(s.config.algorithm == Algorithm::Sync, Status::Unsupported,
                "localsgd keeps no anchor: use CO2_CONSENSUS_LOCAL_AVERAGE");
        pack_parameters(s, out);
      }
      return;
    case ConsensusKind::LocalAverage: {
      check_comm(s);
      pack_parameters(s, out);
      auto request =
          s.comm->allreduce(out, count, DataType::F32, ReduceOp::Avg, s.id(Purpose::Consensus));
      if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
      return;
    }
  }
  fail(Status::UnknownEnum, "unknown consensus kind " + std::to_string(int(kind)));
}

size_t Engine::num_elements() const {
  require_committed(*state_);
  return state_->state_count;
}

void Engine::set_param(Param key, double value) {
  State& s = *state_;
  EngineConfig next = s.config;
  switch (key) {
    case Param::OuterLr:
      next.outer_lr = value;
      break;
    case Param::OuterMomentum:
      require(is_finite_in(value, 0.0, 0.999999), Status::InvalidArgument, "outer momentum must be in [0, 1)");
      next.outer_momentum = value;
      break;
    case Param::Tau:
      next.tau = as_count(value, "tau", 1);
      break;
    case Param::ClipThreshold:
      next.clip_threshold = value;
      break;
    case Param::PenaltyConstant:
      next.penalty_constant = value;
      break;
    case Param::InnerLr:
      next.inner_lr = value;
      break;
    case Param::AnchorCheckInterval:
      next.anchor_check_interval = as_count(value, "anchor check interval", 0);
      break;
    default:
      fail(Status::UnknownEnum, "unknown parameter key " + std::to_string(int(key)));
  }
  validate(next);
  s.config = next;
  if (key == Param::OuterMomentum) {
    s.beta_auto = false;
    s.beta = value;
    s.stats.resolved_outer_momentum = value;
    if (s.committed && s.has_anchor() && s.momentum_needed() && s.device) s.device->momentum_needed(s);
    if (s.committed && s.has_anchor() && s.momentum_needed() && s.momentum.empty() && !s.device)
      s.momentum = FloatBuffer(s.state_count);  // starts from zero momentum
    if (s.committed && s.eager() && s.momentum_needed() && s.eager_momentum.empty())
      s.eager_momentum = FloatBuffer(s.state_count);
  }
}

double Engine::get_param(Param key) const {
  const State& s = *state_;
  switch (key) {
    case Param::OuterLr: return s.config.outer_lr;
    case Param::OuterMomentum: return s.beta;
    case Param::Tau: return s.config.tau;
    case Param::ClipThreshold: return s.config.clip_threshold;
    case Param::PenaltyConstant: return s.config.penalty_constant;
    case Param::InnerLr: return s.config.inner_lr;
    case Param::AnchorCheckInterval: return s.config.anchor_check_interval;
  }
  fail(Status::UnknownEnum, "unknown parameter key " + std::to_string(int(key)));
}

EngineStats Engine::stats() const {
  if (state_->device && state_->committed) state_->device->fold_reports(*state_, /*wait=*/false);
  EngineStats out = state_->stats;
  fill_observed_stats(*state_, out);
  return out;
}

float* Engine::anchor_for_testing() { return state_->anchor.data(); }

}  // namespace co2

// The host backend: the engine's outer state in host memory (BackendState's FloatBuffers), the
// boundary as the fused passes of runtime/outer/boundary_pass.hpp, averages through the
// communicator's ring. co2's update is prepared on the progress thread as soon as its average
// arrives, so that the boundary only swaps it in (docs/algorithm.md, "The split boundary pass").
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "runtime/backends/backend.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/collectives/collectives.hpp"
#include "runtime/backends/backend_state.hpp"

namespace co2 {

namespace {

using S = BackendState;

// The coefficients of a pass that only writes deltas (no update).
OuterCoefficients delta_coefficients(const S& s, const Segment& seg) {
  OuterCoefficients k;
  k.anchor_weight = anchor_weight_of(s.buffer_values(), seg);
  return k;
}

DeltasFinite deltas(bool finite) { return finite ? DeltasFinite::Yes : DeltasFinite::No; }

// The first half of the split boundary pass (co2 and diloco on the host): the update of the
// average in `comm` (momentum in place, the next anchor into `comm`, and into the parameters
// when params_follow) with prepared.settings and prepared.history; sets prepared.ready. False
// when the result is not finite: nothing is prepared, the anchor and momentum are unchanged
// (the parameters may not be).
bool prepare_update(const std::vector<Segment>& segments, float* anchor, float* momentum, float* comm,
                    PreparedUpdate& prepared, bool params_follow = false);

}  // namespace

namespace {

void record_pass(const Segment& seg, const PassResult& r, const OuterCoefficients& k, GapHistory& h,
                 UpdateSummary* sum) {
  if (seg.role != Role::Parameter) return;
  record_update(seg, double(k.alpha), r.step_sum_squares, h);
  summarize_pass(seg.count, r.clamped, sum);
}

class HostBackend final : public Backend {
 public:
  explicit HostBackend(S& s) : s_(s) {}

  void check_memory(const void*, size_t, const std::string&) override {}

  void* allocate_flat(size_t count, ParamDType dtype) override {
    // 16-bit elements: half as many fp32 words, rounded up.
    const size_t words = (count * element_bytes(dtype) + sizeof(float) - 1) / sizeof(float);
    flat_ = FloatBuffer(words);
    return flat_.data();
  }

  void commit() override {
    S& s = s_;
    // A re-formed elastic group commits over the buffers it had; the donor's anchor and momentum
    // follow the commit (membership_change.cpp), which therefore neither allocates them nor
    // broadcasts rank 0's parameters.
    const bool outer_state_follows = s.outer_state_follows && s.has_anchor();
    s.comm_buffer.reset(s.state_count);
    if (s.has_anchor() && !outer_state_follows) {
      s.anchor = FloatBuffer(s.state_count);
      if (s.momentum_needed()) s.momentum = FloatBuffer(s.state_count);
    }
    if (s.eager()) {
      s.eager_offset.reset(s.state_count);
      if (s.momentum_needed()) s.eager_momentum.reset(s.state_count);
    }
    if (s.error_feedback()) s.residual.reset(s.state_count);
    if (outer_state_follows) {
      count_state();
      return;
    }
    // Rank 0's values become everyone's parameters and anchor.
    pack_parameters(s, s.comm_buffer.data());
    auto request = s.comm->broadcast(s.comm_buffer.data(), s.state_count, DataType::F32, 0,
                                     s.id(Purpose::InitialBroadcast));
    if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
    unpack_parameters(s, s.comm_buffer.data(), false);
    if (s.has_anchor()) std::memcpy(s.anchor.data(), s.comm_buffer.data(), s.state_count * sizeof(float));
    std::memset(s.comm_buffer.data(), 0, s.state_count * sizeof(float));
    count_state();
  }

  void begin_new_group() override {}  // the state is BackendState's: the commit renews it

  void momentum_needed() override {
    S& s = s_;
    if (s.has_anchor() && s.momentum.empty()) s.momentum = FloatBuffer(s.state_count);
    if (s.eager() && s.eager_momentum.empty()) s.eager_momentum = FloatBuffer(s.state_count);
    count_state();
  }

  Arrival collect_average() override {
    S& s = s_;
    Arrival a;
    if (s.pending) {
      wait_pending(s);
      a.have = true;
      a.finite = s.pending_result_finite.load();
      s.average_ready = false;
      return a;
    }
    if (s.average_ready) {  // collected by save, or restored from a checkpoint
      s.average_ready = false;
      a.have = true;
      a.finite = s.ready_average_finite;
      if (a.finite && !s.prepared.ready) {  // restored from a blob without the prepared update
        s.prepared.settings = outer_settings_of(s);
        s.prepared.history = s.history;
        a.finite = prepare_update(s.segments, s.anchor.data(), momentum(), s.comm_buffer.data(), s.prepared);
      }
    }
    return a;
  }

  DeltasFinite boundary_pass(const BoundaryPass& plan) override {
    if (plan.eager) return eager_pass(plan.update);
    return plan.update ? deltas(apply_prepared(/*write_delta=*/true)) : write_deltas();
  }

  // comm_buffer <- R(a) - p, p <- a.
  DeltasFinite write_deltas() {
    S& s = s_;
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
    return deltas(delta_finite);
  }

  // The eager policy (docs/algorithm.md, "The eager policy"): the anchor follows the delayed rule
  // exactly as without it; each PARAMETER segment's delta is taken from the point the rank
  // started at (anchor + its offset) and the next round starts from the next anchor plus the new
  // offset. BUFFER segments are only averaged, as always.
  DeltasFinite eager_pass(bool update) {
    S& s = s_;
    const TraceSpan pass(s.trace.get(), "eager pass");
    const OuterSettings o = outer_settings_of(s);
    const EagerCoefficients k = eager_coefficients_of(o, s.comm->size(), !s.eager_momentum.empty());
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
    if (update) std::swap(s.anchor, s.comm_buffer);
    if (!delta_finite) {
      // This rank's NaN travels in the all-reduce and every rank skips that average; meanwhile
      // the rank restarts from the anchor instead of carrying the NaN in its offset.
      clear_eager_state();
      set_parameters_to_anchor();
    }
    return deltas(delta_finite);
  }

  // Its update is prepared on the progress thread as soon as the average is known to be finite,
  // with the settings in effect now; "finite" covers the prepared next anchor too.
  void submit_average() override {
    S& s = s_;
    s.pending_result_finite.store(true);
    s.prepared.ready = false;
    s.prepared.settings = outer_settings_of(s);
    s.prepared.history = s.history;
    float* data = s.comm_buffer.data();
    float* anchor = s.anchor.data();
    float* m = momentum();
    const size_t count = s.state_count;
    std::atomic<bool>* finite = &s.pending_result_finite;
    const std::vector<Segment>* segments = &s.segments;  // fixed after commit
    PreparedUpdate* prepared = &s.prepared;
    Trace* trace = s.trace.get();  // outlives the collective: the engine waits for it
    const WireCompression wire = outer_wire(s, data);
    s.pending = s.comm->allreduce_then(data, count, DataType::F32, ReduceOp::Avg, [=] {
      const Clock::time_point start = trace ? Clock::now() : Clock::time_point{};
      finite->store(all_finite(data, count) && prepare_update(*segments, anchor, m, data, *prepared));
      if (trace) trace->span(Trace::Lane::BulkLane, "prepare pass", start, Clock::now());
    }, s.id(Purpose::OuterAverage), wire);
    s.counters.bytes_reduced += count * sizeof(float);
  }

  void apply_update() override { apply_prepared(/*write_delta=*/false); }


  // The prepared next anchor (in the comm buffer) becomes the anchor; the parameters keep their
  // progress on top of it and the eager offsets are spent (the anchor now holds the average).
  void apply_on_arrival() override {
    S& s = s_;
    const TraceSpan pass(s.trace.get(), "arrival pass");
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      const size_t off = seg.state_offset;
      float* e = seg.role == Role::Parameter && !s.eager_offset.empty() ? s.eager_offset.data() + off : nullptr;
      with_params(seg, [&](auto* p) {
        arrival_shift_segment(p, s.anchor.data() + off, s.comm_buffer.data() + off, e, seg.count);
      });
    }
    std::swap(s.anchor, s.comm_buffer);
  }

  void clear_eager_state() override {
    S& s = s_;
    if (!s.eager_offset.empty()) std::memset(s.eager_offset.data(), 0, s.state_count * sizeof(float));
    if (!s.eager_momentum.empty()) std::memset(s.eager_momentum.data(), 0, s.state_count * sizeof(float));
  }

  // c = R(a) - p (a co2 engine's warm-up: -p for BUFFER segments), averaged with a blocking
  // all-reduce, then prepared like co2's update, so that a result that overflows is found before
  // the anchor takes it. The parameters take the next anchor in the same pass.
  bool average_deltas_blocking() override {
    S& s = s_;
    float* comm = s.comm_buffer.data();
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      const float* a = s.anchor.data() + seg.state_offset;
      float* c = comm + seg.state_offset;
      const float w = delta_coefficients(s, seg).anchor_weight;
      with_params(seg, [&](auto* p) {
        for (size_t i = 0; i < seg.count; ++i) c[i] = delta_element(w * a[i], p[i]);
      });
    }
    s.prepared.settings = outer_settings_of(s);
    s.prepared.history = s.history;
    return average_blocking(comm, s.state_count, Purpose::OuterAverage) &&
           prepare_update(s.segments, s.anchor.data(), momentum(), comm, s.prepared, /*params_follow=*/true);
  }

  void apply_blocking_update() override { apply_prepared(/*write_delta=*/false, /*params_current=*/true); }

  bool average_parameters(bool buffers_only) override {
    S& s = s_;
    pack_parameters(s, s.comm_buffer.data());
    if (!average_blocking(s.comm_buffer.data(), s.state_count, Purpose::ParameterAverage)) return false;
    unpack_parameters(s, s.comm_buffer.data(), buffers_only);
    return true;
  }

  bool average_gradients(void* const* grads, size_t) override {
    S& s = s_;
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
    if (!average_blocking_on(s.gradient_comm(), s.gradient_id(), packed, s.trained_count)) return false;
    offset = 0;
    i = 0;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      if (grads[i])
        with_params(seg, [&](auto* p) { narrow_into(packed + offset, static_cast<decltype(p)>(grads[i]), seg.count); });
      offset += seg.count;
      ++i;
    }
    return true;
  }

  void set_parameters_to_anchor() override { unpack_parameters(s_, s_.anchor.data(), false); }

  uint64_t parameters_checksum(bool trained_only) override { return co2::parameters_checksum(s_, trained_only); }

  uint64_t anchor_checksum() override {
    if (!s_.has_anchor()) return co2::parameters_checksum(s_);
    WordHasher hasher;
    hasher.update(s_.anchor.data(), s_.state_count);
    return hasher.digest();
  }

  void consensus_into(float* out, size_t count, bool parameters, bool average) override {
    S& s = s_;
    if (parameters)
      pack_parameters(s, out);
    else
      std::memcpy(out, s.anchor.data(), count * sizeof(float));
    if (!average) return;
    auto request = s.comm->allreduce(out, count, DataType::F32, ReduceOp::Avg, s.id(Purpose::Consensus));
    if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  }

  void set_caller_stream(void*) override {}
  void wait_for_caller(const char*) override {}
  Finished finished(bool) override { return {}; }
  void drain() noexcept override {
    if (s_.pending) s_.pending->wait_status();
  }

  bool has_momentum() const override { return !s_.momentum.empty(); }
  void stage_out() override {}
  void release_staged() override {}
  // p <- anchor, plus the rank's eager offset on PARAMETER segments under the eager policy. After
  // a membership change (outer_state_follows) the offsets are the commit's fresh zeros
  // (membership_change.cpp drops them before it commits): the same sums are formed without
  // reading them, since the first read of fresh memory maps every page (a joiner's 512 MiB took
  // ~2 s on this project's virtual machines) while the whole group waits for it.
  void stage_in() override {
    S& s = s_;
    count_state();
    if (!s.has_anchor()) return;
    set_parameters_to_anchor();
    if (s.eager_offset.empty()) return;
    const bool offsets_are_zero = s.outer_state_follows;
    for (const Segment& seg : s.segments) {
      if (seg.role != Role::Parameter) continue;
      const float* a = s.anchor.data() + seg.state_offset;
      const float* e = s.eager_offset.data() + seg.state_offset;
      with_params(seg, [&](auto* p) {
        using P = std::remove_pointer_t<decltype(p)>;
        if (offsets_are_zero)
          for (size_t i = 0; i < seg.count; ++i) p[i] = narrow<P>(round_start(a[i], 0.0f));
        else
          for (size_t i = 0; i < seg.count; ++i) p[i] = narrow<P>(round_start(a[i], e[i]));
      });
    }
  }

 private:
  float* momentum() { return s_.momentum.empty() ? nullptr : s_.momentum.data(); }

  void count_state() {
    const S& s = s_;
    const size_t floats = s.anchor.size() + s.momentum.size() + s.comm_buffer.size() + s.eager_offset.size() +
                          s.eager_momentum.size() + s.residual.size();
    s_.counters.outer_state_bytes = floats * sizeof(float);
  }


  // A blocking all-reduce (average) of `count` floats that reports whether the result is finite.
  bool average_blocking(float* data, size_t count, Purpose purpose) {
    return average_blocking_on(*s_.comm, s_.id(purpose), data, count);
  }
  bool average_blocking_on(Communicator& comm, CollectiveId id, float* data, size_t count) {
    S& s = s_;
    auto finite = std::make_shared<std::atomic<bool>>(true);
    const WireCompression wire = id.purpose == Purpose::OuterAverage ? outer_wire(s, data) : WireCompression{};
    auto request = comm.allreduce_then(
        data, count, DataType::F32, ReduceOp::Avg,
        [finite, data, count] { finite->store(all_finite(data, count)); }, id, wire);
    s.counters.bytes_reduced += count * sizeof(float);
    s.wait_collective(request);
    return finite->load();
  }

  // Swaps in the prepared update (prepared.ready): the anchor becomes the next anchor and the
  // parameters follow it (params_current: they already did, in the prepare pass). write_delta:
  // comm_buffer receives this round's deltas a - p instead. Returns whether every delta was
  // finite.
  bool apply_prepared(bool write_delta, bool params_current = false) {
    S& s = s_;
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
      if (!params_current) set_parameters_to_anchor();
    }
    return delta_finite;
  }

  S& s_;
  FloatBuffer flat_;  // allocate_flat's
};

}  // namespace

// The first half of the split pass: from the average in `comm`, the new momentum (in place) and
// the next anchor (into `comm`); `anchor` is only read. Runs on the progress thread for co2.
// Returns false, leaving the anchor and momentum as they were, when the result would not be
// finite (an overflow from finite inputs); `comm` no longer holds the average then.
namespace {
bool prepare_update(const std::vector<Segment>& segments, float* anchor, float* momentum, float* comm,
                    PreparedUpdate& prepared, bool params_follow) {
  prepared.ready = false;
  prepared.summary = empty_summary();
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
    record_pass(seg, r, plan[index].k, prepared.history[index], &prepared.summary);
  }
  prepared.summary_known = true;
  prepared.ready = finite;
  return finite;
}
}  // namespace

std::unique_ptr<Backend> make_host_backend(BackendState& s) { return std::make_unique<HostBackend>(s); }

}  // namespace co2

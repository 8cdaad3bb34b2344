// Sharded outer state (co2 on host tensors; docs/algorithm.md, "Sharded outer state"): rank r
// keeps only its shard J = shard_range(N, W, r) of the anchor, of the momentum and of the last
// outer step; one full-size buffer B (BackendState::comm_buffer) carries everything else.
//
// Between boundaries B holds the anchor every rank's parameters take at the next boundary (the
// current one, or the next one once its all-gather arrived). At a boundary:
//   step_J  <- cur_J - B_J, cur_J <- B_J            (the update this boundary applies)
//   B       <- w * B - p, p <- B (old)              (w: anchor_weight, 0 for co2's BUFFERs)
// (16-bit parameters: read cur, B and w * B as R(x), the values the parameters held; see pass.)
// so that B holds d - s (this round's deltas minus the step just applied; s is the same on every
// rank, so the average of d - s is the average of d minus s), and then, in the background, one
// chain of collectives on the communicator:
//   reduce_scatter(B)   on_result: c_J = B_J + w * step_J, the average of the deltas; whether it
//                       and the update it gives are finite on this shard -> verdict_[r]
//   allgather_shards(verdict, after the reduce-scatter)
//                       on_result: every rank's verdict; if all finite, the update of the shard
//                       (momentum in place, the next anchor into B_J), else B_J <- cur_J
//   allgather_shards(B, after the verdicts): B = the next anchor (or the unchanged one) on every
//                       rank, bit for bit (each shard travels from its owner).
// Outer state per rank: N (B) + 3 N / W floats (+ N for the residual of a compressed wire).
//
// Hierarchical CO2 (config.hierarchy == Nodes) is the same backend with the shards cut over the
// L ranks of a node, whose parameters are equal (their gradients are averaged every step): the
// reduce-scatter becomes the all-reduce of this rank's shard of B across the nodes (the `inter`
// communicator of local index j: every node's L ranks use their links at once), the verdicts
// are all-gathered over all ranks, and B is all-gathered inside the node (`intra`).
#include <atomic>
#include <cmath>
#include <cstring>

#include "runtime/backends/backend.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/collectives/collectives.hpp"
#include "runtime/backends/backend_state.hpp"
#include "runtime/base/log.hpp"

namespace co2 {

namespace {

using S = BackendState;

// The part of one segment inside this rank's shard.
struct ShardPart {
  size_t segment;  // index into State::segments
  size_t begin;    // state index of its first element
  size_t count;
};

class ShardedBackend final : public Backend {
 public:
  explicit ShardedBackend(S& s) : s_(s), host_(make_host_backend(s)) {}

  void check_memory(const void*, size_t, const std::string&) override {}
  void* allocate_flat(size_t count, ParamDType dtype) override { return host_->allocate_flat(count, dtype); }

  void commit() override {
    S& s = s_;
    const int w = s.comm->size();
    shards_ = s.hierarchical() ? s.intra.get() : s.comm.get();
    shard_owner_ = s.hierarchical() ? s.intra_owner : s.owner;
    shard_count_ = shards_->size();
    mine_ = shard_range(s.state_count, shard_count_, shards_->rank());
    collectives::Tuning tuning;
    tuning.chunk_bytes = s.comm->options().chunk_bytes;
    s.outer_wire_bytes =
        (s.hierarchical()
             ? collectives::allreduce_wire_bytes(s.inter->rank(), s.inter->size(), mine_.count(), s.config.wire_format,
                                                 tuning, wire_segments(s, mine_.begin))
             : collectives::reduce_scatter_wire_bytes(s.comm->rank(), w, s.state_count, s.config.wire_format,
                                                      tuning, wire_segments(s))) +
        collectives::allgather_shards_wire_bytes(shards_->rank(), shards_->size(), s.state_count, tuning);
    for (size_t i = 0; i < s.segments.size(); ++i) {
      const Segment& seg = s.segments[i];
      if (seg.role == Role::Excluded) continue;
      const size_t begin = std::max(seg.state_offset, mine_.begin);
      const size_t end = std::min(seg.state_offset + seg.count, mine_.end);
      if (begin < end) parts_.push_back(ShardPart{i, begin, end - begin});
    }
    // Zeroed in place where this rank had them (a re-formed group's commit): fresh pages would
    // fault in one by one while the group waits (FloatBuffer::reset).
    s.comm_buffer.reset(s.state_count);
    cur_ = FloatBuffer(mine_.count());
    step_ = FloatBuffer(mine_.count());
    if (s.momentum_needed()) momentum_ = FloatBuffer(mine_.count());
    allocate_eager_state();
    verdicts_ = FloatBuffer(size_t(w));
    // One row per shard: under hierarchy every node holds the same shards, so the sums run over
    // one node's shards (the node's ranks), not over every rank (nodes copies of each).
    norm_partials_.assign(size_t(shards_->size()) * s.segments.size(), 0.0);
    step_partials_.assign(size_t(shards_->size()) * (s.segments.size() + 2), 0.0);
    if (s.error_feedback()) s.residual.reset(s.state_count);
    // A re-formed elastic group's outer state follows (stage_in); otherwise rank 0's values
    // become everyone's parameters and anchor.
    if (s.outer_state_follows && s.has_anchor()) return count_state();
    float* b = s.comm_buffer.data();
    pack_parameters(s, b);
    auto request = s.comm->broadcast(b, s.state_count, DataType::F32, 0, s.id(Purpose::InitialBroadcast));
    if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
    unpack_parameters(s, b, false);
    copy_shard(cur_.data(), b + mine_.begin);
    if (!round_start_.empty()) std::copy(b, b + s.state_count, round_start_.data());
    count_state();
  }

  // The shards of the group before are kept for assemble_outer_state (a retry after a failed
  // re-formation keeps the first ones, or finds the state assembled already).
  void begin_new_group() override {
    if (kept_.shards == 0 && s_.committed && !s_.outer_state_staged) {
      kept_.shards = shard_count_;
      kept_.anchor = std::move(cur_);
      kept_.momentum = std::move(momentum_);
    }
    cur_ = FloatBuffer();
    momentum_ = FloatBuffer();
    parts_.clear();
    deltas_in_buffer_ = anchor_outside_shard_ = false;
  }

  // Every shard's broadcasts are posted at once (the joiner receives from every holder together:
  // one after another, each chain's start and each holder's copy into the assembly were idle
  // time of the whole group). A holder sends from its shard and copies it in while they run.
  void assemble_outer_state(const std::vector<int>& holders) override {
    S& s = s_;
    const size_t n = s.state_count;
    const bool kept = kept_.shards > 0;
    const int before = kept ? kept_.shards : (s.committed ? shard_count_ : 0);
    FloatBuffer& anchor = kept ? kept_.anchor : cur_;
    FloatBuffer& momentum = kept ? kept_.momentum : momentum_;
    // Rank 0 decides: the size before, whether a momentum is kept, who holds each shard.
    std::vector<int64_t> plan(2, 0);
    if (s.comm->rank() == 0) {
      require(before > 0 && holders.size() == size_t(before), Status::Internal,
              "membership: rank 0 of the new group holds no shard of the group before");
      plan = {before, momentum.empty() ? 0 : 1};
      plan.insert(plan.end(), holders.begin(), holders.end());
    }
    broadcast_blocking(plan.data(), 2, DataType::I64);
    plan.resize(size_t(2 + plan[0]));
    broadcast_blocking(plan.data() + 2, size_t(plan[0]), DataType::I64);
    s.anchor = FloatBuffer(n);
    s.momentum = FloatBuffer(plan[1] ? n : 0);
    const auto id = s.id(Purpose::Membership);
    std::vector<std::shared_ptr<Request>> requests;
    ShardRange held;        // the shard this rank held (empty: none)
    FloatBuffer parameters;  // packed, where a shard was lost
    for (int j = 0; j < int(plan[0]); ++j) {
      const ShardRange range = shard_range(n, int(plan[0]), j);
      if (range.count() == 0) continue;
      const int holder = int(plan[size_t(2 + j)]);
      float* a = s.anchor.data() + range.begin;
      if (holder < 0) {  // the ranks' parameters averaged; its momentum: zeros
        if (parameters.empty()) {
          parameters = FloatBuffer(n);
          pack_parameters(s, parameters.data());
        }
        std::copy(parameters.data() + range.begin, parameters.data() + range.end, a);
        requests.push_back(s.comm->allreduce(a, range.count(), DataType::F32, ReduceOp::Avg, id));
        continue;
      }
      const bool holds = holder == s.comm->rank();
      if (holds) held = range;
      requests.push_back(s.comm->broadcast(holds ? anchor.data() : a, range.count(), DataType::F32, holder, id));
      if (plan[1]) {
        float* m = s.momentum.data() + range.begin;
        requests.push_back(s.comm->broadcast(holds ? momentum.data() : m, range.count(), DataType::F32, holder, id));
      }
    }
    std::copy(anchor.data(), anchor.data() + held.count(), s.anchor.data() + held.begin);
    if (plan[1]) std::copy(momentum.data(), momentum.data() + held.count(), s.momentum.data() + held.begin);
    // Every request finished before a failure is raised: they all write the assembly's buffers.
    bool failed = false;
    for (auto& request : requests) failed |= request->wait_status() != Status::Ok;
    if (failed) fail(s.comm->error_status(), s.comm->error_message());
    kept_ = Kept{};
  }

  void momentum_needed() override {
    if (momentum_.empty()) momentum_ = FloatBuffer(mine_.count());
    allocate_eager_state();
    count_state();
  }

  // Hierarchical: shards of the node's offset and momentum, and the round start the node
  // gathers; flat: this rank's round start and momentum, full-size.
  // apply_step takes each rank's progress from where its round started: the round start too.
  void allocate_eager_state() {
    const S& s = s_;
    if (s.config.apply_step != kApplyAtBoundary && round_start_.empty()) round_start_ = FloatBuffer(s.state_count);
    if (!s.eager()) return;
    const size_t per_rank = s.hierarchical() ? mine_.count() : s.state_count;
    if (s.hierarchical() && eager_offset_.empty()) eager_offset_ = FloatBuffer(per_rank);
    if (s.momentum_needed() && eager_momentum_.empty()) eager_momentum_ = FloatBuffer(per_rank);
    if (round_start_.empty()) round_start_ = FloatBuffer(s.state_count);
  }

  Arrival collect_average() override {
    S& s = s_;
    Arrival a;
    if (s.pending) {
      wait_pending(s);
      a.have = true;
      a.finite = verdict_finite_.load();
      s.average_ready = false;
      remember_prepared(a.finite);
      return a;
    }
    if (s.average_ready) {  // collected by save (remembered then), or restored from a checkpoint
      s.average_ready = false;
      a.have = true;
      a.finite = s.ready_average_finite;
      // A prepared blob brought its history and statistics; a raw average runs the chain here.
      if (a.finite && !s.prepared.ready) {
        a.finite = prepare_loaded_average();
        remember_prepared(a.finite);
      }
    }
    return a;
  }

  // With or without an update the pass is the same: B already holds the collected next anchor.
  DeltasFinite boundary_pass(const BoundaryPass& plan) override {
    if (plan.eager) return eager_pass(plan);
    return pass(/*params_take_anchor=*/true);
  }
  // The eager policy, hierarchical CO2 only (refused at commit for flat sharding: there each
  // rank's offset is its own and full-size). A node's ranks hold the same parameters and deltas,
  // so the offset e and its momentum q are sharded like the anchor: the owner of J computes
  // d_J = (a_J + e_J) - p_J from the anchor in effect, updates q_J and e_J (docs/algorithm.md,
  // "The eager policy"; W there is the number of nodes), sends d_J across the nodes, and the node
  // all-gathers its next round's start a' + e (blocking, inside the node) into the parameters.
  DeltasFinite eager_pass(const BoundaryPass& plan) {
    return s_.hierarchical() ? node_eager_pass() : rank_eager_pass(plan.anchor_check_due);
  }

  // The eager policy with flat sharding: each rank's offset is its own, so it keeps its round
  // start R = a + e (full-size) and the momentum q of its own deltas (full-size) instead of the
  // replicated engine's e and q: d = R - p needs no full anchor, and the next start is a' + e'
  // with a' = B. Outer state N (B) + N (R) [+ N (q)] + 3N/W, against the replicated eager 5N.
  DeltasFinite rank_eager_pass(bool anchor_check_due) {
    S& s = s_;
    const TraceSpan trace(s.trace.get(), "sharded eager pass");
    const OuterSettings o = outer_settings_of(s);
    const EagerCoefficients k = eager_coefficients_of(o, s.comm->size(), !eager_momentum_.empty());
    float* b = s.comm_buffer.data();  // a' in, this round's deltas out
    float* r = round_start_.data();
    float* q = k.momentum ? eager_momentum_.data() : nullptr;
    copy_shard(cur_.data(), b + mine_.begin);
    std::fill(step_.data(), step_.data() + step_.size(), 0.0f);  // B holds the deltas themselves
    // The anchor a' for the anchor check, hashed before the pass overwrites it (when the engine
    // checks it after this pass).
    WordHasher hasher;
    // A non-finite delta: the NaN still travels (every rank skips that average), and this rank
    // restarts from the anchor with its eager state cleared, as the replicated engine does.
    bool finite = true;
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded || seg.role == Role::Buffer) continue;
      const float* rs = r + seg.state_offset;
      finite = with_params(seg, [&](auto* p) {
                 for (size_t i = 0; i < seg.count; ++i)
                   if (!std::isfinite(delta_element(rs[i], p[i]))) return false;
                 return true;
               }) && finite;
    }
    if (!finite) clear_eager_state();
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      const size_t off = seg.state_offset;
      if (anchor_check_due) hasher.update(b + off, seg.count);
      const bool trained = seg.role == Role::Parameter;
      with_params(seg, [&](auto* p) {
        using P = std::remove_pointer_t<decltype(p)>;
        for (size_t i = 0; i < seg.count; ++i) {
          const float following = b[off + i];
          float d = value_delta(p[i]), start = following;  // BUFFER values travel (w = 0)
          if (trained) {
            d = delta_element(r[off + i], p[i]);
            if (finite) {
              const float filtered = eager_filtered(d, q ? q[off + i] : 0.0f, k);
              if (q) q[off + i] = filtered;
              start = round_start(following, eager_offset(d, filtered, k));
            }
          }
          r[off + i] = start;
          b[off + i] = d;
          p[i] = narrow<P>(start);
        }
      });
    }
    pass_anchor_hash_ = hasher.digest();
    deltas_in_buffer_ = true;
    anchor_outside_shard_ = false;
    return finite ? DeltasFinite::Yes : DeltasFinite::No;
  }

  // The eager policy, hierarchical CO2.
  DeltasFinite node_eager_pass() {
    S& s = s_;
    const TraceSpan trace(s.trace.get(), "sharded eager pass");
    average_buffers_in_node();
    const OuterSettings o = outer_settings_of(s);
    const EagerCoefficients k = eager_coefficients_of(o, s.inter->size(), !eager_momentum_.empty());
    float* b = s.comm_buffer.data();  // the next anchor a' (or the unchanged one) everywhere
    float* start = round_start_.data();
    bool finite = true;
    for (const ShardPart& part : parts_) {
      const Segment& seg = s.segments[part.segment];
      const size_t off = part.begin - mine_.begin, first = part.begin - seg.state_offset;
      float* next = b + part.begin;  // a'_J in, this round's delta d_J out (sent across the nodes)
      float* a = cur_.data() + off;  // a_J in, a'_J out
      float* e = eager_offset_.data() + off;
      float* q = eager_momentum_.empty() ? nullptr : eager_momentum_.data() + off;
      const bool trained = seg.role == Role::Parameter;
      finite = with_params(seg, [&](auto* p) {
                 bool ok = true;
                 for (size_t i = 0; i < part.count; ++i) {
                   const float following = next[i];
                   float d = value_delta(p[first + i]), offset = 0.0f;  // BUFFER values travel (w = 0)
                   if (trained) {
                     d = delta_element(round_start(a[i], e[i]), p[first + i]);
                     const float filtered = eager_filtered(d, q ? q[i] : 0.0f, k);
                     if (q) q[i] = filtered;
                     offset = e[i] = eager_offset(d, filtered, k);
                   }
                   start[part.begin + i] = round_start(following, offset);
                   a[i] = following;
                   next[i] = d;
                   ok = ok && std::isfinite(d);
                 }
                 return ok;
               }) && finite;
    }
    std::fill(step_.data(), step_.data() + step_.size(), 0.0f);  // B_J holds d itself
    auto request = shards_->allgather_shards(start, s.state_count, DataType::F32,
                                             {shard_owner_, Purpose::ParameterAverage});
    s.wait_collective(request);
    if (!all_finite(start, s.state_count)) {
      // A NaN in this node's deltas travels across the nodes and every rank skips that average;
      // meanwhile the node restarts from the anchor a' instead of carrying it in its offsets.
      clear_eager_state();
      std::copy(b, b + s.state_count, start);  // a' outside this shard
      copy_shard(start + mine_.begin, cur_.data());
    }
    unpack_parameters(s, start, false);
    anchor_outside_shard_ = true;
    deltas_in_buffer_ = true;
    return finite ? DeltasFinite::Yes : DeltasFinite::No;
  }

  void submit_average() override { submit_chain(); }

  // apply_step, between boundaries, once the chain completed: B holds the next anchor everywhere.
  // The parameters keep their progress from the round start on top of it, which becomes the round
  // start (the eager offsets are spent); the next pass then takes no step back (cur_J = B_J).
  void apply_on_arrival() override {
    S& s = s_;
    const TraceSpan trace(s.trace.get(), "sharded arrival pass");
    const float* b = s.comm_buffer.data();
    float* r = round_start_.data();
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      const size_t off = seg.state_offset;
      with_params(seg, [&](auto* p) {
        arrival_shift_segment(p, r + off, b + off, static_cast<float*>(nullptr), seg.count);
      });
      std::copy(b + off, b + off + seg.count, r + off);
    }
    take_anchor_from_buffer();
    std::fill(eager_offset_.data(), eager_offset_.data() + eager_offset_.size(), 0.0f);
  }

  // finalize: the collected next anchor becomes the anchor and the parameters.
  void apply_update() override {
    take_anchor_from_buffer();
    set_parameters_to_anchor();
  }
  // The next round starts from the anchor: the offsets (hierarchical: their shards; flat: the
  // round start takes the anchor when the parameters do) and their momentum are zero.
  void clear_eager_state() override {
    std::fill(eager_offset_.data(), eager_offset_.data() + eager_offset_.size(), 0.0f);
    std::fill(eager_momentum_.data(), eager_momentum_.data() + eager_momentum_.size(), 0.0f);
  }

  bool rank_eager() const { return s_.eager() && !s_.hierarchical(); }

  // co2's warm-up rounds: the same chain, waited for at once.
  bool average_deltas_blocking() override {
    S& s = s_;
    pass(/*params_take_anchor=*/false);
    submit_chain();
    wait_pending(s);
    remember_prepared(verdict_finite_.load());
    return verdict_finite_.load();
  }
  void apply_blocking_update() override { apply_update(); }

  bool average_parameters(bool buffers_only) override { return host_->average_parameters(buffers_only); }
  bool average_gradients(void* const* grads, size_t n) override { return host_->average_gradients(grads, n); }

  // Only where B holds the anchor: after a collect, or when nothing was submitted yet.
  void set_parameters_to_anchor() override {
    unpack_parameters(s_, s_.comm_buffer.data(), false);
    if (!round_start_.empty()) std::copy(s_.comm_buffer.data(), s_.comm_buffer.data() + s_.state_count, round_start_.data());
  }

  uint64_t parameters_checksum(bool trained_only) override { return co2::parameters_checksum(s_, trained_only); }

  // Right after a boundary's pass B holds deltas and the parameters hold the anchor; otherwise B
  // holds it. Either is the same on every rank that trains the same model.
  uint64_t anchor_checksum() override {
    if (deltas_in_buffer_ && !anchor_outside_shard_ && rank_eager()) return pass_anchor_hash_;
    if (deltas_in_buffer_ && !anchor_outside_shard_) return co2::parameters_checksum(s_);
    WordHasher hasher;
    const float* b = s_.comm_buffer.data();
    if (!deltas_in_buffer_) {
      hasher.update(b, s_.state_count);
    } else {  // the eager pass: B holds a' outside this rank's shard, the shard's a' is cur_
      hasher.update(b, mine_.begin);
      hasher.update(cur_.data(), mine_.count());
      hasher.update(b + mine_.end, s_.state_count - mine_.end);
    }
    return hasher.digest();
  }

  // The anchor without a collective of its own, so that one rank may evaluate alone: once this
  // rank's chain completed, B holds the anchor the next boundary starts from (the average in
  // flight applied, or refused), every shard from its owner, on every rank alike. Waiting for
  // the chain pairs nothing new: it needs only the peers' progress threads.
  void consensus_into(float* out, size_t count, bool parameters, bool average) override {
    if (parameters) return host_->consensus_into(out, count, parameters, average);
    S& s = s_;
    const Status chain = s.pending ? s.pending->wait_status() : Status::Ok;
    if (chain != Status::Ok) fail(chain, "consensus: the outer all-reduce in flight failed: " + s.comm->error_message());
    // Only a checkpoint's unprepared average (a 1.0 or CUDA engine's blob) occupies B: the next
    // boundary prepares it (a collective chain).
    require(!(s.average_ready && s.ready_average_finite && !s.prepared.ready), Status::InvalidState,
            "consensus(ANCHOR) of a sharded engine: the checkpoint just loaded carries an average "
            "whose update is prepared at the next boundary (a blob of co2 1.0 or of a CUDA engine); "
            "take a step to the next boundary first, or use CO2_CONSENSUS_LOCAL_AVERAGE (collective)");
    std::memcpy(out, s.comm_buffer.data(), count * sizeof(float));
  }

  void set_caller_stream(void*) override {}
  void wait_for_caller(const char*) override {}
  Finished finished(bool) override { return {}; }
  void drain() noexcept override {
    if (s_.pending) s_.pending->wait_status();
  }

  // --- checkpoints: the portable (replicated) format, save_portable. A save assembles one
  // segment at a time from the ranks' shards (saved_part), so that it never holds a full-size
  // copy of what is sharded; every load goes through load_shard below. ---
  bool has_momentum() const override { return !momentum_.empty(); }

  void stage_out() override {
    S& s = s_;
    // A refused average left B holding the unchanged anchor; a blob says "not finite" by its
    // values, so the average slot gets a NaN for the save.
    poisoned_ = s.average_ready && !s.ready_average_finite;
    if (poisoned_) {
      saved_first_ = s.comm_buffer.data()[0];
      s.comm_buffer.data()[0] = std::nanf("");
    }
  }

  void release_staged() override {
    s_.anchor = FloatBuffer();  // a membership change's assembled state (the shards hold it now)
    s_.momentum = FloatBuffer();
    if (poisoned_) s_.comm_buffer.data()[0] = saved_first_;
    poisoned_ = false;
    saved_anchor_ = std::vector<float>();
    saved_other_ = std::vector<float>();
    saved_bits_ = std::vector<int32_t>();
  }

  // Hierarchical: the node's offsets, as a replicated rank keeps its own; flat: this rank's,
  // e = R - a (the anchor part of the same segment comes first in the blob).
  const float* saved_part(SavedPart part, size_t segment) override {
    const S& s = s_;
    const Segment& seg = s.segments[segment];
    switch (part) {
      case SavedPart::Anchor:
        return assemble_segment(cur_, seg, saved_anchor_);
      case SavedPart::Momentum:
        return assemble_segment(momentum_, seg, saved_other_);
      case SavedPart::EagerOffset:
        if (s.hierarchical()) return assemble_segment(eager_offset_, seg, saved_other_);
        saved_other_.resize(seg.count);
        for (size_t i = 0; i < seg.count; ++i)
          saved_other_[i] = round_start_.data()[seg.state_offset + i] - saved_anchor_[i];
        return saved_other_.data();
      case SavedPart::EagerMomentum:
        if (s.hierarchical()) return assemble_segment(eager_momentum_, seg, saved_other_);
        return eager_momentum_.data() + seg.state_offset;
    }
    return nullptr;
  }

  // A sharded engine loads every checkpoint through load_shard (its shards only). After a
  // membership change the assembled whole state (assemble_outer_state) is cut for this rank:
  // the anchor and momentum shards, B and the parameters the anchor, the eager state zero.
  void stage_in() override {
    S& s = s_;
    if (s.anchor.size() != s.state_count) return;
    const float* a = s.anchor.data();
    copy_shard(cur_.data(), a + mine_.begin);
    if (momentum_.empty() && s.momentum.size() == s.state_count) momentum_ = FloatBuffer(mine_.count());
    if (!momentum_.empty()) {
      if (s.momentum.size() == s.state_count)
        copy_shard(momentum_.data(), s.momentum.data() + mine_.begin);
      else
        std::fill(momentum_.data(), momentum_.data() + momentum_.size(), 0.0f);
    }
    clear_eager_state();
    if (!round_start_.empty()) std::copy(a, a + s.state_count, round_start_.data());
    unpack_parameters(s, a, false);
    // B = the anchor: B takes the pages the assembly received it into (release_staged drops
    // s.anchor next). A copy would first map B's pages, which on a joiner are fresh: ~1 s per
    // 256 MiB on these VMs while the group waits.
    std::swap(s.comm_buffer, s.anchor);
    deltas_in_buffer_ = anchor_outside_shard_ = false;
    count_state();
  }

  // --- checkpoints: the per-rank format (every rank its own shard) ---
  bool shard_view(ShardView* view) const override {
    const S& s = s_;
    view->shards = uint32_t(shards_->size());
    view->shard_rank = uint32_t(shards_->rank());
    view->begin = mine_.begin;
    view->count = mine_.count();
    view->hierarchical = s.hierarchical();
    view->eager_whole = rank_eager();
    view->anchor = cur_.data();
    view->momentum = momentum_.empty() ? nullptr : momentum_.data();
    view->buffer = s.comm_buffer.data();
    view->eager_offset = rank_eager() ? round_start_.data() : eager_offset_.data();
    view->eager_momentum = eager_momentum_.empty() ? nullptr : eager_momentum_.data();
    return true;
  }

  // B is rebuilt from every rank's shard (no full-size copy arrives): first the round start
  // a + e for the parameters, then what B held at the save (the next anchor, a raw average).
  void load_shard(LoadedShard&& in) override {
    S& s = s_;
    cur_ = std::move(in.anchor);
    if (!in.momentum.empty()) {
      momentum_ = std::move(in.momentum);
    } else if (s.momentum_needed() || !momentum_.empty()) {
      momentum_ = FloatBuffer(mine_.count());
    }
    allocate_eager_state();
    clear_eager_state();
    if (!in.eager_momentum.empty()) eager_momentum_ = std::move(in.eager_momentum);
    const bool node_offsets = s.hierarchical() && !in.eager_offset.empty();
    if (node_offsets) eager_offset_ = std::move(in.eager_offset);
    float* b = s.comm_buffer.data();
    for (size_t i = 0; i < mine_.count(); ++i)
      b[mine_.begin + i] = cur_.data()[i] + (node_offsets ? eager_offset_.data()[i] : 0.0f);
    gather_shards(b);
    if (rank_eager() && !in.eager_offset.empty()) {
      round_start_ = std::move(in.eager_offset);
      // The blob holds the round start (or a portable blob the offset) of PARAMETER segments; a
      // BUFFER's starts at the anchor.
      float* r = round_start_.data();
      for (const Segment& seg : s.segments)
        for (size_t i = seg.state_offset; seg.role != Role::Excluded && i < seg.state_offset + seg.count; ++i)
          r[i] = seg.role == Role::Buffer ? b[i] : in.eager_offsets ? b[i] + r[i] : r[i];
      unpack_parameters(s, r, false);
    } else {
      unpack_parameters(s, b, false);
      if (!round_start_.empty()) std::copy(b, b + s.state_count, round_start_.data());
    }
    if (node_offsets || !in.average.empty()) {
      copy_shard(b + mine_.begin, in.average.empty() ? cur_.data() : in.average.data());
      gather_shards(b);
    }
    deltas_in_buffer_ = anchor_outside_shard_ = false;
    count_state();
  }

 private:
  void broadcast_blocking(void* data, size_t count, DataType dtype, int root = 0) {
    auto request = s_.comm->broadcast(data, count, dtype, root, s_.id(Purpose::Membership));
    if (request->wait_status() != Status::Ok) fail(s_.comm->error_status(), s_.comm->error_message());
  }

  void gather_shards(float* b) {
    auto request = shards_->allgather_shards(b, s_.state_count, DataType::F32, {shard_owner_, Purpose::Consensus});
    if (request->wait_status() != Status::Ok) fail(shards_->error_status(), shards_->error_message());
  }

  // The boundary's pass (see the top of the file). params_take_anchor: p <- the anchor in B
  // (co2); otherwise p stays (warm-up: the chain is waited for and the parameters take its
  // result). Returns whether every delta was finite.
  DeltasFinite pass(bool params_take_anchor) {
    S& s = s_;
    const TraceSpan trace(s.trace.get(), "sharded pass");
    if (s.hierarchical()) average_buffers_in_node();
    float* b = s.comm_buffer.data();
    // The deltas below are taken from R(B); the ranks trained from R(cur): step_J is the
    // difference, R(cur_J) - R(B_J), which the owner adds back (cur_J - B_J for fp32).
    for (const ShardPart& part : parts_)
      with_params(s.segments[part.segment], [&](auto* typed) {
        using P = std::remove_pointer_t<decltype(typed)>;
        const size_t off = part.begin - mine_.begin;
        for (size_t i = 0; i < part.count; ++i)
          step_.data()[off + i] = start_difference<P>(cur_.data()[off + i], b[part.begin + i]);
      });
    copy_shard(cur_.data(), b + mine_.begin);
    bool finite = true;
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      float* anchor = b + seg.state_offset;
      // apply_step: where this round starts (runtime/engine/arrival.hpp).
      float* start = params_take_anchor && !round_start_.empty() ? round_start_.data() + seg.state_offset : nullptr;
      const float w = anchor_weight_of(s.buffer_values(), seg);
      finite = with_params(seg, [&](auto* p) {
                 using P = std::remove_pointer_t<decltype(p)>;
                 bool ok = true;
                 for (size_t i = 0; i < seg.count; ++i) {
                   const float a = anchor[i];
                   const float d = delta_element(w * a, p[i]);
                   anchor[i] = d;
                   ok = ok && std::isfinite(d);
                   if (params_take_anchor) p[i] = narrow<P>(a);
                   if (start) start[i] = a;
                 }
                 return ok;
               }) && finite;
    }
    deltas_in_buffer_ = true;
    anchor_outside_shard_ = false;
    return finite ? DeltasFinite::Yes : DeltasFinite::No;
  }

  // The chain of the top of the file, on the progress thread; s.pending is its last request.
  void submit_chain() {
    S& s = s_;
    fix_chain_inputs();
    verdict_finite_.store(false);
    float* b = s.comm_buffer.data();
    std::shared_ptr<Request> reduced;
    if (s.hierarchical()) {
      // Only this rank's shard travels across the nodes; its node's other ranks send theirs.
      const WireCompression wire = outer_wire(s, b, mine_.begin, mine_.count());
      reduced = s.inter->allreduce_then(b + mine_.begin, mine_.count(), DataType::F32, ReduceOp::Avg,
                                        [this] { after_reduce(); }, {s.inter_owner, Purpose::OuterAverage}, wire);
    } else {
      const WireCompression wire = outer_wire(s, b);
      reduced = s.comm->reduce_scatter(b, s.state_count, DataType::F32, ReduceOp::Avg, s.id(Purpose::OuterAverage),
                                       wire, [this] { after_reduce(); });
    }
    s.pending = submit_after_reduce(reduced);
    // The payload this rank contributes to the reduction: all of B, or across nodes its shard.
    s.counters.bytes_reduced += (s.hierarchical() ? mine_.count() : s.state_count) * sizeof(float);
    deltas_in_buffer_ = false;
    anchor_outside_shard_ = false;
  }

  // Everything the chain's hooks read from the training thread's side, fixed when it is
  // submitted, as the replicated engine does: the settings (beta, alpha, clip, penalty) and
  // whether a momentum takes part. set_param(OUTER_MOMENTUM) from 0 while the chain runs
  // allocates momentum_ for the next chain; this one neither sees nor writes it.
  void fix_chain_inputs() {
    s_.prepared.settings = outer_settings_of(s_);
    chain_momentum_ = momentum_.empty() ? nullptr : momentum_.data();
  }

  // The rest of the chain, each collective started after the one before (`after`): the norms'
  // partial sums (norm clipping), the verdicts, the step norms' partial sums (gap penalty), B.
  std::shared_ptr<Request> submit_after_reduce(std::shared_ptr<Request> previous) {
    S& s = s_;
    const CollectiveId id = s.id(Purpose::OuterAverage);
    // The partial sums travel among the shards' holders (a node's ranks under hierarchy: every
    // node computes the same sums from equal shards); the verdicts among all ranks.
    const CollectiveId shard_id{shard_owner_, Purpose::OuterAverage};
    if (needs_norms())
      previous = shards_->allgather_shards(norm_partials_.data(), norm_partials_.size(), DataType::F64, shard_id,
                                           [this] { after_norms(); }, previous);
    previous = s.comm->allgather_shards(verdicts_.data(), verdicts_.size(), DataType::F32, id,
                                        [this] { after_verdicts(); }, previous);
    if (needs_steps())
      previous = shards_->allgather_shards(step_partials_.data(), step_partials_.size(), DataType::F64, shard_id,
                                           [this] { after_steps(); }, previous);
    return shards_->allgather_shards(s.comm_buffer.data(), s.state_count, DataType::F32, shard_id, {}, previous);
  }

  bool needs_norms() const { return s_.prepared.settings.clip == Clip::Norm; }
  // The gap penalty needs each segment's step norm, value clipping's statistics the clamped count:
  // both are sums over the shards.
  bool needs_steps() const {
    return s_.prepared.settings.penalty == Penalty::Gap || s_.prepared.settings.clip == Clip::Value;
  }
  size_t segment_count() const { return s_.segments.size(); }
  // A rank's row of step_partials_: Σs² per segment, then its clamped and trained element counts.
  size_t step_row() const { return segment_count() + 2; }

  // 1. This shard of the average is known: c_J = B_J + w step_J. Every rank computes every
  // segment's lambda from the (identical) gap history; with norm clipping this shard's part of
  // each segment's norm goes to the others, otherwise the verdict is decided here.
  void after_reduce() {
    S& s = s_;
    float* b = s.comm_buffer.data();
    bool finite = true;
    for (const ShardPart& part : parts_) {
      const float w = anchor_weight_of(s.buffer_values(), s.segments[part.segment]);
      float* c = b + part.begin;
      const float* step = step_.data() + (part.begin - mine_.begin);
      for (size_t i = 0; i < part.count; ++i) c[i] = restored_average(c[i], step[i], w);
      finite = finite && all_finite(c, part.count);
    }
    average_finite_ = finite;
    next_history_ = s.history;
    lambda_.assign(segment_count(), 1.0);
    for (size_t i = 0; i < segment_count(); ++i)
      if (s.segments[i].role == Role::Parameter) lambda_[i] = segment_lambda(s.prepared.settings, next_history_[i]);
    scale_.assign(segment_count(), 1.0);
    if (!needs_norms()) return decide();
    const size_t row = size_t(shards_->rank()) * segment_count();
    std::fill(norm_partials_.begin() + long(row), norm_partials_.begin() + long(row + segment_count()), 0.0);
    plan();
    for (size_t i = 0; i < parts_.size(); ++i) {
      const ShardPart& part = parts_[i];
      if (s.segments[part.segment].role != Role::Parameter) continue;
      const size_t off = part.begin - mine_.begin;
      norm_partials_[row + part.segment] = momentum_candidate_sum_squares(
          chain_momentum_ ? chain_momentum_ + off : nullptr, b + part.begin, part.count, planned_[i].k);
    }
  }

  // 1b. Every shard's parts of the norms, summed in shard order: the same scale on every rank.
  void after_norms() {
    S& s = s_;
    const int w = shards_->size();
    for (size_t i = 0; i < segment_count(); ++i) {
      if (s.segments[i].role != Role::Parameter) continue;
      double sum = 0.0;
      for (int r = 0; r < w; ++r) sum += norm_partials_[size_t(r) * segment_count() + i];
      scale_[i] = norm_clip_scale(sum, s.prepared.settings.clip_threshold);
    }
    decide();
  }

  // Whether this shard's average and its update are finite. With a momentum, which the update
  // writes in place, a read-only pass decides and the update waits for every rank's verdict;
  // without one the update runs here (B_J is restored from cur_J if another shard refuses).
  void decide() {
    S& s = s_;
    bool finite = average_finite_;
    plan();
    if (finite && chain_momentum_) {
      for (size_t i = 0; i < parts_.size() && finite; ++i) {
        const ShardPart& part = parts_[i];
        const size_t off = part.begin - mine_.begin;
        finite = update_result_finite(planned_[i].flags, cur_.data() + off, chain_momentum_ + off,
                                      s.comm_buffer.data() + part.begin, part.count, planned_[i].k);
      }
    } else if (finite) {
      finite = update();
    }
    verdicts_.data()[s.comm->rank()] = finite ? 1.0f : 0.0f;
  }

  // The update of this shard: the momentum in place, the next anchor into B_J, this shard's
  // part of each segment's step norm. False when the result is not finite.
  bool update() {
    S& s = s_;
    bool finite = true;
    const size_t row = size_t(shards_->rank()) * step_row();
    std::fill(step_partials_.begin() + long(row), step_partials_.begin() + long(row + step_row()), 0.0);
    summary_.clamped = summary_.trained_elements = 0;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const ShardPart& part = parts_[i];
      const size_t off = part.begin - mine_.begin;
      float* m = chain_momentum_ ? chain_momentum_ + off : nullptr;
      const PassResult r = run_boundary_pass(planned_[i].flags, nullptr, cur_.data() + off, m,
                                             s.comm_buffer.data() + part.begin, part.count, planned_[i].k);
      finite = finite && r.result_finite;
      if (s.segments[part.segment].role != Role::Parameter) continue;
      summarize_pass(part.count, r.clamped, &summary_);
      step_partials_[row + part.segment] = r.step_sum_squares;
    }
    step_partials_[row + segment_count()] = double(summary_.clamped);
    step_partials_[row + segment_count() + 1] = double(summary_.trained_elements);
    return finite;
  }

  // 2. Every rank's verdict: all finite -> the update; otherwise B_J <- cur_J, so that the
  // all-gather brings the unchanged anchor.
  void after_verdicts() {
    S& s = s_;
    bool all = true;
    for (size_t r = 0; r < verdicts_.size(); ++r) all = all && verdicts_.data()[r] == 1.0f;
    if (all && chain_momentum_) update();  // checked finite by decide's read-only pass
    if (!all) copy_shard(s.comm_buffer.data() + mine_.begin, cur_.data());
    verdict_finite_.store(all);
  }

  // 2b. The gap penalty's g of the next update, alpha ||s|| per segment, and the clamped count
  // of the whole update, from every rank's part.
  void after_steps() {
    S& s = s_;
    if (!verdict_finite_.load()) return;
    const int w = shards_->size();
    auto total = [&](size_t column) {
      double sum = 0.0;
      for (int r = 0; r < w; ++r) sum += step_partials_[size_t(r) * step_row() + column];
      return sum;
    };
    for (size_t i = 0; i < segment_count(); ++i)
      if (s.segments[i].role == Role::Parameter)
        record_update(s.segments[i], s.prepared.settings.outer_lr, total(i), next_history_[i]);
    summary_.clamped = uint64_t(total(segment_count()));
    summary_.trained_elements = uint64_t(total(segment_count() + 1));
  }

  // Coefficients of this shard's parts from lambda_ and scale_, the same on every rank, and the
  // update's figures for the statistics (penalties and scales of every segment).
  void plan() {
    S& s = s_;
    const OuterSettings& o = s.prepared.settings;
    summary_ = empty_summary();
    for (size_t i = 0; i < segment_count(); ++i)
      if (s.segments[i].role == Role::Parameter) summarize_segment(lambda_[i], scale_[i], &summary_);
    planned_.assign(parts_.size(), Planned{});
    for (size_t i = 0; i < parts_.size(); ++i) {
      const size_t segment = parts_[i].segment;
      planned_[i].flags.prepare = true;
      segment_coefficients(o, s.segments[segment], lambda_[segment], scale_[segment], chain_momentum_ != nullptr,
                           &planned_[i].flags, &planned_[i].k);
    }
  }

  // A blob's raw average (not prepared): the chain without its reduction, waited for (every rank
  // is at the same boundary). False when not finite.
  bool prepare_loaded_average() {
    S& s = s_;
    fix_chain_inputs();
    std::fill(step_.data(), step_.data() + step_.size(), 0.0f);
    after_reduce();
    auto request = submit_after_reduce(nullptr);
    s.wait_collective(request);
    return verdict_finite_.load();
  }

  // After a chain ran: what a save writes as the prepared update (the replicated format), and
  // what the next pass adopts.
  void remember_prepared(bool finite) {
    S& s = s_;
    s.prepared.ready = finite;
    s.prepared.history = finite ? next_history_ : s.history;
    s.prepared.summary = summary_;
    s.prepared.summary_known = true;
  }

  // Hierarchical: a node's ranks see different data, so their BUFFER segments (running
  // statistics) differ; averaged inside the node (blocking, the buffers only) they are the node's,
  // and the nodes' average of those is every rank's.
  void average_buffers_in_node() {
    S& s = s_;
    const size_t buffers = s.state_count - s.trained_count;
    if (buffers == 0 || s.intra->size() == 1) return;
    node_buffers_.resize(buffers);
    size_t offset = 0;
    for (const Segment& seg : s.segments)
      if (seg.role == Role::Buffer) {
        with_params(seg, [&](auto* p) { widen_into(p, node_buffers_.data() + offset, seg.count); });
        offset += seg.count;
      }
    auto request = s.intra->allreduce(node_buffers_.data(), buffers, DataType::F32, ReduceOp::Avg,
                                      {s.intra_owner, Purpose::ParameterAverage});
    s.wait_collective(request);
    offset = 0;
    for (Segment& seg : s.segments)
      if (seg.role == Role::Buffer) {
        with_params(seg, [&](auto* p) { narrow_into(node_buffers_.data() + offset, p, seg.count); });
        offset += seg.count;
      }
  }

  // Copies this rank's shard (which may be empty: N < W leaves the last ranks none).
  void copy_shard(float* dst, const float* src) const { std::copy(src, src + mine_.count(), dst); }

  void take_anchor_from_buffer() {
    copy_shard(cur_.data(), s_.comm_buffer.data() + mine_.begin);
  }

  // into <- segment `seg` of a sharded buffer, from the shards that hold a part of it: every
  // other rank contributes zeros, summed as integers so that every bit pattern (-0, NaN)
  // arrives unchanged (blocking, collective over the shards' ranks).
  const float* assemble_segment(const FloatBuffer& shard, const Segment& seg, std::vector<float>& into) {
    saved_bits_.assign(seg.count, 0);
    const size_t begin = std::max(seg.state_offset, mine_.begin);
    const size_t end = std::min(seg.state_offset + seg.count, mine_.end);
    if (begin < end)
      std::memcpy(saved_bits_.data() + (begin - seg.state_offset), shard.data() + (begin - mine_.begin),
                  (end - begin) * sizeof(float));
    auto request = shards_->allreduce(saved_bits_.data(), seg.count, DataType::I32, ReduceOp::Sum,
                                      {shard_owner_, Purpose::Consensus});
    if (request->wait_status() != Status::Ok) fail(shards_->error_status(), shards_->error_message());
    into.resize(seg.count);
    std::memcpy(into.data(), saved_bits_.data(), seg.count * sizeof(float));
    return into.data();
  }

  void count_state() {
    const S& s = s_;
    const size_t floats = s.comm_buffer.size() + cur_.size() + step_.size() + momentum_.size() + verdicts_.size() +
                          s.residual.size() + eager_offset_.size() + eager_momentum_.size() + round_start_.size();
    s_.counters.outer_state_bytes = floats * sizeof(float);
  }

  struct Planned {
    PassFlags flags{false, false, false, false, false};
    OuterCoefficients k;
  };

  S& s_;
  std::unique_ptr<Backend> host_;  // what sharding leaves as it is: gradients, parameter averages
  Communicator* shards_ = nullptr;  // whose ranks hold the shards: all, or the node's
  uint32_t shard_owner_ = 0;
  int shard_count_ = 0;  // the shards the state was cut into at commit (the communicator's size may change)
  ShardRange mine_;
  std::vector<ShardPart> parts_;
  FloatBuffer cur_, step_, momentum_;  // this rank's shards
  float* chain_momentum_ = nullptr;     // momentum_ as the chain in flight found it (or none)
  FloatBuffer verdicts_;               // one per rank: 1 = its shard's average and update finite
  std::vector<Planned> planned_;       // written on the progress thread only
  // Per rank and segment (rank-major): this rank's parts of the norm clipping's sums of squares
  // and of the last update's step, all-gathered so that every rank combines them alike.
  std::vector<double> norm_partials_, step_partials_;
  std::vector<double> lambda_, scale_;  // per segment, for the update in flight
  std::vector<GapHistory> next_history_;  // the gap history after the update in flight
  bool average_finite_ = true;
  std::vector<float> node_buffers_;    // hierarchical: the BUFFER segments averaged in the node
  UpdateSummary summary_ = empty_summary();  // of the last update; read after the chain completed
  std::atomic<bool> verdict_finite_{true};
  bool deltas_in_buffer_ = false;
  bool anchor_outside_shard_ = false;  // after the eager pass: only B_J holds deltas
  uint64_t pass_anchor_hash_ = 0;      // flat eager: a' hashed by the pass that overwrote it
  // The eager policy (hierarchical): this rank's shards of the node's offset and its momentum,
  // and the full round start a' + e the node gathers at a boundary.
  FloatBuffer eager_offset_, eager_momentum_, round_start_;
  // The shards of the group before a membership change, until assemble_outer_state read them.
  struct Kept {
    int shards = 0;
    FloatBuffer anchor, momentum;
  };
  Kept kept_;
  bool poisoned_ = false;
  float saved_first_ = 0.0f;
  std::vector<float> saved_anchor_, saved_other_;  // a save's current segment (saved_part)
  std::vector<int32_t> saved_bits_;                // ... as the integers its assembly sums
};

}  // namespace

std::unique_ptr<Backend> make_sharded_backend(BackendState& s) { return std::make_unique<ShardedBackend>(s); }

}  // namespace co2

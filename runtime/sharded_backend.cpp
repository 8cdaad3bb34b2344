// Sharded outer state (co2 on host tensors; docs/algorithm.md, "Sharded outer state"): rank r
// keeps only its shard J = shard_range(N, W, r) of the anchor, of the momentum and of the last
// outer step; one full-size buffer B (Engine::State::comm_buffer) carries everything else.
//
// Between boundaries B holds the anchor every rank's parameters take at the next boundary (the
// current one, or the next one once its all-gather arrived). At a boundary:
//   step_J  <- cur_J - B_J, cur_J <- B_J            (the update this boundary applies)
//   B       <- w * B - p, p <- B (old)              (w: anchor_weight, 0 for co2's BUFFERs)
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

#include "runtime/backend.hpp"
#include "runtime/boundary_pass.hpp"
#include "runtime/checksum.hpp"
#include "runtime/collectives.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/log.hpp"

namespace co2 {

namespace {

using S = Engine::State;

// The part of one segment inside this rank's shard.
struct ShardPart {
  size_t segment;  // index into State::segments
  size_t begin;    // state index of its first element
  size_t count;
};

float anchor_weight_of(const S& s, const Segment& seg) {
  return s.config.algorithm == Algorithm::Co2 && seg.role == Role::Buffer ? 0.0f : 1.0f;
}

class ShardedBackend final : public Backend {
 public:
  explicit ShardedBackend(S& s) : s_(s), host_(make_host_backend(s)) {}

  void check_memory(const void*, size_t, const std::string&) override {}
  void* allocate_flat(size_t count) override { return host_->allocate_flat(count); }

  void commit() override {
    S& s = s_;
    const int w = s.comm->size();
    shards_ = s.hierarchical() ? s.intra.get() : s.comm.get();
    shard_owner_ = s.hierarchical() ? s.intra_owner : s.owner;
    mine_ = shard_range(s.state_count, shards_->size(), shards_->rank());
    collectives::Tuning tuning;
    tuning.chunk_bytes = s.comm->options().chunk_bytes;
    s.outer_wire_bytes =
        (s.hierarchical()
             ? collectives::allreduce_wire_bytes(s.inter->rank(), s.inter->size(), mine_.count(), s.config.wire_format, tuning)
             : collectives::reduce_scatter_wire_bytes(s.comm->rank(), w, s.state_count, s.config.wire_format,
                                                      tuning)) +
        collectives::allgather_shards_wire_bytes(shards_->rank(), shards_->size(), s.state_count, tuning);
    for (size_t i = 0; i < s.segments.size(); ++i) {
      const Segment& seg = s.segments[i];
      if (seg.role == Role::Excluded) continue;
      const size_t begin = std::max(seg.state_offset, mine_.begin);
      const size_t end = std::min(seg.state_offset + seg.count, mine_.end);
      if (begin < end) parts_.push_back(ShardPart{i, begin, end - begin});
    }
    s.comm_buffer = FloatBuffer(s.state_count);
    cur_ = FloatBuffer(mine_.count());
    step_ = FloatBuffer(mine_.count());
    if (s.momentum_needed()) momentum_ = FloatBuffer(mine_.count());
    verdicts_ = FloatBuffer(size_t(w));
    if (s.error_feedback()) s.residual = FloatBuffer(s.state_count);
    // Rank 0's values become everyone's parameters and anchor.
    float* b = s.comm_buffer.data();
    pack_parameters(s, b);
    auto request = s.comm->broadcast(b, s.state_count, DataType::F32, 0, s.id(Purpose::InitialBroadcast));
    if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
    unpack_parameters(s, b, false);
    std::memcpy(cur_.data(), b + mine_.begin, mine_.count() * sizeof(float));
    count_state();
  }

  void momentum_needed() override {
    if (momentum_.empty()) momentum_ = FloatBuffer(mine_.count());
    count_state();
  }

  Arrival collect_average() override {
    S& s = s_;
    Arrival a;
    if (s.pending) {
      auto request = std::move(s.pending);
      s.pending.reset();
      wait_charged(s, request);
      a.have = true;
      a.finite = verdict_finite_.load();
      s.average_ready = false;
      remember_prepared(a.finite);
      return a;
    }
    if (s.average_ready) {  // collected by save, or restored from a checkpoint
      s.average_ready = false;
      a.have = true;
      a.finite = s.ready_average_finite;
      if (a.finite && !s.prepared.ready) a.finite = prepare_loaded_average();
      remember_prepared(a.finite);
    }
    return a;
  }

  DeltasFinite apply_update_and_write_deltas() override {
    commit_update(s_, s_.config.clip, &summary_);
    return pass(/*params_take_anchor=*/true);
  }
  DeltasFinite write_deltas() override { return pass(/*params_take_anchor=*/true); }
  DeltasFinite eager_pass(bool) override {
    fail(Status::Unsupported, "the eager policy with sharded outer state");  // refused at commit
  }

  void submit_average() override { submit_chain(); }

  // finalize: the collected next anchor becomes the anchor and the parameters.
  void apply_update() override {
    commit_update(s_, s_.config.clip, &summary_);
    take_anchor_from_buffer();
    unpack_parameters(s_, s_.comm_buffer.data(), false);
  }
  void clear_eager_state() override {}

  // co2's warm-up rounds: the same chain, waited for at once.
  bool average_deltas_blocking() override {
    S& s = s_;
    pass(/*params_take_anchor=*/false);
    submit_chain();
    auto request = std::move(s.pending);
    s.pending.reset();
    wait_charged(s, request);
    return verdict_finite_.load();
  }
  void apply_blocking_update() override { apply_update(); }

  bool average_parameters(bool buffers_only) override { return host_->average_parameters(buffers_only); }
  bool average_gradients(void* const* grads, size_t n) override { return host_->average_gradients(grads, n); }

  // Only where B holds the anchor: after a collect, or when nothing was submitted yet.
  void set_parameters_to_anchor() override { unpack_parameters(s_, s_.comm_buffer.data(), false); }

  // Right after a boundary's pass B holds deltas and the parameters hold the anchor; otherwise B
  // holds it. Either is the same on every rank that trains the same model.
  uint64_t consensus_checksum() override {
    if (deltas_in_buffer_) return parameters_checksum(s_);
    WordHasher hasher;
    hasher.update(s_.comm_buffer.data(), s_.state_count);
    return hasher.digest();
  }

  // The anchor: every rank's shard, gathered (collective in this mode).
  void consensus_into(float* out, size_t count, bool parameters, bool average) override {
    if (parameters) return host_->consensus_into(out, count, parameters, average);
    gather_shards(cur_, out, Purpose::Consensus);
  }

  void set_caller_stream(void*) override {}
  void wait_for_caller(const char*) override {}
  void fold_reports(bool) override {}
  void drain() noexcept override {
    if (s_.pending) s_.pending->wait_status();
  }

  // --- checkpoints: the replicated format, through full-size host copies made for the save ---
  bool has_momentum() const override { return !momentum_.empty(); }

  void stage_out() override {
    S& s = s_;
    s.anchor = FloatBuffer(s.state_count);
    gather_shards(cur_, s.anchor.data(), Purpose::Consensus);
    if (!momentum_.empty()) {
      s.momentum = FloatBuffer(s.state_count);
      gather_shards(momentum_, s.momentum.data(), Purpose::Consensus);
    }
    // A refused average left B holding the unchanged anchor; a blob says "not finite" by its
    // values, so the average slot gets a NaN for the save.
    poisoned_ = s.average_ready && !s.ready_average_finite;
    if (poisoned_) {
      saved_first_ = s.comm_buffer.data()[0];
      s.comm_buffer.data()[0] = std::nanf("");
    }
  }

  void release_staged() override {
    s_.anchor = FloatBuffer();
    s_.momentum = FloatBuffer();
    if (poisoned_) s_.comm_buffer.data()[0] = saved_first_;
    poisoned_ = false;
  }

  // Loaded: the full anchor, momentum and average slots. This rank keeps its shards; B takes the
  // average slot (the next anchor when prepared; a raw average is prepared at the next collect),
  // or else the anchor.
  void stage_in() override {
    S& s = s_;
    std::memcpy(cur_.data(), s.anchor.data() + mine_.begin, mine_.count() * sizeof(float));
    if (s.momentum_needed() && momentum_.empty()) momentum_ = FloatBuffer(mine_.count());
    if (!momentum_.empty()) {
      if (s.momentum.empty())
        std::memset(momentum_.data(), 0, mine_.count() * sizeof(float));
      else
        std::memcpy(momentum_.data(), s.momentum.data() + mine_.begin, mine_.count() * sizeof(float));
    }
    if (s.comm_buffer.empty()) s.comm_buffer = FloatBuffer(s.state_count);
    if (!s.average_ready) std::memcpy(s.comm_buffer.data(), s.anchor.data(), s.state_count * sizeof(float));
    deltas_in_buffer_ = false;
    unpack_parameters(s, s.anchor.data(), false);
    s.anchor = FloatBuffer();
    s.momentum = FloatBuffer();
    count_state();
  }

 private:
  // The boundary's pass (see the top of the file). params_take_anchor: p <- the anchor in B
  // (co2); otherwise p stays (warm-up: the chain is waited for and the parameters take its
  // result). Returns whether every delta was finite.
  DeltasFinite pass(bool params_take_anchor) {
    S& s = s_;
    const TraceSpan trace(s.trace.get(), "sharded pass");
    if (s.hierarchical()) average_buffers_in_node();
    float* b = s.comm_buffer.data();
    for (size_t i = 0; i < mine_.count(); ++i) {
      step_.data()[i] = cur_.data()[i] - b[mine_.begin + i];
      cur_.data()[i] = b[mine_.begin + i];
    }
    bool finite = true;
    for (const Segment& seg : s.segments) {
      if (seg.role == Role::Excluded) continue;
      float* anchor = b + seg.state_offset;
      const float w = anchor_weight_of(s, seg);
      finite = with_params(seg, [&](auto* p) {
                 using P = std::remove_pointer_t<decltype(p)>;
                 bool ok = true;
                 for (size_t i = 0; i < seg.count; ++i) {
                   const float a = anchor[i];
                   const float d = w * a - widen(p[i]);
                   anchor[i] = d;
                   ok = ok && std::isfinite(d);
                   if (params_take_anchor) p[i] = narrow<P>(a);
                 }
                 return ok;
               }) && finite;
    }
    deltas_in_buffer_ = true;
    return finite ? DeltasFinite::Yes : DeltasFinite::No;
  }

  // The chain of the top of the file, on the progress thread; s.pending is its last request.
  void submit_chain() {
    S& s = s_;
    s.prepared.settings = outer_settings_of(s);
    verdict_finite_.store(false);
    float* b = s.comm_buffer.data();
    std::shared_ptr<Request> reduced;
    if (s.hierarchical()) {
      // Only this rank's shard travels across the nodes; its node's other ranks send theirs.
      WireCompression wire;
      wire.format = s.config.wire_format;
      if (s.error_feedback()) {
        float* shard = b + mine_.begin;
        const float* dropped = s.residual.data() + mine_.begin;
        for (size_t i = 0; i < mine_.count(); ++i) shard[i] += std::isfinite(dropped[i]) ? dropped[i] : 0.0f;
        wire.residual = s.residual.data() + mine_.begin;
      }
      s.stats.wire_bytes_last_round = s.outer_wire_bytes;
      s.stats.wire_bytes_total += s.outer_wire_bytes;
      reduced = s.inter->allreduce_then(b + mine_.begin, mine_.count(), DataType::F32, ReduceOp::Avg,
                                        [this] { check_shard(); }, {s.inter_owner, Purpose::OuterAverage}, wire);
    } else {
      const WireCompression wire = outer_wire(s, b);
      reduced = s.comm->reduce_scatter(b, s.state_count, DataType::F32, ReduceOp::Avg, s.id(Purpose::OuterAverage),
                                       wire, [this] { check_shard(); });
    }
    auto verdicts = s.comm->allgather_shards(verdicts_.data(), verdicts_.size(), DataType::F32,
                                             s.id(Purpose::OuterAverage), [this] { update_shard(); }, reduced);
    s.pending = shards_->allgather_shards(b, s.state_count, DataType::F32, {shard_owner_, Purpose::OuterAverage}, {},
                                          verdicts);
    s.stats.bytes_reduced += mine_.count() * sizeof(float);
    deltas_in_buffer_ = false;
  }

  // reduce_scatter's on_result: c_J = B_J + w step_J, then whether it and its update are finite.
  // With a momentum, which the update writes in place, a read-only pass decides and the update
  // waits for every rank's verdict; without one the update runs here (B_J is restored from cur_J
  // if another shard refuses).
  void check_shard() {
    S& s = s_;
    float* b = s.comm_buffer.data();
    bool finite = true;
    for (const ShardPart& part : parts_) {
      const float w = anchor_weight_of(s, s.segments[part.segment]);
      float* c = b + part.begin;
      const float* step = step_.data() + (part.begin - mine_.begin);
      for (size_t i = 0; i < part.count; ++i) c[i] += w * step[i];
      finite = finite && all_finite(c, part.count);
    }
    if (finite && !momentum_.empty()) {
      plan(/*summarise=*/false);
      for (size_t i = 0; i < parts_.size() && finite; ++i) {
        const ShardPart& part = parts_[i];
        const size_t off = part.begin - mine_.begin;
        finite = update_result_finite(planned_[i].flags, cur_.data() + off, momentum_.data() + off, b + part.begin,
                                      part.count, planned_[i].k);
      }
    } else if (finite) {
      finite = update();
    }
    verdicts_.data()[s.comm->rank()] = finite ? 1.0f : 0.0f;
  }

  // The update of this shard: the momentum in place, the next anchor into B_J. False when the
  // result is not finite.
  bool update() {
    S& s = s_;
    plan(/*summarise=*/true);
    bool finite = true;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const ShardPart& part = parts_[i];
      const size_t off = part.begin - mine_.begin;
      float* m = momentum_.empty() ? nullptr : momentum_.data() + off;
      const PassResult r = run_boundary_pass(planned_[i].flags, nullptr, cur_.data() + off, m,
                                             s.comm_buffer.data() + part.begin, part.count, planned_[i].k);
      finite = finite && r.result_finite;
      if (s.segments[part.segment].role == Role::Parameter) {
        summary_.clamped += r.clamped;
        summary_.trained_elements += part.count;
      }
    }
    return finite;
  }

  // The verdicts' on_result: every shard finite -> the update (momentum in place, the next
  // anchor into B_J); otherwise B_J <- cur_J, so that the all-gather brings the unchanged anchor.
  void update_shard() {
    S& s = s_;
    bool all = true;
    for (size_t r = 0; r < verdicts_.size(); ++r) all = all && verdicts_.data()[r] == 1.0f;
    if (all && !momentum_.empty()) update();  // checked finite by check_shard's read-only pass
    if (!all) std::memcpy(s.comm_buffer.data() + mine_.begin, cur_.data(), mine_.count() * sizeof(float));
    verdict_finite_.store(all);
  }

  // Coefficients of every part (penalty none or constant, value clip: elementwise, so that a
  // shard's update needs nothing of the other shards).
  void plan(bool summarise) {
    S& s = s_;
    planned_.assign(parts_.size(), Planned{});
    if (summarise) summary_ = UpdateSummary{};
    UpdateSummary unused;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const ShardPart& part = parts_[i];
      const size_t off = part.begin - mine_.begin;
      GapHistory unchanged = s.history[part.segment];
      planned_[i].flags.prepare = true;
      update_coefficients(s.prepared.settings, s.segments[part.segment], unchanged,
                          momentum_.empty() ? nullptr : momentum_.data() + off, s.comm_buffer.data() + part.begin,
                          &planned_[i].flags, &planned_[i].k, summarise ? &summary_ : &unused);
    }
  }

  // A blob's raw average (not prepared): the update of this shard from it, then the next anchor
  // gathered (blocking; every rank is at the same boundary). False when not finite.
  bool prepare_loaded_average() {
    S& s = s_;
    s.prepared.settings = outer_settings_of(s);
    std::fill(step_.data(), step_.data() + step_.size(), 0.0f);
    check_shard();
    float* verdicts = verdicts_.data();
    auto request = s.comm->allgather_shards(verdicts, verdicts_.size(), DataType::F32, s.id(Purpose::OuterAverage));
    wait_charged(s, request);
    update_shard();
    request = shards_->allgather_shards(s.comm_buffer.data(), s.state_count, DataType::F32,
                                        {shard_owner_, Purpose::OuterAverage});
    wait_charged(s, request);
    return verdict_finite_.load();
  }

  // After a collect: what a save writes as the prepared update (the replicated format).
  void remember_prepared(bool finite) {
    S& s = s_;
    s.prepared.ready = finite;
    s.prepared.history = s.history;
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
    wait_charged(s, request);
    offset = 0;
    for (Segment& seg : s.segments)
      if (seg.role == Role::Buffer) {
        with_params(seg, [&](auto* p) { narrow_into(node_buffers_.data() + offset, p, seg.count); });
        offset += seg.count;
      }
  }

  void take_anchor_from_buffer() {
    std::memcpy(cur_.data(), s_.comm_buffer.data() + mine_.begin, mine_.count() * sizeof(float));
  }

  // out[0, N) <- every rank's `shard` (blocking all-gather).
  void gather_shards(const FloatBuffer& shard, float* out, Purpose purpose) {
    S& s = s_;
    std::memcpy(out + mine_.begin, shard.data(), mine_.count() * sizeof(float));
    auto request = shards_->allgather_shards(out, s.state_count, DataType::F32, {shard_owner_, purpose});
    if (request->wait_status() != Status::Ok) fail(shards_->error_status(), shards_->error_message());
  }

  void count_state() {
    const S& s = s_;
    const size_t floats = s.comm_buffer.size() + cur_.size() + step_.size() + momentum_.size() + verdicts_.size() +
                          s.residual.size();
    s_.stats.outer_state_bytes = floats * sizeof(float);
  }

  struct Planned {
    PassFlags flags{false, false, false, false, false};
    OuterCoefficients k;
  };

  S& s_;
  std::unique_ptr<Backend> host_;  // what sharding leaves as it is: gradients, parameter averages
  Communicator* shards_ = nullptr;  // whose ranks hold the shards: all, or the node's
  uint32_t shard_owner_ = 0;
  ShardRange mine_;
  std::vector<ShardPart> parts_;
  FloatBuffer cur_, step_, momentum_;  // this rank's shards
  FloatBuffer verdicts_;               // one per rank: 1 = its shard's average and update finite
  std::vector<Planned> planned_;       // written on the progress thread only
  std::vector<float> node_buffers_;    // hierarchical: the BUFFER segments averaged in the node
  UpdateSummary summary_;              // of the last update; read after the chain completed
  std::atomic<bool> verdict_finite_{true};
  bool deltas_in_buffer_ = false;
  bool poisoned_ = false;
  float saved_first_ = 0.0f;
};

}  // namespace

std::unique_ptr<Backend> make_sharded_backend(Engine::State& s) { return std::make_unique<ShardedBackend>(s); }

}  // namespace co2

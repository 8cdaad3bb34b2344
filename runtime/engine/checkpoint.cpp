// The checkpoint of the shared engine state: canonical (per segment, named, fp32 little-endian),
// CRC-32 protected, streamed through a callback on save, transactional on load.
//
//   header:  "CO2STATE" u32 format_version, u64 layout_hash, u32 world_size, u32 algorithm,
//            u32 flags, u32 tau, round_tau, steps_in_round, warmup_sync_rounds, penalty, clip,
//            anchor_check_interval, f64 outer_lr, beta, penalty_constant, clip_threshold,
//            inner_lr, u64 steps, rounds, outer_updates, nonfinite_rounds, num_segments,
//            u32 crc32(header so far)
//   per PARAMETER/BUFFER segment, in layout order:
//            u32 name_length, name bytes, u32 role, u64 count, f64 last_step_norm, f64 gap_sum,
//            u64 updates, f32 anchor[count] (if flags.anchor), f32 momentum[count] (if
//            flags.momentum), f32 average[count] (if flags.average)
//   trailer: u32 crc32(everything before), "CO2END!!"
//
// Version 2 adds flags.prepared (co2 on the host): the average slot holds the next anchor, the
// momentum and gap history are already those after the update (docs/algorithm.md, "The split
// boundary pass"). Blobs without it are written as version 1, which older libraries read.
//
// Version 3 is written by engines with the eager policy (flags.eager): the header is followed
// (inside its CRC) by u32 rank, the rank whose per-rank eager state the blob carries, and each
// PARAMETER segment ends with f32 eager_offset[count] and, if flags.momentum,
// f32 eager_momentum[count]. That state is restored only by the same rank at the same W.
//
// Version 4 is written by engines with error feedback (a compressed outer all-reduce,
// flags.error_feedback): the header is followed by u32 rank (as in version 3, also when the
// blob has no eager state), and every PARAMETER/BUFFER segment ends, after any eager state, with
// f32 residual[count]: what that rank's encodings dropped from the last outer all-reduce.
// Restored, like the eager state, only by the same rank at the same W into an engine with error
// feedback; anywhere else it is read and dropped.
//
// Version 5 is written by engines on CUDA tensors that save a co2 average in flight: their
// average is not prepared (the device computes the update in the boundary pass) and its BUFFER
// part already holds values, which flags.value_average says, so that it is not converted as a
// 1.0 blob's deltas would be. The layout hash of a CUDA engine differs from a host engine's:
// such a blob loads into an engine on CUDA tensors only.
//
// Version 6 is the per-rank checkpoint of a sharded engine (flags.shard): what co2_engine_save
// writes there, one blob per rank, none of them a full-size copy of the sharded state. The
// header is followed by u32 rank, u32 shards (the ranks the state is sharded over: all, or the
// node's with flags.hierarchical), u32 shard_rank, u64 shard_begin, u64 shard_count. Each
// segment record holds, of its elements inside [shard_begin, +shard_count): the anchor, the
// momentum (flags.momentum), and, when an average was collected (flags.average), what B held
// (the next anchor if flags.prepared; the anchor if the average was refused,
// flags.refused_average; else the raw average); then the eager slots of PARAMETER segments (the node's offsets and their momentum,
// shards; flat sharding: this rank's whole round start a + e and its momentum) and the whole
// residual. It loads only on the same rank of the same sharded engine; the replicated format
// (co2_engine_save_portable) moves between W and sharding.
//
// Version 7 is written by co2 engines that apply the average on arrival (config.apply_step)
// when they save an average not yet applied (flags.apply_at; a sharded engine's per-rank blob
// stays version 6 with the flag): the header is followed, after any per-rank fields, by u32
// apply_at, the step of the round at which the ranks apply it (0: at the
// next boundary; docs/algorithm.md, "Applying the average on arrival"), so that a restored run
// applies it where the saving run does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "runtime/backends/backend.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/engine/arrival.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/base/log.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the checkpoint format is little-endian; a big-endian host needs byte swapping here");

namespace co2 {
namespace {

constexpr char kMagic[8] = {'C', 'O', '2', 'S', 'T', 'A', 'T', 'E'};
constexpr char kTrailer[8] = {'C', 'O', '2', 'E', 'N', 'D', '!', '!'};
constexpr uint32_t kFormatVersion = 1;
constexpr uint32_t kPreparedFormatVersion = 2;
constexpr uint32_t kEagerFormatVersion = 3;
constexpr uint32_t kErrorFeedbackFormatVersion = 4;
constexpr uint32_t kValueAverageFormatVersion = 5;
constexpr uint32_t kShardFormatVersion = 6;
constexpr uint32_t kApplyAtFormatVersion = 7;

constexpr uint32_t kBetaAuto = 1u << 0;
constexpr uint32_t kNesterov = 1u << 1;
constexpr uint32_t kHasMomentum = 1u << 2;
constexpr uint32_t kHasAverage = 1u << 3;
constexpr uint32_t kHasAnchor = 1u << 4;
constexpr uint32_t kPrepared = 1u << 5;  // version 2
constexpr uint32_t kEager = 1u << 6;     // version 3
constexpr uint32_t kErrorFeedback = 1u << 7;  // version 4
constexpr uint32_t kValueAverage = 1u << 8;   // version 5
constexpr uint32_t kShard = 1u << 9;          // version 6
constexpr uint32_t kHierarchical = 1u << 10;  // version 6
constexpr uint32_t kRefusedAverage = 1u << 11;  // version 6
constexpr uint32_t kApplyAt = 1u << 12;         // version 7
constexpr uint32_t kShardFlags = kShard | kHierarchical | kRefusedAverage;
constexpr uint32_t kKnownFlags = kBetaAuto | kNesterov | kHasMomentum | kHasAverage | kHasAnchor | kPrepared |
                                   kEager | kErrorFeedback | kValueAverage | kShardFlags | kApplyAt;

// Counts bytes and CRC; forwards to the user's callback when there is one. Without one it only
// counts and never reads `data`: state_size runs while the progress thread may be writing the
// buffers (the average in flight, the momentum of its prepared update).
class Sink {
 public:
  explicit Sink(const WriteFn* write) : write_(write) {}
  void bytes(const void* data, size_t length) {
    if (write_ && !data && length)
      fail(Status::Internal, "checkpoint writer: a state buffer was not staged for the save");
    if (write_) crc_ = crc32_update(crc_, data, length);
    total_ += length;
    if (write_ && *write_ && !(*write_)(data, length))
      fail(Status::Callback, "the checkpoint write callback reported failure at byte " + std::to_string(total_ - length));
  }
  template <typename T>
  void value(T v) { bytes(&v, sizeof v); }
  uint32_t crc() const { return crc_; }
  size_t total() const { return total_; }
  bool counting() const { return write_ == nullptr; }

 private:
  const WriteFn* write_;
  uint32_t crc_ = 0;
  size_t total_ = 0;
};

class Source {
 public:
  explicit Source(const ReadFn& read) : read_(read) {}
  void bytes(void* data, size_t length) {
    if (!read_(data, length))
      fail(Status::Callback, "the checkpoint read callback reported failure at byte " + std::to_string(total_) +
                                 " (truncated or unreadable blob); the engine is unchanged");
    crc_ = crc32_update(crc_, data, length);
    total_ += length;
  }
  template <typename T>
  T value() {
    T v;
    bytes(&v, sizeof v);
    return v;
  }
  uint32_t crc() const { return crc_; }

 private:
  const ReadFn& read_;
  uint32_t crc_ = 0;
  size_t total_ = 0;
};

struct Header {
  uint64_t layout_hash = 0;
  uint32_t world_size = 0, algorithm = 0, flags = 0, tau = 0, round_tau = 0, steps_in_round = 0,
           warmup_sync_rounds = 0, penalty = 0, clip = 0, anchor_check_interval = 0;
  double outer_lr = 0, beta = 0, penalty_constant = 0, clip_threshold = 0, inner_lr = 0;
  uint64_t steps = 0, rounds = 0, outer_updates = 0, nonfinite_rounds = 0, num_segments = 0;
};

template <typename Io, typename H>
void visit_header(Io& io, H& h) {
  // One field list for both directions keeps writer and reader from drifting apart.
  io(h.layout_hash); io(h.world_size); io(h.algorithm); io(h.flags); io(h.tau); io(h.round_tau);
  io(h.steps_in_round); io(h.warmup_sync_rounds); io(h.penalty); io(h.clip);
  io(h.anchor_check_interval); io(h.outer_lr); io(h.beta); io(h.penalty_constant);
  io(h.clip_threshold); io(h.inner_lr); io(h.steps); io(h.rounds); io(h.outer_updates);
  io(h.nonfinite_rounds); io(h.num_segments);
}

std::string algorithm_name(uint32_t algorithm) {
  switch (Algorithm(algorithm)) {
    case Algorithm::Co2: return "co2";
    case Algorithm::Sync: return "sync";
    case Algorithm::LocalSgd: return "localsgd";
    case Algorithm::Diloco: return "diloco";
  }
  return std::to_string(algorithm);
}

size_t stateful_segments(const Engine::State& s) {
  size_t n = 0;
  for (const Segment& seg : s.segments) n += seg.role != Role::Excluded;
  return n;
}

// with_average: whether the blob carries an average (save collects an in-flight one first);
// prepared: whether that average's update is already prepared.
Header header_of(const Engine::State& s, bool with_average, bool prepared) {
  Header h;
  h.layout_hash = s.layout_hash;
  h.world_size = uint32_t(s.comm->size());
  h.algorithm = uint32_t(s.config.algorithm);
  h.flags = (s.beta_auto ? kBetaAuto : 0) | (s.config.nesterov ? kNesterov : 0) |
            (s.backend->has_momentum() ? kHasMomentum : 0) | (with_average ? kHasAverage : 0) |
            (s.has_anchor() ? kHasAnchor : 0) | (prepared ? kPrepared : 0) | (s.eager() ? kEager : 0) |
            (s.error_feedback() ? kErrorFeedback : 0) |
            (with_average && !prepared && s.on_device() ? kValueAverage : 0) |
            (with_average && applies_on_arrival(s) ? kApplyAt : 0);
  h.tau = s.config.tau;
  h.round_tau = s.round_tau;
  h.steps_in_round = s.steps_in_round;
  h.warmup_sync_rounds = s.config.warmup_sync_rounds;
  h.penalty = uint32_t(s.config.penalty);
  h.clip = uint32_t(s.config.clip);
  h.anchor_check_interval = s.config.anchor_check_interval;
  h.outer_lr = s.config.outer_lr;
  h.beta = s.beta;
  h.penalty_constant = s.config.penalty_constant;
  h.clip_threshold = s.config.clip_threshold;
  h.inner_lr = s.config.inner_lr;
  h.steps = s.stats.steps;
  h.rounds = s.stats.rounds;
  h.outer_updates = s.stats.outer_updates;
  h.nonfinite_rounds = s.stats.nonfinite_rounds;
  h.num_segments = stateful_segments(s);
  return h;
}

// The state elements of `seg` that a slot holds: all of them, or those in the shard.
struct Extent {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
Extent extent_of(const Segment& seg, bool whole, size_t shard_begin, size_t shard_count) {
  if (whole) return {seg.state_offset, seg.state_offset + seg.count};
  const size_t begin = std::max(seg.state_offset, shard_begin);
  const size_t end = std::min(seg.state_offset + seg.count, shard_begin + shard_count);
  return begin < end ? Extent{begin, end} : Extent{begin, begin};
}

// shard: the per-rank format (version 6) of a sharded backend's state; null: the replicated one.
void serialize(const Engine::State& s, bool with_average, bool prepared, Sink& out,
               const Backend::ShardView* shard = nullptr) {
  out.bytes(kMagic, sizeof kMagic);
  out.value(shard ? kShardFormatVersion
             : with_average && applies_on_arrival(s) ? kApplyAtFormatVersion
             : with_average && !prepared && s.on_device() ? kValueAverageFormatVersion
             : s.error_feedback() ? kErrorFeedbackFormatVersion
             : s.eager()        ? kEagerFormatVersion
             : prepared         ? kPreparedFormatVersion
                                : kFormatVersion);
  Header h = header_of(s, with_average, prepared);
  const std::vector<GapHistory>& history = prepared ? s.prepared.history : s.history;
  auto put = [&](auto v) { out.value(v); };
  if (shard)
    h.flags |= kShard | (shard->hierarchical ? kHierarchical : 0) |
               (with_average && !s.ready_average_finite ? kRefusedAverage : 0);
  visit_header(put, h);
  if (shard) {
    out.value(uint32_t(s.comm->rank()));
    out.value(shard->shards);
    out.value(shard->shard_rank);
    out.value(uint64_t(shard->begin));
    out.value(uint64_t(shard->count));
  } else if (h.flags & (kEager | kErrorFeedback)) {
    out.value(uint32_t(s.comm->rank()));
  }
  if (h.flags & kApplyAt) out.value(s.arrival.apply_at);
  out.value(out.crc());
  for (size_t i = 0; i < s.segments.size(); ++i) {
    const Segment& seg = s.segments[i];
    if (seg.role == Role::Excluded) continue;
    out.value(uint32_t(seg.name.size()));
    out.bytes(seg.name.data(), seg.name.size());
    out.value(uint32_t(seg.role));
    out.value(uint64_t(seg.count));
    out.value(history[i].last_step_norm);
    out.value(history[i].gap_sum);
    out.value(history[i].updates);
    if (shard) {
      // base: the state index of the buffer's first element (the shard's, or 0 when full-size).
      const auto slot = [&](const float* buffer, bool whole, size_t base) {
        const Extent e = extent_of(seg, whole, shard->begin, shard->count);
        out.bytes(out.counting() || e.size() == 0 ? nullptr : buffer + (e.begin - base), e.size() * sizeof(float));
      };
      slot(shard->anchor, false, shard->begin);
      if (h.flags & kHasMomentum) slot(shard->momentum, false, shard->begin);
      if (h.flags & kHasAverage) slot(shard->buffer, false, 0);  // refused: B_J holds the anchor
      if ((h.flags & kEager) && seg.role == Role::Parameter) {
        const size_t base = shard->eager_whole ? 0 : shard->begin;
        slot(shard->eager_offset, shard->eager_whole, base);
        if (h.flags & kHasMomentum) slot(shard->eager_momentum, shard->eager_whole, base);
      }
      if (h.flags & kErrorFeedback) slot(s.residual.data(), true, 0);
      continue;
    }
    const size_t bytes = seg.count * sizeof(float);
    // A counting Sink (state_size) reads nothing, must not make the sharded backend's
    // collectives, and forms no pointer into an empty buffer (null + offset is undefined).
    const auto at = [&](const FloatBuffer& buffer) -> const float* {
      return out.counting() || buffer.empty() ? nullptr : buffer.data() + seg.state_offset;
    };
    auto part = [&](Backend::SavedPart what, const FloatBuffer& staged) -> const float* {
      if (out.counting()) return nullptr;
      const float* assembled = s.backend->saved_part(what, i);
      return assembled ? assembled : at(staged);
    };
    if (h.flags & kHasAnchor) out.bytes(part(Backend::SavedPart::Anchor, s.anchor), bytes);
    if (h.flags & kHasMomentum) out.bytes(part(Backend::SavedPart::Momentum, s.momentum), bytes);
    if (h.flags & kHasAverage) out.bytes(at(s.comm_buffer), bytes);
    if ((h.flags & kEager) && seg.role == Role::Parameter) {
      out.bytes(part(Backend::SavedPart::EagerOffset, s.eager_offset), bytes);
      if (h.flags & kHasMomentum) out.bytes(part(Backend::SavedPart::EagerMomentum, s.eager_momentum), bytes);
    }
    if (h.flags & kErrorFeedback) out.bytes(at(s.residual), bytes);
  }
  out.value(out.crc());
  out.bytes(kTrailer, sizeof kTrailer);
}

}  // namespace

namespace {

// An average in flight counts: save collects it before writing. Whether its update is prepared
// (or refused) changes no size (and is the progress thread's to write until it is collected).
size_t size_of_blob(const Engine::State& s, bool portable) {
  require(s.committed, Status::InvalidState, "commit the layout before asking for the state size");
  Backend::ShardView shard;
  const bool per_rank = !portable && s.backend->shard_view(&shard);
  Sink counter(nullptr);
  serialize(s, s.average_ready || s.pending != nullptr, /*prepared=*/false, counter, per_rank ? &shard : nullptr);
  return counter.total();
}

}  // namespace

size_t Engine::state_size() const { return size_of_blob(*state_, /*portable=*/false); }
size_t Engine::portable_state_size() const { return size_of_blob(*state_, /*portable=*/true); }

void Engine::save(const WriteFn& write) {
  State& s = *state_;
  Backend::ShardView shard;
  if (!s.committed || !s.backend->shard_view(&shard)) return save_portable(write);
  s.advisor.pause();  // a save between steps is not a training step
  collect_pending_average(s);
  check_anchor(s);
  s.backend->shard_view(&shard);  // B's content may have changed with the collect
  Sink out(&write);
  serialize(s, s.average_ready, s.average_ready && s.prepared.ready, out, &shard);
}

void Engine::save_portable(const WriteFn& write) {
  State& s = *state_;
  require(s.committed, Status::InvalidState, "commit the layout before saving");
  s.advisor.pause();  // a save between steps is not a training step
  s.backend->wait_for_caller("save");
  collect_pending_average(s);
  // Without an anchor the consensus is the parameters, which differ across ranks mid-round
  // (localsgd) by design: compared at boundaries only (steps_in_round is equal on every rank).
  if (s.has_anchor() || s.steps_in_round == 0) check_anchor(s);
  s.backend->stage_out();
  struct Release {
    Backend& backend;
    ~Release() { backend.release_staged(); }
  } release{*s.backend};
  Sink out(&write);
  serialize(s, s.average_ready, s.average_ready && s.prepared.ready, out);
}

namespace {

// Throws CheckpointCorrupt naming the segment of the first non-finite element of `state`, whose
// first element is state element `base` (0 for a full-size buffer, the shard's begin for a shard).
void require_finite_in_blob(const Engine::State& s, const FloatBuffer& state, size_t base, const char* what) {
  if (all_finite(state.data(), state.size())) return;
  for (const Segment& seg : s.segments) {
    if (seg.role == Role::Excluded) continue;
    const Extent e = extent_of(seg, false, base, state.size());
    for (size_t i = e.begin; i < e.end; ++i)
      if (!std::isfinite(state.data()[i - base]))
        fail(Status::CheckpointCorrupt,
             std::string("checkpoint holds a non-finite ") + what + " (segment '" + seg.name + "', element " +
                 std::to_string(i - seg.state_offset) + "), which no co2 writer saves: the blob is corrupted or "
                 "was not written by co2; load another checkpoint");
  }
}

// A blob read and checked, not yet committed.
struct Loaded {
  Header h;
  EngineConfig config;
  bool prepared = false;
  bool shard = false;  // a sharded engine's shards (of either format)
  bool eager_offsets = true;  // the eager slot holds offsets e (else flat sharding's round start)
  bool average_finite = true;  // every element of this rank's part of the average
  bool has_apply_at = false;  // version 7: the step the saved average is applied at
  uint32_t apply_at = 0;
  FloatBuffer anchor, momentum, average, eager_offset, eager_momentum, residual;
  std::vector<GapHistory> history;
};

Loaded read_blob(const Engine::State& s, const ReadFn& read) {
  require(static_cast<bool>(read), Status::InvalidArgument, "read callback is NULL");
  Loaded l;
  Header& h = l.h;
  Source in(read);
  char magic[8];
  in.bytes(magic, sizeof magic);
  require(std::memcmp(magic, kMagic, sizeof magic) == 0, Status::CheckpointCorrupt,
          "not a co2 checkpoint (bad magic)");
  const auto version = in.value<uint32_t>();
  require(version != 0, Status::CheckpointCorrupt, "checkpoint format version is 0: the blob is corrupted");
  require(version >= kFormatVersion && version <= kApplyAtFormatVersion, Status::CheckpointMismatch,
          "checkpoint format version " + std::to_string(version) + " is newer than this library reads (" +
              std::to_string(kFormatVersion) + " to " + std::to_string(kApplyAtFormatVersion) +
              "): it was written by a newer co2, so load it with that version or a later one");
  auto get = [&](auto& v) { v = in.value<std::decay_t<decltype(v)>>(); };
  visit_header(get, h);
  // Per-rank state (version 3: eager; version 4: error feedback, possibly eager too; version 6:
  // a sharded engine's shard).
  const bool shard_blob = version >= kShardFormatVersion && (h.flags & kShard) != 0;
  const bool eager_blob = version >= kEagerFormatVersion && (h.flags & kEager) != 0;
  const bool residual_blob = version >= kErrorFeedbackFormatVersion && (h.flags & kErrorFeedback) != 0;
  const uint32_t eager_rank = shard_blob || eager_blob || residual_blob ? in.value<uint32_t>() : 0;
  uint32_t shards = 0, shard_rank = 0;
  uint64_t shard_begin = 0, shard_count = 0;
  if (shard_blob) {
    shards = in.value<uint32_t>();
    shard_rank = in.value<uint32_t>();
    shard_begin = in.value<uint64_t>();
    shard_count = in.value<uint64_t>();
  }
  const bool apply_at_blob = (version >= kApplyAtFormatVersion || shard_blob) && (h.flags & kApplyAt) != 0;
  l.has_apply_at = apply_at_blob;
  l.apply_at = apply_at_blob ? in.value<uint32_t>() : 0;
  const uint32_t header_crc = in.crc();
  require(in.value<uint32_t>() == header_crc, Status::CheckpointCorrupt, "checkpoint header CRC mismatch");
  require(shard_blob == (version == kShardFormatVersion) && (shard_blob || !(h.flags & kShardFlags)),
          Status::CheckpointCorrupt, "checkpoint flags are inconsistent (a shard's flags outside format 6)");
  require(h.layout_hash == s.layout_hash && h.num_segments == stateful_segments(s), Status::CheckpointMismatch,
          "the checkpoint was saved from another parameter layout (it holds " + std::to_string(h.num_segments) +
              " tensors, this engine " + std::to_string(stateful_segments(s)) +
              "; names, counts, roles or order differ: the model changed since the save?): resume with the model "
              "it was saved from, registered in the same order, or start a changed model from the old weights "
              "alone (load them into the model before commit) with a fresh engine");
  require(h.algorithm == uint32_t(s.config.algorithm), Status::CheckpointMismatch,
          "the checkpoint was saved by algorithm " + algorithm_name(h.algorithm) + ", this engine runs " +
              algorithm_name(uint32_t(s.config.algorithm)) + ": create the engine with the checkpoint's algorithm "
              "to resume it");
  Backend::ShardView view;
  const bool sharded_engine = s.backend->shard_view(&view);
  if (shard_blob) {
    const std::string whose = "the checkpoint holds the outer-state shard of rank " + std::to_string(eager_rank) +
                              " of a sharded engine at " + std::to_string(h.world_size) + " ranks";
    const std::string portable =
        "; to resume at another world size, with other sharding or without it, save with "
        "co2_engine_save_portable (the replicated format) instead";
    require(sharded_engine, Status::CheckpointMismatch,
            whose + ", which loads only into that sharded engine (this engine does not shard its outer state)" +
                portable);
    require(eager_rank == uint32_t(s.comm->rank()) && h.world_size == uint32_t(s.comm->size()),
            Status::CheckpointMismatch,
            whose + " but this is rank " + std::to_string(s.comm->rank()) + " of " + std::to_string(s.comm->size()) +
                ": every rank loads the blob it saved" + portable);
    require(shards == view.shards && shard_rank == view.shard_rank && shard_begin == view.begin &&
                shard_count == view.count && ((h.flags & kHierarchical) != 0) == view.hierarchical,
            Status::CheckpointMismatch,
            whose + " sharded over " + std::to_string(shards) + " ranks" +
                ((h.flags & kHierarchical) ? " (hierarchical)" : "") + ", but this engine shards over " +
                std::to_string(view.shards) + (view.hierarchical ? " (hierarchical)" : "") + portable);
  }

  EngineConfig& config = l.config;
  config = s.config;
  config.tau = h.tau;
  config.warmup_sync_rounds = h.warmup_sync_rounds;
  config.penalty = Penalty(h.penalty);
  config.clip = Clip(h.clip);
  config.anchor_check_interval = h.anchor_check_interval;
  config.outer_lr = h.outer_lr;
  config.nesterov = (h.flags & kNesterov) != 0;
  config.penalty_constant = h.penalty_constant;
  config.clip_threshold = h.clip_threshold;
  config.inner_lr = h.inner_lr;
  config.outer_momentum = (h.flags & kBetaAuto) ? -1.0 : h.beta;
  config.eager = (h.flags & kEager) ? Eager::On : Eager::Off;
  try {
    validate(config);
  } catch (const Error& e) {
    fail(Status::CheckpointCorrupt, std::string("checkpoint holds an invalid configuration: ") + e.what());
  }
  require(h.tau >= 1 && h.round_tau >= 1 && h.steps_in_round < h.round_tau, Status::CheckpointCorrupt,
          "checkpoint round counters are inconsistent");
  // The CRC only proves the blob is what some writer wrote: every flag must also be one this
  // engine's writer would have set, or the commit below would read buffers that are not there.
  const bool prepared = l.prepared = (h.flags & kPrepared) != 0;
  require(!prepared || (version >= kPreparedFormatVersion && (h.flags & kHasAverage) &&
                        h.algorithm == uint32_t(Algorithm::Co2)),
          Status::CheckpointCorrupt, "checkpoint flags are inconsistent (a prepared update without its average)");
  require((h.flags & ~kKnownFlags) == 0, Status::CheckpointCorrupt,
          "checkpoint flags hold unknown bits (" + std::to_string(h.flags & ~kKnownFlags) + ")");
  require(((h.flags & kHasAnchor) != 0) == s.has_anchor(), Status::CheckpointCorrupt,
          std::string("checkpoint flags are inconsistent: an engine of this algorithm ") +
              (s.has_anchor() ? "keeps an anchor but the blob has none" : "keeps no anchor but the blob has one"));
  require(!(h.flags & kHasMomentum) || s.has_anchor(), Status::CheckpointCorrupt,
          "checkpoint flags are inconsistent: momentum without an anchor");
  require(!(h.flags & kHasAverage) || h.algorithm == uint32_t(Algorithm::Co2), Status::CheckpointCorrupt,
          "checkpoint flags are inconsistent: only co2 saves an average in flight");
  require(apply_at_blob == ((h.flags & kApplyAt) != 0) && (!apply_at_blob || (h.flags & kHasAverage)) &&
              (version != kApplyAtFormatVersion || apply_at_blob),
          Status::CheckpointCorrupt, "checkpoint flags are inconsistent (an apply step without an average to apply)");
  require(!(h.flags & kRefusedAverage) || ((h.flags & kHasAverage) && !prepared), Status::CheckpointCorrupt,
          "checkpoint flags are inconsistent (a refused average that is not there, or prepared)");
  require(h.world_size >= 1, Status::CheckpointCorrupt, "checkpoint world size is 0");
  require(eager_blob == ((h.flags & kEager) != 0) && (!eager_blob || h.algorithm == uint32_t(Algorithm::Co2)) &&
              (version != kEagerFormatVersion || eager_blob),
          Status::CheckpointCorrupt, "checkpoint flags are inconsistent (eager state without the eager policy)");
  require(residual_blob == ((h.flags & kErrorFeedback) != 0) && (!residual_blob || (h.flags & kHasAnchor)) &&
              (version != kErrorFeedbackFormatVersion || residual_blob),
          Status::CheckpointCorrupt,
          "checkpoint flags are inconsistent (error-feedback state without a compressed outer all-reduce)");
  // The eager state is one rank's own: another rank, or the same rank at another W, starts its
  // next round from the anchor instead (as after finalize). A shard is always the same rank's.
  const bool same_rank = eager_rank == uint32_t(s.comm->rank()) && h.world_size == uint32_t(s.comm->size());
  const bool restore_eager = eager_blob && same_rank;
  // The residual is one rank's drop from the sum: elsewhere it is lost (a one-round rounding
  // error in the anchor, as without error feedback), and an engine without error feedback has
  // no use for it.
  const bool restore_residual = residual_blob && same_rank && s.error_feedback();
  if (residual_blob && !restore_residual)
    log::info("checkpoint: the error-feedback residual of rank " + std::to_string(eager_rank) + " of " +
              std::to_string(h.world_size) + " is not restored on rank " + std::to_string(s.comm->rank()) +
              " of " + std::to_string(s.comm->size()) +
              (s.error_feedback() ? "" : " (this engine has no error feedback)"));
  if (eager_blob && !restore_eager)
    log::info("checkpoint: the eager offsets of rank " + std::to_string(eager_rank) + " of " +
              std::to_string(h.world_size) + " are not restored on rank " + std::to_string(s.comm->rank()) +
              " of " + std::to_string(s.comm->size()) + "; this rank's next round starts from the anchor");

  // Read everything into fresh buffers; the caller commits them only after the CRC matched. A
  // sharded engine keeps only its shard of the anchor, momentum and average (of a portable blob
  // too: the rest is read for the CRC and dropped); the eager state of flat sharding and the
  // residual are this rank's whole.
  const size_t full = s.state_count;
  const size_t part = sharded_engine ? view.count : full;
  const size_t base = sharded_engine ? view.begin : 0;
  const bool eager_whole = !sharded_engine || !view.hierarchical;
  const size_t eager_base = eager_whole ? 0 : base;
  l.shard = sharded_engine;
  l.eager_offsets = !shard_blob;
  l.anchor = FloatBuffer((h.flags & kHasAnchor) ? part : 0);
  l.momentum = FloatBuffer((h.flags & kHasMomentum) ? part : 0);
  l.average = FloatBuffer(sharded_engine ? ((h.flags & kHasAverage) ? part : 0) : full);
  l.eager_offset = FloatBuffer(eager_blob ? (eager_whole ? full : part) : 0);
  l.eager_momentum = FloatBuffer(eager_blob && (h.flags & kHasMomentum) ? l.eager_offset.size() : 0);
  l.residual = FloatBuffer(s.error_feedback() ? full : 0);
  std::vector<float> skipped;  // another rank's eager state: read for the CRC, then dropped
  std::vector<GapHistory>& history = l.history;
  history.resize(s.segments.size());
  for (size_t i = 0; i < s.segments.size(); ++i) {
    const Segment& seg = s.segments[i];
    if (seg.role == Role::Excluded) continue;
    const auto name_length = in.value<uint32_t>();
    // The header (CRC-checked) already matched this layout: a differing segment is corruption.
    require(name_length == seg.name.size(), Status::CheckpointCorrupt,
            "checkpoint segment " + std::to_string(i) + " does not match '" + seg.name + "'");
    std::string name(name_length, '\0');
    in.bytes(name.data(), name_length);
    const auto role = in.value<uint32_t>();
    const auto count = in.value<uint64_t>();
    require(name == seg.name && role == uint32_t(seg.role) && count == seg.count, Status::CheckpointCorrupt,
            "checkpoint segment '" + name + "' does not match the registered '" + seg.name + "'");
    history[i].last_step_norm = in.value<double>();
    history[i].gap_sum = in.value<double>();
    history[i].updates = in.value<uint64_t>();
    // Reads this segment's slot, which the blob holds `stored_whole` or as the blob's shard:
    // the elements the engine keeps (all, or `keep_whole` false, those of its shard) into
    // `target` (whose first element is state element `first`); the others, and all of them when
    // restore is false, only for the CRC.
    const bool whole = !sharded_engine;
    const auto slot = [&](FloatBuffer& target, bool keep_whole, size_t first, bool restore, bool stored_whole) {
      const Extent stored = extent_of(seg, stored_whole, shard_begin, shard_count);
      Extent kept = restore ? extent_of(seg, keep_whole, base, part) : Extent{stored.end, stored.end};
      if (kept.size() == 0) kept = Extent{stored.end, stored.end};
      const auto skip = [&](size_t length) {
        skipped.resize(std::min(length, size_t(1) << 16));
        for (size_t done = 0; done < length; done += skipped.size())
          in.bytes(skipped.data(), std::min(skipped.size(), length - done) * sizeof(float));
      };
      skip(kept.begin - stored.begin);
      if (kept.size()) in.bytes(target.data() + (kept.begin - first), kept.size() * sizeof(float));
      skip(stored.end - kept.end);
    };
    if (!l.anchor.empty()) slot(l.anchor, whole, base, true, !shard_blob);
    if (!l.momentum.empty()) slot(l.momentum, whole, base, true, !shard_blob);
    if (h.flags & kHasAverage) slot(l.average, whole, base, true, !shard_blob);
    if (eager_blob && seg.role == Role::Parameter) {
      const bool stored_whole = !shard_blob || !(h.flags & kHierarchical);
      slot(l.eager_offset, eager_whole, eager_base, restore_eager, stored_whole);
      if (h.flags & kHasMomentum) slot(l.eager_momentum, eager_whole, eager_base, restore_eager, stored_whole);
    }
    if (residual_blob) slot(l.residual, true, 0, restore_residual, true);
  }
  const uint32_t body_crc = in.crc();
  require(in.value<uint32_t>() == body_crc, Status::CheckpointCorrupt,
          "checkpoint CRC mismatch: the blob is corrupted");
  char trailer[8];
  in.bytes(trailer, sizeof trailer);
  require(std::memcmp(trailer, kTrailer, sizeof trailer) == 0, Status::CheckpointCorrupt,
          "checkpoint trailer missing: the blob is truncated or corrupted");
  // Whether this rank's part of the average may be applied (a sharded engine's ranks combine
  // theirs); a refused one is never applied, B holds the anchor instead.
  l.average_finite = !(h.flags & kRefusedAverage) && all_finite(l.average.data(), l.average.size());
  if (h.flags & kRefusedAverage) l.average = FloatBuffer();

  // No writer saves a non-finite anchor, momentum, eager state or gap history (a refused update
  // leaves them as they were), and loaded they would make every later boundary refuse its
  // update: in a CRC-valid blob they are corruption. (The average in flight and the residual may
  // legitimately hold NaN: the next boundary refuses such an average, the residual skips it.)
  require_finite_in_blob(s, l.anchor, base, "anchor");
  require_finite_in_blob(s, l.momentum, base, "outer momentum");
  require_finite_in_blob(s, l.eager_offset, eager_base, eager_whole && shard_blob ? "eager round start" : "eager offset");
  require_finite_in_blob(s, l.eager_momentum, eager_base, "eager momentum");
  for (size_t i = 0; i < s.segments.size(); ++i)
    require(std::isfinite(history[i].last_step_norm) && std::isfinite(history[i].gap_sum) &&
                history[i].last_step_norm >= 0.0 && history[i].gap_sum >= 0.0,
            Status::CheckpointCorrupt,
            "checkpoint holds a non-finite or negative gap history for segment '" + s.segments[i].name +
                "', which no co2 writer saves: the blob is corrupted or was not written by co2");

  // A co2 average that was not prepared comes from a 1.0 blob (1.1 saves it prepared, unless it
  // was refused as non-finite): its BUFFER part is a delta from the anchor, where 1.1 sends
  // values (OuterCoefficients::anchor_weight). As values it applies what 1.0 would have. (A
  // shard's raw average was converted when its engine loaded it.)
  const bool value_average = (h.flags & kValueAverage) != 0;
  require(!value_average || (version >= kValueAverageFormatVersion && (h.flags & kHasAverage) && !prepared),
          Status::CheckpointCorrupt, "checkpoint flags are inconsistent (a value average without its average)");
  if ((h.flags & kHasAverage) && !prepared && !value_average && !shard_blob && config.algorithm == Algorithm::Co2 &&
      !l.anchor.empty())
    for (const Segment& seg : s.segments)
      if (seg.role == Role::Buffer) {
        const Extent e = extent_of(seg, !sharded_engine, base, part);
        for (size_t i = e.begin; i < e.end; ++i) l.average.data()[i - base] -= l.anchor.data()[i - base];
      }
  return l;
}

void commit_blob(Engine::State& s, Loaded&& l) {
  const Header& h = l.h;
  const EngineConfig& config = l.config;
  const bool prepared = l.prepared;
  // An all-reduce still in flight writes into the old comm buffer: finish it first.
  if (s.pending) s.pending->wait_status();
  s.pending.reset();
  s.config = config;
  s.eager_resolved = config.eager == Eager::On;
  s.beta_auto = (h.flags & kBetaAuto) != 0;
  s.beta = s.beta_auto ? default_outer_momentum(s.outer_participants()) : h.beta;
  s.average_ready = (h.flags & kHasAverage) != 0;
  s.residual = std::move(l.residual);
  if (l.shard) {
    s.ready_average_finite = l.average_finite;  // the ranks' verdict (Engine::load)
    if (!l.average_finite) l.average = FloatBuffer();  // B keeps the anchor
  } else {
    s.anchor = std::move(l.anchor);
    s.momentum = std::move(l.momentum);
    if (s.has_anchor() && s.momentum_needed() && s.momentum.empty() && !s.on_device())
      s.momentum = FloatBuffer(s.state_count);
    s.comm_buffer = std::move(l.average);
    s.eager_offset = std::move(l.eager_offset);
    s.eager_momentum = std::move(l.eager_momentum);
    if (s.eager() && s.momentum_needed() && s.eager_momentum.empty()) s.eager_momentum = FloatBuffer(s.state_count);
    s.ready_average_finite = s.average_ready ? all_finite(s.comm_buffer.data(), s.state_count) : true;
  }
  s.prepared.ready = prepared;
  s.prepared.summary_known = !prepared;
  s.prepared.settings = outer_settings_of(s);
  if (prepared) s.prepared.history = l.history;
  s.history = std::move(l.history);
  s.round_tau = h.round_tau;
  s.steps_in_round = h.steps_in_round;
  s.stats.steps = h.steps;
  s.stats.rounds = h.rounds;
  s.stats.outer_updates = h.outer_updates;
  s.stats.nonfinite_rounds = h.nonfinite_rounds;
  s.stats.resolved_outer_momentum = s.beta;
  // The saved average's step, as the saving run had it; without one (a blob of an engine that
  // applied at the boundary) the step this engine would give an average submitted now.
  begin_arrival_round(s);
  if (l.has_apply_at) s.arrival.apply_at = l.apply_at;
  if (l.shard)
    s.backend->load_shard(Backend::LoadedShard{std::move(l.anchor), std::move(l.momentum), std::move(l.average),
                                               std::move(l.eager_offset), std::move(l.eager_momentum),
                                               l.eager_offsets});
  else
    s.backend->stage_in();
}

}  // namespace

void Engine::load(const ReadFn& read) {
  State& s = *state_;
  require(s.committed, Status::InvalidState, "commit the layout before loading a checkpoint");
  s.advisor.pause();
  s.backend->wait_for_caller("load");
  if (!s.sharded()) return commit_blob(s, read_blob(s, read));
  // A sharded engine's load is collective (its ranks gather the state from each other's
  // shards), and every rank's blob must be good before any rank takes its own: one verdict.
  Status mine = Status::Ok;
  std::string why;
  Loaded loaded;
  try {
    loaded = read_blob(s, read);
  } catch (const Error& e) {
    mine = e.status();
    why = e.what();
  } catch (const std::bad_alloc&) {
    mine = Status::OutOfMemory;
    why = "out of memory reading this rank's checkpoint; the engine is unchanged";
  }
  // Each rank read its shard of the average: applied only if every part is finite.
  const std::vector<int64_t> verdicts = gathered_from_every_rank(
      s, *s.comm, s.id(Purpose::Consensus), {int64_t(mine), int64_t(mine == Status::Ok && loaded.average_finite)});
  if (mine != Status::Ok) fail(mine, why);
  for (size_t rank = 0; rank < verdicts.size() / 2; ++rank) {
    const int64_t status = verdicts[2 * rank];
    if (status != int64_t(Status::Ok))
      fail(Status(status),
           "rank " + std::to_string(rank) + " could not load its checkpoint (status " + std::to_string(status) +
               "; that rank's message says why), so no rank of this sharded engine loaded: the engine is "
               "unchanged; give every rank a good blob and load again");
    loaded.average_finite = loaded.average_finite && verdicts[2 * rank + 1] != 0;
  }
  commit_blob(s, std::move(loaded));
}

}  // namespace co2

// What the engine's round logic (runtime/engine/engine.cpp) asks of the memory its state lives in. The
// rounds, the policies, the schedule, the invariant checks (when the anchor is checked), the
// error handling and the bookkeeping of an applied update (gap history, statistics) are written
// once, in engine.cpp; the math of the update once, in runtime/outer/; a backend places the
// state and moves it, running the core's passes over its buffers: the host backend
// (runtime/backends/host_backend.cpp) over host memory with the communicator's ring, the device backend
// (runtime/backends/device/device_backend.cpp) with fused kernels ordered against the caller's CUDA
// stream. docs/architecture.md, "Engine and backends".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/buffer.hpp"
#include "runtime/base/status.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/outer/layout.hpp"
#include "runtime/outer/update_summary.hpp"

namespace co2 {

// The co2 average of the previous round, once the host waited for it.
struct Arrival {
  bool have = false;   // an average was in flight (or restored): it is the one to apply
  bool finite = true;  // ... and every element of it (and of its update, where checked) is finite
};

// Whether a pass found every delta a - p finite. A device backend learns it only later, from
// the boundary's report; it then counts nonfinite_local itself.
enum class DeltasFinite { Yes, No, Later };

// What the engine decided for one co2 boundary's pass.
struct BoundaryPass {
  bool update = false;  // the arrived average is applied: it becomes the anchor
  bool eager = false;   // the eager policy's pass (docs/algorithm.md, "The eager policy")
  // The engine calls anchor_checksum() right after this pass: a backend whose pass overwrites the
  // anchor in effect hashes it on the way (the engine alone decides when the check is due).
  bool anchor_check_due = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // --- layout ---
  // Throws InvalidArgument unless [data, +bytes) is memory this backend can train.
  virtual void check_memory(const void* data, size_t bytes, const std::string& what) = 0;
  // Runtime-owned flat storage of `count` elements of `dtype`, zeroed, owned by the backend.
  virtual void* allocate_flat(size_t count, ParamDType dtype) = 0;
  // The outer state for the committed layout, and rank 0's values on every rank (blocking).
  virtual void commit() = 0;
  // beta became > 0 (or Nesterov) after commit: momentum starts from zero.
  virtual void momentum_needed() = 0;
  // --- elastic membership (runtime/engine/membership_change.cpp) ---
  // The communicator was re-formed (after stage_out and drain): what belonged to the old group
  // (its reports, collectives) is dropped, the caller's memory (the flat storage) is kept, and a
  // sharded backend keeps its shards for assemble_outer_state. commit() follows at the new size,
  // then stage_in of the agreed outer state.
  virtual void begin_new_group() = 0;
  // A backend whose outer state is cut across the ranks: the whole outer state of the group
  // before the change into BackendState's host buffers (anchor, momentum) on every rank of
  // s.comm, each shard from its holder: holders[j] is the rank in s.comm of the group-before's
  // rank j, or -1 when it was lost (then its shard of the anchor becomes the average of every
  // rank's parameters there, and its momentum zero). Rank 0 of s.comm, which held a shard,
  // decides the holders; a joiner passes none. Collective over s.comm. Before begin_new_group
  // it reads the current shards, after it the ones kept. The replicated backends hold it whole.
  virtual void assemble_outer_state(const std::vector<int>& /*holders*/) {}

  // --- co2: the one-round-stale update, in the order engine.cpp calls them ---
  // Waits for the average in flight. A failed collective throws here, before anything of its
  // average is applied; finite says whether the update may be applied.
  virtual Arrival collect_average() = 0;
  // The boundary pass: with pass.update the arrived average becomes the anchor; this round's
  // deltas a - p go to the comm buffer (under the eager policy, with its correction).
  virtual DeltasFinite boundary_pass(const BoundaryPass& pass) = 0;
  // The all-reduce of this round's deltas, asynchronous: its average is collected next boundary.
  virtual void submit_average() = 0;
  // finalize / synchronize: the arrived average becomes the anchor and the parameters take it.
  virtual void apply_update() = 0;
  // The eager offsets are part of the average being applied: the next round starts at the anchor.
  virtual void clear_eager_state() = 0;
  // co2 with apply_step (docs/algorithm.md, "Applying the average on arrival"), between
  // boundaries: the collected average's update becomes the anchor, and each parameter keeps this
  // round's progress on top of it, p <- R(next - (R(a + e) - p)), with the eager offset e <- 0.
  virtual void apply_on_arrival() = 0;

  // --- diloco (and co2's warm-up): blocking ---
  // c <- the deltas; c <- their average; the update prepared. False when the average or its
  // update is not finite (nothing may be applied).
  virtual bool average_deltas_blocking() = 0;
  // The prepared diloco update becomes the anchor and the parameters.
  virtual void apply_blocking_update() = 0;

  // --- parameter averaging (localsgd; sync's BUFFER segments) ---
  // Blocking; false (nothing changed) when the average is not finite.
  virtual bool average_parameters(bool buffers_only) = 0;
  // sync and reduce_gradients: grads[i] (nullptr: zero) averaged in place; false (unchanged)
  // when the average is not finite.
  virtual bool average_gradients(void* const* grads, size_t num_grads) = 0;

  // An update applied by boundary_pass, apply_update or apply_blocking_update: its gap history
  // and statistics are in BackendState::prepared, and the engine adopts them right after the
  // call. A backend that learns them only later (the device, from its boundary reports) says
  // so here and hands them over in finished() (the gap history stays on the device).
  virtual bool reports_updates_later() const { return false; }

  virtual void set_parameters_to_anchor() = 0;
  // Hash of the anchor in effect (without an anchor, the parameters) on this rank.
  virtual uint64_t anchor_checksum() = 0;
  // Hash of the parameters as fp32 words (trained_only: of PARAMETER segments), where they are:
  // the node check of hierarchical co2 compares it among a node's ranks.
  virtual uint64_t parameters_checksum(bool trained_only) = 0;
  // out (host or device memory of count elements) <- the anchor, or the parameters when
  // `parameters` is set, then averaged across ranks when `average` is set (blocking).
  virtual void consensus_into(float* out, size_t count, bool parameters, bool average) = 0;

  // --- ordering against the caller ---
  // The stream of the caller's current call (step, reduce_gradients); nullptr elsewhere.
  virtual void set_caller_stream(void* stream) = 0;
  // Calls without a stream argument (commit, synchronize, finalize, consensus, save) first wait,
  // bounded, for the caller's work that came before them.
  virtual void wait_for_caller(const char* what) = 0;
  // What a backend that reports later (the device) finished since the last call (wait: all it
  // has in flight), oldest first: its boundaries' reports, and the outer collectives nobody
  // waited for (their requests). The engine counts and observes them.
  struct FinishedBoundary {
    bool deltas_nonfinite = false;  // this rank's a - p was not finite
    bool applied = false;           // the update happened: `summary` is its figures
    UpdateSummary summary = empty_summary();
  };
  struct Finished {
    std::vector<FinishedBoundary> boundaries;
    std::vector<std::shared_ptr<Request>> collectives;  // completed without a wait of the host
  };
  virtual Finished finished(bool wait) = 0;
  // Waits (bounded) for everything in flight; before the state is freed.
  virtual void drain() noexcept = 0;

  // --- checkpoints (runtime/engine/checkpoint.cpp reads and writes the host buffers of the state) ---
  virtual bool has_momentum() const = 0;  // the momentum buffer exists (what a checkpoint stores)
  // The outer state into the host buffers of BackendState (anchor, momentum, comm_buffer when
  // an average is ready, history); the host backend keeps them there and does nothing.
  virtual void stage_out() = 0;
  // The host buffers, just loaded, become the backend's state; the device backend then frees
  // its host copies.
  virtual void stage_in() = 0;
  // After a save: host copies of device state are dropped.
  virtual void release_staged() = 0;
  // What a save writes of one segment's `part`, count floats, or nullptr for the host buffer of
  // BackendState that stage_out filled. The sharded backend assembles it here from the ranks'
  // shards one segment at a time, so that a save never holds a full-size copy (collective:
  // every rank asks for the same parts in the same order).
  enum class SavedPart { Anchor, Momentum, EagerOffset, EagerMomentum };
  virtual const float* saved_part(SavedPart, size_t /*segment*/) { return nullptr; }

  // A sharded backend's per-rank checkpoint (format 6, runtime/engine/checkpoint.cpp): this rank's
  // shard [begin, begin + count) of the state over `shards` ranks (all, or the node's), read in
  // place by the save. eager_whole: the eager slots are this rank's whole round start a + e and
  // the momentum of its own deltas (flat sharding), not shards of the node's (hierarchical).
  struct ShardView {
    uint32_t shards = 0, shard_rank = 0;
    size_t begin = 0, count = 0;
    bool hierarchical = false, eager_whole = false;
    const float* anchor = nullptr;          // shard
    const float* momentum = nullptr;        // shard, or null without a momentum
    const float* buffer = nullptr;          // B, full-size: the average or the next anchor at begin
    const float* eager_offset = nullptr;    // shard, or whole round start (eager_whole)
    const float* eager_momentum = nullptr;  // as eager_offset, or null
  };
  // False for a backend whose state is not sharded.
  virtual bool shard_view(ShardView*) const { return false; }
  // A checkpoint, read and checked on every rank (its shards of a per-rank or a portable blob),
  // becomes this rank's state; the parameters take the round start a + e (collective over the
  // shards' ranks). Buffers of the ShardView's extents; average: the shard of what B holds next
  // (empty: the anchor); eager_offsets: the eager slot holds e (a portable blob's), not flat
  // sharding's whole round start.
  struct LoadedShard {
    FloatBuffer anchor, momentum, average, eager_offset, eager_momentum;
    bool eager_offsets = false;
  };
  virtual void load_shard(LoadedShard&&) {}
};

// Whether this build has the device backend at all.
bool device_backend_built();

// What a build without the device backend says for CUDA memory: the cause and both ways out.
inline constexpr const char* kBuiltWithoutCuda =
    "CUDA tensors need a libco2 built with CUDA, and this one was built without it: keep the parameters in host "
    "memory (model.cpu() in torch), or build co2 again where nvcc and the CUDA runtime are found "
    "(/usr/local/cuda; meson setup -Dcuda=enabled)";

}  // namespace co2

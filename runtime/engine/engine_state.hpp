// The engine's private state, shared by engine.cpp (rounds, updates) and checkpoint.cpp.
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/buffer.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/backends/backend.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/backends/device/allocator.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/metrics.hpp"
#include "runtime/engine/observe.hpp"
#include "runtime/outer/update_plan.hpp"
#include "runtime/outer/param_types.hpp"
#include "runtime/engine/tau_advisor.hpp"
#include "runtime/base/trace.hpp"

namespace co2 {

// co2 on the host: the outer update of the average in flight, prepared on the progress thread
// as soon as the average arrives, so that the boundary only swaps it in (docs/algorithm.md,
// "The split boundary pass"). Written there; read on the training thread after the wait.
struct PreparedUpdate {
  OuterSettings settings;           // taken when the deltas were submitted
  std::vector<GapHistory> history;  // the gap history as it is after this update
  UpdateSummary summary = empty_summary();
  bool summary_known = true;  // false after a checkpoint restore (the summary is not saved)
  bool ready = false;  // comm_buffer holds the next anchor; momentum is already updated
};

// Applying co2's average before the next boundary (config.apply_step; runtime/engine/arrival.*).
struct ArrivalAgreement {
  // The step of the round at which the average in flight is applied, the same on every rank;
  // 0: at the next boundary.
  uint32_t apply_at = 0;
};

struct Engine::State {
  std::shared_ptr<Communicator> comm;
  uint32_t owner = 0;  // this engine's id on comm: part of every collective's identity
  CollectiveId id(Purpose purpose) const { return {owner, purpose}; }
  // Hierarchical CO2 (config.hierarchy == Nodes), formed at commit: the ranks of this node, and
  // the ranks with this local index on every node; each with this engine's owner id there.
  std::shared_ptr<Communicator> intra, inter;
  uint32_t intra_owner = 0, inter_owner = 0;
  bool hierarchical() const { return intra != nullptr; }
  // Who an automatic beta counts: the nodes under hierarchical CO2, else the ranks.
  int outer_participants() const { return hierarchical() ? inter->size() : comm->size(); }
  // The outer state is sharded (runtime/backends/sharded_backend.cpp): over all ranks, or over a node's.
  bool sharded() const { return config.shard_outer_state || config.hierarchy == Hierarchy::Nodes; }
  // Where gradients are averaged (reduce_gradients): the node under hierarchical CO2, else all.
  Communicator& gradient_comm() const { return hierarchical() ? *intra : *comm; }
  CollectiveId gradient_id() const { return {hierarchical() ? intra_owner : owner, Purpose::GradientAverage}; }
  EngineConfig config;
  bool beta_auto = true;
  double beta = 0.0;  // resolved outer momentum

  // Layout.
  std::vector<Segment> segments;  // registration order
  std::vector<GapHistory> history;  // one per segment
  size_t num_trained = 0;           // PARAMETER segments
  size_t state_count = 0;           // PARAMETER + BUFFER elements
  size_t trained_count = 0;         // PARAMETER elements
  uint64_t layout_hash = 0;
  bool committed = false;
  // The caller's commit succeeded. `committed` is false for a moment while a re-formed group
  // commits its new layout; a failure in that moment is still one the group may survive.
  bool formed = false;
  // Set while a re-formed elastic group commits: the donor's outer state follows the commit,
  // whose broadcast of rank 0's parameters is then left out.
  bool outer_state_follows = false;
  // Set while a membership change holds this rank's outer state in the host buffers below, staged
  // out of a device backend once (a retry after a failed re-formation finds it there).
  bool outer_state_staged = false;
  // co2_engine_leave: asked (announced in every agreement until the group lets it go), done.
  bool leave_requested = false;
  bool left = false;
  FloatBuffer owned_flat;
  void* flat = nullptr;
  size_t flat_count = 0;
  ParamDType flat_dtype = ParamDType::F32;  // the segments of the flat storage take it

  // Outer state (replicated, fp32).
  FloatBuffer anchor;
  FloatBuffer momentum;  // empty while beta == 0 and not Nesterov
  FloatBuffer comm_buffer;
  FloatBuffer gradient_buffer;  // reduce_gradients outside `sync`, allocated on first use
  // The eager policy (co2 with config.eager), per rank, never averaged: the round starts from
  // anchor + eager_offset; eager_momentum is the momentum of this rank's own deltas (allocated
  // with the outer momentum). Both are zero except on PARAMETER segments.
  FloatBuffer eager_offset;
  FloatBuffer eager_momentum;
  // Error feedback of the compressed outer all-reduce, per rank, never averaged: what this
  // rank's encodings dropped from the last outer all-reduce (in units of the sum), added to the
  // next round's delta. Allocated at commit when error_feedback() holds.
  FloatBuffer residual;
  uint64_t outer_wire_bytes = 0;  // bytes this rank sends per outer all-reduce (fixed at commit)
  // The state offset of every PARAMETER and BUFFER segment (fixed at commit): where a compressed
  // wire's int8 groups start (wire_segments).
  std::vector<size_t> segment_starts;

  // Round state.
  uint32_t round_tau = 12;  // tau of the round in progress
  uint32_t steps_in_round = 0;
  std::shared_ptr<Request> pending;  // co2: the all-reduce of the previous round's deltas
  std::atomic<bool> pending_result_finite{true};  // set on the progress thread
  bool average_ready = false;  // comm_buffer holds an arrived average not yet applied
  bool ready_average_finite = true;
  PreparedUpdate prepared;  // co2 on the host: the pending average's update, once computed
  ArrivalAgreement arrival;

  EngineStats stats;
  TauAdvisor advisor;  // step and all-reduce times -> the smallest tau that hides the all-reduce
  Observer observer;   // the advice agreed across ranks, the round log line
  std::unique_ptr<Trace> trace;  // CO2_TRACE only: every hook tests this pointer first
  std::unique_ptr<Metrics> metrics;  // CO2_METRICS_PORT only: likewise

  // Where the state lives and how it is computed (runtime/backends/backend.hpp): the host backend, or
  // the device backend once a CUDA tensor is registered; the device backend keeps the outer
  // state in device memory and fills the host buffers above only for a checkpoint.
  // placement: co2_device_kind_t of the tensors, -1 before the first.
  int placement = -1;
  int device_index = 0;
  DeviceAllocator allocator;
  std::unique_ptr<Backend> backend;
  bool on_device() const { return placement == int(DeviceKind::Cuda); }

  bool has_anchor() const {
    return config.algorithm == Algorithm::Co2 || config.algorithm == Algorithm::Diloco;
  }
  bool momentum_needed() const { return beta > 0.0 || config.nesterov; }
  // co2's BUFFER segments carry values (OuterCoefficients::anchor_weight); diloco's average.
  bool buffer_values() const { return config.algorithm == Algorithm::Co2; }
  bool eager_resolved = false;  // config.eager decided at commit (Auto by placement) or load
  bool eager() const { return eager_resolved && config.algorithm == Algorithm::Co2; }
  bool error_feedback() const {
    return has_anchor() && config.wire_format != WireFormat::F32 && config.error_feedback;
  }
};

// Shared by engine.cpp, checkpoint.cpp and the backends.
OuterSettings outer_settings_of(const Engine::State& s);
// An applied update counts; its figures (when known) become the last_* statistics.
void commit_update(Engine::State& s, Clip clip, const UpdateSummary* sum);
// The first half of the split boundary pass (co2 and diloco on the host): the update of the
// average in `comm` (momentum in place, the next anchor into `comm`, and into the parameters
// when params_follow) with prepared.settings and prepared.history; sets prepared.ready. False
// when the result is not finite: nothing is prepared, the anchor and momentum are unchanged
// (the parameters may not be).
bool prepare_update(const std::vector<Segment>& segments, float* anchor, float* momentum, float* comm,
                    PreparedUpdate& prepared, bool params_follow = false);
bool same_on_every_rank(Engine::State& s, uint64_t value, Purpose purpose);
// The same over another of the engine's communicators (a node's: hierarchical CO2).
bool same_on_every_rank_of(Engine::State& s, Communicator& comm, CollectiveId id, uint64_t value);
// Collective over `comm`: every rank's `mine` (the same length on every rank), in rank order.
std::vector<int64_t> gathered_from_every_rank(Engine::State& s, Communicator& comm, CollectiveId id,
                                              const std::vector<int64_t>& mine);
void check_anchor(Engine::State& s);  // collective; throws AnchorMismatch
void check_anchor_when_due(Engine::State& s);  // check_anchor every anchor_check_interval rounds
void collect_pending_average(Engine::State& s);  // waits; the average stays ready to apply
// The update a backend just applied: its gap history and statistics become the engine's.
void adopt_applied_update(Engine::State& s);
// What a backend that reports later (the device) finished since (wait: all of it), its boundaries
// and its collectives, becomes the statistics.
void count_finished_work(Engine::State& s, bool wait);
// f(p) with p the segment's parameters as a typed pointer (float*, Bf16* or Fp16*): the host
// passes are templates over the parameter type (runtime/outer/param_types.hpp).
template <typename F>
decltype(auto) with_params(const Segment& seg, F&& f) {
  switch (seg.dtype) {
    case ParamDType::BF16:
      return f(static_cast<Bf16*>(seg.data));
    case ParamDType::F16:
      return f(static_cast<Fp16*>(seg.data));
    case ParamDType::F32:
    default:
      return f(static_cast<float*>(seg.data));
  }
}
// --- shared by the host backends (host_backend.cpp, sharded_backend.cpp) ---
// The backends (runtime/backends/backend.hpp) over this state: host tensors replicated
// (runtime/backends/host_backend.cpp) or sharded (config.shard_outer_state, hierarchy;
// runtime/backends/sharded_backend.cpp); tensors on CUDA device `device_index` (throws Unsupported
// without CUDA or without a usable device).
std::unique_ptr<Backend> make_host_backend(Engine::State& s);
std::unique_ptr<Backend> make_sharded_backend(Engine::State& s);
std::unique_ptr<Backend> make_device_backend(Engine::State& s, int device_index);

// Packs the PARAMETER and BUFFER parameters into `out` (state order), widened to fp32 (exact);
// unpack rounds to the parameters' dtype (nearest even).
void pack_parameters(const Engine::State& s, float* out);
void unpack_parameters(Engine::State& s, const float* in, bool buffers_only);
// The anchor checksum's hash of the parameters (as fp32 words); trained_only: PARAMETER
// segments only.
uint64_t parameters_checksum(const Engine::State& s, bool trained_only = false);
// The outer average's wire (co2, diloco) for the state elements [begin, begin + count) (all of
// them by default) of `state` (a full-size buffer): compressed as configured, int8 groups cut at
// every segment; with error feedback the accumulated elements (fed_back) first take what the
// previous outer all-reduce's encodings dropped, and the residual buffer then receives this
// one's drops. The collective reduces state + begin.
WireCompression outer_wire(Engine::State& s, float* state, size_t begin = 0, size_t count = SIZE_MAX);
// The segments of the state for a collective over the state elements from `origin` on.
SegmentStarts wire_segments(const Engine::State& s, size_t origin = 0);

// Engine::commit's work: the layout agreed and hashed, the backend's state allocated from rank
// 0's parameters. Collective.
void commit_layout(Engine::State& s);
// Elastic membership (runtime/engine/membership_change.cpp). continue_with_survivors: re-forms
// s.comm over the ranks still alive after `cause` failed it, and gives every survivor the outer
// state of the one that applied the most updates, the round in flight dropped; throws when this
// rank cannot go on. admit_joiners: at a boundary where every member knows of join requests
// not admitted yet, synchronizes, grows s.comm by the joiners and gives them the group's state.
// join_running_group: a joiner's commit, the other side of admit_joiners. release_leaver: at
// the boundary where every member knows that a rank asked to leave (co2_engine_leave),
// synchronizes and lets it go: throws Error(Left) on it, Error(MembershipChanged) on the others.
void continue_with_survivors(Engine::State& s, const std::string& cause);
bool joiners_agreed(const Engine::State& s);
int admit_joiners(Engine::State& s);  // returns how many joined
bool leave_agreed(const Engine::State& s);
[[noreturn]] void release_leaver(Engine::State& s);
void join_running_group(Engine::State& s);
// Engine::synchronize's work (finalizing: finalize's): collective.
void synchronize_ranks(Engine::State& s, bool finalizing);

// Waits for the outer collective in flight (s.pending, then empty), as wait_charged does.
void wait_pending(Engine::State& s);
// Waits for `request`, charging the time to boundary_wait_ns; throws the collective's error.
void wait_charged(Engine::State& s, const std::shared_ptr<Request>& request);

}  // namespace co2

// What a backend (runtime/backends/backend.hpp) reads and writes of the engine's state: the layout,
// the communicators, the outer state's host buffers and the collective in flight. The engine's
// state (runtime/engine/engine_state.hpp) extends it with what only the round logic touches (round
// counters, statistics, the advisor, observers, the backend itself), so that no backend includes
// a file of the engine's layer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/base/buffer.hpp"
#include "runtime/base/trace.hpp"
#include "runtime/backends/device/allocator.hpp"
#include "runtime/comm/comm.hpp"
#include "runtime/outer/boundary_pass.hpp"
#include "runtime/outer/engine_config.hpp"
#include "runtime/outer/options.hpp"
#include "runtime/outer/param_types.hpp"
#include "runtime/outer/update_plan.hpp"
#include "runtime/outer/update_summary.hpp"

namespace co2 {

class Backend;

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

// What the engine's statistics report of a backend: the bytes it moves and the memory it holds.
struct BackendCounters {
  uint64_t bytes_reduced = 0;
  uint64_t wire_bytes_last_round = 0;  // the compressed outer all-reduce's, this rank's
  uint64_t wire_bytes_total = 0;
  // Bytes of outer state (anchor, momentum, comm buffer, shards, eager state, residual) held.
  uint64_t outer_state_bytes = 0;
};

struct BackendState {
  BackendState() = default;
  BackendState(const BackendState&) = delete;
  BackendState& operator=(const BackendState&) = delete;
  virtual ~BackendState() = default;

  // Waits for `request`; the engine charges the wait to its statistics and observes the
  // collective, or, when it failed, fails the engine's communicators and throws its error.
  virtual void wait_collective(const std::shared_ptr<Request>& request) = 0;

  std::shared_ptr<Communicator> comm;
  uint32_t owner = 0;  // the engine's id on comm: part of every collective's identity
  CollectiveId id(Purpose purpose) const { return {owner, purpose}; }
  // Hierarchical CO2 (config.hierarchy == Nodes), formed at commit: the ranks of this node, and
  // the ranks with this local index on every node; each with the engine's owner id there.
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
  double beta = 0.0;  // resolved outer momentum

  // Layout.
  std::vector<Segment> segments;  // registration order
  std::vector<GapHistory> history;  // one per segment
  size_t state_count = 0;           // PARAMETER + BUFFER elements
  size_t trained_count = 0;         // PARAMETER elements
  bool committed = false;
  // Set while a re-formed elastic group commits: the donor's outer state follows the commit,
  // whose broadcast of rank 0's parameters is then left out.
  bool outer_state_follows = false;
  // Set while a membership change holds this rank's outer state in the host buffers below, staged
  // out of a device backend once (a retry after a failed re-formation finds it there).
  bool outer_state_staged = false;

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

  // The outer collective in flight.
  std::shared_ptr<Request> pending;  // co2: the all-reduce of the previous round's deltas
  std::atomic<bool> pending_result_finite{true};  // set on the progress thread
  bool average_ready = false;  // comm_buffer holds an arrived average not yet applied
  bool ready_average_finite = true;
  PreparedUpdate prepared;  // co2 on the host: the pending average's update, once computed

  BackendCounters counters;
  std::unique_ptr<Trace> trace;  // CO2_TRACE only: every hook tests this pointer first
  DeviceAllocator allocator;     // the caller's, for device memory

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

// Waits for the outer collective in flight (s.pending, then empty), as wait_collective does.
void wait_pending(BackendState& s);
OuterSettings outer_settings_of(const BackendState& s);

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
// Packs the PARAMETER and BUFFER parameters into `out` (state order), widened to fp32 (exact);
// unpack rounds to the parameters' dtype (nearest even).
void pack_parameters(const BackendState& s, float* out);
void unpack_parameters(BackendState& s, const float* in, bool buffers_only);
// The anchor checksum's hash of the parameters (as fp32 words); trained_only: PARAMETER
// segments only.
uint64_t parameters_checksum(const BackendState& s, bool trained_only = false);
// The outer average's wire (co2, diloco) for the state elements [begin, begin + count) (all of
// them by default) of `state` (a full-size buffer): compressed as configured, int8 groups cut at
// every segment; with error feedback the accumulated elements (fed_back) first take what the
// previous outer all-reduce's encodings dropped, and the residual buffer then receives this
// one's drops. The collective reduces state + begin.
WireCompression outer_wire(BackendState& s, float* state, size_t begin = 0, size_t count = SIZE_MAX);
// The segments of the state for a collective over the state elements from `origin` on.
SegmentStarts wire_segments(const BackendState& s, size_t origin = 0);

// The backends over this state: host tensors replicated (runtime/backends/host_backend.cpp) or
// sharded (config.shard_outer_state, hierarchy; runtime/backends/sharded_backend.cpp); tensors on
// CUDA device `device_index` (throws Unsupported without CUDA or without a usable device).
std::unique_ptr<Backend> make_host_backend(BackendState& s);
std::unique_ptr<Backend> make_sharded_backend(BackendState& s);
std::unique_ptr<Backend> make_device_backend(BackendState& s, int device_index);

}  // namespace co2

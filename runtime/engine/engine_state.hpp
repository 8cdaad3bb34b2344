// The engine's private state, shared by engine.cpp (rounds, updates) and checkpoint.cpp.
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/buffer.hpp"
#include "runtime/backends/backend.hpp"
#include "runtime/backends/backend_state.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/metrics.hpp"
#include "runtime/engine/observe.hpp"
#include "runtime/engine/tau_advisor.hpp"

namespace co2 {

// Applying co2's average before the next boundary (config.apply_step; runtime/engine/arrival.*).
struct ArrivalAgreement {
  // The step of the round at which the average in flight is applied, the same on every rank;
  // 0: at the next boundary.
  uint32_t apply_at = 0;
};

// The engine's state: what its backend reads and writes (runtime/backends/backend_state.hpp), and
// what only the round logic, the checkpoints and the membership changes touch.
struct Engine::State final : BackendState {
  // Charges the wait to boundary_wait_ns and observes the collective; throws its error.
  void wait_collective(const std::shared_ptr<Request>& request) override;

  bool beta_auto = true;
  size_t num_trained = 0;  // PARAMETER segments
  uint64_t layout_hash = 0;
  // The caller's commit succeeded. `committed` is false for a moment while a re-formed group
  // commits its new layout; a failure in that moment is still one the group may survive.
  bool formed = false;
  // co2_engine_leave: asked (announced in every agreement until the group lets it go), done.
  bool leave_requested = false;
  bool left = false;
  void* flat = nullptr;
  size_t flat_count = 0;
  ParamDType flat_dtype = ParamDType::F32;  // the segments of the flat storage take it

  // Round state.
  uint32_t round_tau = 12;  // tau of the round in progress
  uint32_t steps_in_round = 0;
  ArrivalAgreement arrival;

  EngineStats stats;  // without the backend's traffic (stats() adds it)
  TauAdvisor advisor;  // step and all-reduce times -> the smallest tau that hides the all-reduce
  Observer observer;   // the advice agreed across ranks, the round log line
  std::unique_ptr<Metrics> metrics;  // CO2_METRICS_PORT only: every hook tests this pointer first

  // Where the state lives and how it is computed (runtime/backends/backend.hpp): the host backend, or
  // the device backend once a CUDA tensor is registered; the device backend keeps the outer
  // state in device memory and fills the host buffers only for a checkpoint.
  // placement: co2_device_kind_t of the tensors, -1 before the first.
  int placement = -1;
  int device_index = 0;
  std::unique_ptr<Backend> backend;
  bool on_device() const { return placement == int(DeviceKind::Cuda); }
};

// An applied update counts; its figures (when known) become the last_* statistics.
void commit_update(Engine::State& s, Clip clip, const UpdateSummary* sum);
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

}  // namespace co2

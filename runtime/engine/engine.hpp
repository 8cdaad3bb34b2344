// The engine: rounds of tau local steps and the outer update of CO2 and its baselines, with
// replicated fp32 outer state (anchor, momentum, comm buffer). Driven from one thread.
// The math is DESIGN.md section 1; docs/algorithm.md records every choice made here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/backends/device/allocator.hpp"
#include "runtime/outer/layout.hpp"
#include "runtime/outer/engine_config.hpp"
#include "runtime/base/status.hpp"

namespace co2 {

class Backend;  // runtime/backends/backend.hpp

enum class Param : int {
  OuterLr = 0,
  OuterMomentum = 1,
  Tau = 2,
  ClipThreshold = 3,
  PenaltyConstant = 4,
  InnerLr = 5,
  AnchorCheckInterval = 6,
};
enum class ConsensusKind : int { Anchor = 0, LocalAverage = 1 };

// Throws InvalidArgument / UnknownEnum with a message naming the bad field.
void validate(const EngineConfig& config);

// beta by outer participants W (released code and SlowMo): <=16 -> 0, <=32 -> 0.2,
// <=64 -> 0.5, >64 -> 0.6.
double default_outer_momentum(int outer_participants);

struct EngineStats {
  int world_size = 0;
  uint64_t steps = 0;
  uint64_t rounds = 0;
  uint64_t outer_updates = 0;
  uint64_t bytes_reduced = 0;
  uint64_t collective_ns = 0;
  uint64_t boundary_wait_ns = 0;
  uint64_t last_boundary_wait_ns = 0;
  uint64_t nonfinite_rounds = 0;
  uint64_t nonfinite_local = 0;
  uint64_t anchor_checks = 0;
  double resolved_outer_momentum = 0.0;
  double last_penalty_min = 1.0;
  double last_penalty_max = 1.0;
  double last_clip_scale_min = 1.0;
  double last_clip_fraction = 0.0;
  // The tau advisor (runtime/engine/tau_advisor.hpp).
  uint64_t step_time_ns = 0;
  uint64_t allreduce_time_ns = 0;
  uint32_t advised_tau = 0;
  // Observability (runtime/engine/observe.hpp, docs/observability.md).
  uint64_t last_collective_ns = 0;
  uint64_t last_round_ns = 0;
  double hidden_fraction = 0.0;
  double last_hidden_fraction = 0.0;
  uint64_t rank_step_time_ns = 0;
  uint64_t rank_allreduce_time_ns = 0;
  // Compressed outer all-reduce: bytes this rank sent for the outer all-reduce.
  uint64_t wire_bytes_last_round = 0;
  uint64_t wire_bytes_total = 0;
  // Memory: bytes of outer state (anchor, momentum, comm buffer, shards, eager state, residual)
  // this rank's engine holds.
  uint64_t outer_state_bytes = 0;
  uint64_t arrival_updates = 0;  // co2 averages applied between boundaries
  uint32_t last_apply_step = 0;  // step of its round the last one was applied at; 0: a boundary
};

using WriteFn = std::function<bool(const void* data, size_t length)>;
using ReadFn = std::function<bool(void* data, size_t length)>;

class Engine {
 public:
  Engine(std::shared_ptr<Communicator> comm, const EngineConfig& config);
  ~Engine();  // waits (bounded by the communicator's timeout) for an in-flight collective
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // --- layout (before commit) ---
  void register_tensor(const TensorDesc& tensor);
  void* alloc_flat(size_t count, const StorageDesc& storage);  // zero-initialised, engine-owned
  void adopt_flat(void* data, size_t count, const StorageDesc& storage);
  void add_segment(const SegmentDesc& segment);
  // Device memory through the caller's allocator (empty callbacks: cudaMalloc). Before any device
  // allocation (flat storage, commit).
  void set_device_allocator(const DeviceAllocator& allocator);
  void commit();  // collective

  // --- training ---
  // Returns true when this call was a boundary. Throws Error(NonFinite) when the boundary
  // applied nothing because the arriving average was not finite.
  bool step(void* stream);
  void reduce_gradients(void* const* grads, size_t num_grads, void* stream);
  void synchronize();
  void finalize();
  // Elastic groups: asks to leave at a boundary the ranks agree on (runtime/engine/membership_change.cpp);
  // the step there throws Error(Left) on this rank, Error(MembershipChanged) on the others.
  void leave();
  void consensus(ConsensusKind kind, float* out, size_t count);
  size_t num_elements() const;  // PARAMETER + BUFFER elements, after commit

  void set_param(Param key, double value);
  double get_param(Param key) const;
  EngineStats stats() const;

  // --- checkpoint (runtime/engine/checkpoint.cpp) ---
  // A sharded engine saves this rank's shard (every rank writes its own blob); any engine's
  // save_portable writes the replicated format, loadable at any W and sharding. Both collective;
  // write may be empty on ranks that do not write. A sharded engine's load is collective too.
  void save(const WriteFn& write);
  void save_portable(const WriteFn& write);
  size_t state_size() const;
  size_t portable_state_size() const;
  void load(const ReadFn& read);

  friend struct EngineTesting;  // tests/runtime/engine/engine_testing.hpp: white-box reads of State
  // Defined in runtime/engine/engine_state.hpp, for engine.cpp, checkpoint.cpp and the backends only.
  struct State;

  // For fault tests of hierarchical CO2 only: the node's communicator (intra) or this local
  // index's across the nodes (inter); null before commit or without hierarchy.
  std::shared_ptr<Communicator> node_communicator_for_testing(bool inter);

  // For tests of the round logic only (tests/runtime/engine/engine_rounds_test.cpp): the backend made
  // by `make` replaces the host backend; before any tensor is registered.
  void use_backend_for_testing(const std::function<std::unique_ptr<Backend>(State&)>& make);

 private:
  std::unique_ptr<State> state_;
};

}  // namespace co2

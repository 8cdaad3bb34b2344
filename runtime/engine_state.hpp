// The engine's private state, shared by engine.cpp (rounds, updates) and checkpoint.cpp.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "runtime/buffer.hpp"
#include "runtime/comm.hpp"
#include "runtime/device/device_path.hpp"
#include "runtime/engine.hpp"
#include "runtime/tau_advisor.hpp"

namespace co2 {

// What the gap penalty remembers of one segment between updates.
struct GapHistory {
  double last_step_norm = 0.0;  // alpha * ||s|| of the previous update (g)
  double gap_sum = 0.0;         // sum of g over the updates so far
  uint64_t updates = 0;
};

struct Engine::State {
  std::shared_ptr<Communicator> comm;
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
  FloatBuffer owned_flat;
  float* flat = nullptr;
  size_t flat_count = 0;

  // Outer state (replicated, fp32).
  FloatBuffer anchor;
  FloatBuffer momentum;  // empty while beta == 0 and not Nesterov
  FloatBuffer comm_buffer;
  FloatBuffer gradient_buffer;  // reduce_gradients outside `sync`, allocated on first use

  // Round state.
  uint32_t round_tau = 12;  // tau of the round in progress
  uint32_t steps_in_round = 0;
  std::shared_ptr<Request> pending;  // co2: the all-reduce of the previous round's deltas
  std::atomic<bool> pending_result_finite{true};  // set on the progress thread
  bool average_ready = false;  // comm_buffer holds an arrived average not yet applied
  bool ready_average_finite = true;

  EngineStats stats;
  TauAdvisor advisor;  // step and all-reduce times -> the smallest tau that hides the all-reduce

  // CUDA tensors (runtime/device/): the device path owns the outer state then, and the host
  // buffers above stay empty. placement: co2_device_kind_t of the tensors, -1 before the first.
  int placement = -1;
  int device_index = 0;
  DeviceAllocator allocator;
  std::unique_ptr<DevicePath> device;

  bool has_anchor() const {
    return config.algorithm == Algorithm::Co2 || config.algorithm == Algorithm::Diloco;
  }
  bool momentum_needed() const { return beta > 0.0 || config.nesterov; }
};

// Shared by engine.cpp and checkpoint.cpp.
uint64_t consensus_checksum(const Engine::State& s);
bool same_on_every_rank(Engine::State& s, uint64_t value);
void check_anchor(Engine::State& s);  // collective; throws AnchorMismatch
void collect_pending_average(Engine::State& s);  // waits; the average stays ready to apply
void set_parameters_to_anchor(Engine::State& s);
// Waits for `request`, charging the time to boundary_wait_ns; throws the collective's error.
void wait_charged(Engine::State& s, const std::shared_ptr<Request>& request);

}  // namespace co2

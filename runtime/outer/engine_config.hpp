// What a training run is configured to do (co2_engine_config_t, validated by the engine): the
// algorithm, its outer update, the policies and where the outer state lives. Below the engine,
// because the backends read it too.
#pragma once

#include <cstdint>

#include "runtime/outer/options.hpp"
#include "runtime/outer/wire_format.hpp"

namespace co2 {

enum class Algorithm : int { Co2 = 0, Sync = 1, LocalSgd = 2, Diloco = 3 };
// Auto: on (host and CUDA tensors).
enum class Eager : int { Off = 0, On = 1, Auto = -1 };
// Flat: every rank is an outer participant. Nodes: the ranks of a node train one model (their
// gradients averaged every step inside the node) and the nodes are the outer participants.
enum class Hierarchy : int { Flat = 0, Nodes = 1 };

struct EngineConfig {
  Algorithm algorithm = Algorithm::Co2;
  uint32_t tau = 12;
  uint32_t warmup_sync_rounds = 0;
  double outer_lr = 1.0;
  double outer_momentum = -1.0;  // negative: resolve by the number of outer participants
  bool nesterov = false;
  Penalty penalty = Penalty::None;
  double penalty_constant = 1.0;
  Clip clip = Clip::None;
  double clip_threshold = 1.0;
  uint32_t anchor_check_interval = 100;
  double inner_lr = 0.0;
  // co2 only: each rank starts its round from the anchor plus a rank-local correction that puts
  // its own fresh delta in place of its stale share (docs/algorithm.md, "The eager policy").
  Eager eager = Eager::Auto;
  // Compressed outer all-reduce (co2, diloco; docs/algorithm.md, "Compressed outer all-reduce"):
  // how the deltas travel, and whether each rank adds what its encodings dropped to its next
  // round's delta (error feedback).
  WireFormat wire_format = WireFormat::F32;
  bool error_feedback = true;
  // Sharded outer state (docs/algorithm.md, "Sharded outer state"): each rank keeps only its
  // shard of the anchor and the momentum; reduce-scatter, shard update, all-gather.
  bool shard_outer_state = false;
  // Hierarchical CO2 (docs/algorithm.md, "Hierarchical CO2"): sync inside a node, co2 across
  // nodes; local rank j carries shard j of the inter-node all-reduce. Shards the outer state
  // over the node's ranks. node_id: this rank's node (-1: the launcher's environment, as
  // co2_comm_split_nodes; the C API passes the communicator's).
  Hierarchy hierarchy = Hierarchy::Flat;
  int node_id = -1;
  // co2: when a round's average is applied (docs/algorithm.md, "Applying the average on arrival"):
  // kApplyAtBoundary, kApplyOnArrival, or k >= 1 steps after the boundary.
  int32_t apply_step = 0;
};
inline constexpr int32_t kApplyAtBoundary = 0;
inline constexpr int32_t kApplyOnArrival = -1;

}  // namespace co2

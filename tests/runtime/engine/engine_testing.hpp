// What white-box tests read of an engine's private state. Engine befriends EngineTesting, so
// that none of this is on Engine's API.
#pragma once

#include "runtime/engine/engine.hpp"
#include "runtime/engine/engine_state.hpp"

namespace co2 {

struct EngineTesting {
  // The anchor this rank updates and checksums (its full-size copy; null where it holds none).
  static float* live_anchor(Engine& engine) { return engine.state_->anchor.data(); }
  // Whether this rank holds a full-size copy of the anchor: a sharded engine holds only its shard.
  static bool holds_full_anchor(Engine& engine) { return live_anchor(engine) != nullptr; }
};

}  // namespace co2

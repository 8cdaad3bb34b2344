// Applying co2's average when it arrives instead of at the next boundary (config.apply_step;
// docs/algorithm.md, "Applying the average on arrival"): which step of the round that is. The
// step must be the same on every rank, so under CO2_APPLY_ON_ARRIVAL the ranks agree on it: each
// announces the step at which it saw the average arrive (a Max all-reduce on the control lane),
// and every rank applies it one step after the latest. The application itself is engine.cpp's.
#pragma once

#include <cstdint>

#include "runtime/engine/engine_state.hpp"

namespace co2 {

// co2 with apply_step != CO2_APPLY_AT_BOUNDARY.
bool applies_on_arrival(const Engine::State& s);
// An average is in flight or collected, and not applied yet.
inline bool average_unapplied(const Engine::State& s) { return s.pending != nullptr || s.average_ready; }
// After a co2 boundary submitted its average: its step is agreed anew.
void begin_arrival_round(Engine::State& s);
// At a step between boundaries, with an average unapplied: whether it is applied at this step
// (announcing this rank's arrival, and waiting for the agreement, on the way).
bool arrival_step_due(Engine::State& s);
// Every rank announces once per average: one that is taken otherwise (a boundary, synchronize,
// save, load) is announced now if it was not, as arriving at `step`; `agree` then waits for the
// agreed step (save records it).
void settle_arrival(Engine::State& s, uint32_t step, bool agree);
// An announcement made at a boundary or synchronize, which takes the average there: later than
// any step of a round, so that no rank applies it before.
inline constexpr uint32_t kArrivedAtBoundary = uint32_t(1) << 30;
// Waits (bounded) for an exchange in flight; before the state is freed.
void drain_arrival(Engine::State& s) noexcept;

}  // namespace co2

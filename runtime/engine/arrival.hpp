// Applying co2's average before the next boundary (config.apply_step; docs/algorithm.md,
// "Applying the average on arrival"): at which step of the round. Every rank must apply it at the
// same step, decided from what every rank has alike: a fixed step, or under CO2_APPLY_ON_ARRIVAL
// the step by which the ranks' agreed measurements (the tau advisor's slowest step and shortest
// all-reduce, adopted at the same boundary on every rank) say it has arrived. Never a rank's own
// clock, and never a wait for another rank's training thread between boundaries (a rank blocked
// in a framework's own collective would then hold up the others). The application itself is
// engine.cpp's.
#pragma once

#include <cstdint>

#include "runtime/engine/engine_state.hpp"

namespace co2 {

// co2 with apply_step != CO2_APPLY_AT_BOUNDARY.
bool applies_on_arrival(const Engine::State& s);
// An average is in flight or collected, and not applied yet.
inline bool average_unapplied(const Engine::State& s) { return s.pending != nullptr || s.average_ready; }
// After a co2 boundary submitted its average: the step of the round it is applied at.
void begin_arrival_round(Engine::State& s);
// At a step between boundaries, with an average unapplied: whether it is applied at this step.
inline bool arrival_step_due(const Engine::State& s) { return s.arrival.apply_at == s.steps_in_round; }
// The step CO2_APPLY_ON_ARRIVAL predicts from a step time and an all-reduce time (0 when either
// is unknown: at the boundary): one step after the step in which the all-reduce completes.
uint32_t predicted_arrival_step(uint64_t step_ns, uint64_t allreduce_ns);

}  // namespace co2

#include "runtime/engine/arrival.hpp"

#include <algorithm>

namespace co2 {

bool applies_on_arrival(const Engine::State& s) {
  return s.config.apply_step != kApplyAtBoundary && s.config.algorithm == Algorithm::Co2;
}

uint32_t predicted_arrival_step(uint64_t step_ns, uint64_t allreduce_ns) {
  if (step_ns == 0 || allreduce_ns == 0) return 0;
  // The all-reduce completes within step ceil(T_ar / T_step) of the round; the ranks may see it
  // one step later (their phases differ by up to a step), and a rank that reaches the step
  // before it completed waits there: one step of margin keeps that wait rare.
  const uint64_t steps = (allreduce_ns + step_ns - 1) / step_ns + 1;
  return uint32_t(std::min<uint64_t>(steps, uint64_t(1) << 30));
}

void begin_arrival_round(Engine::State& s) {
  if (s.config.apply_step > 0)
    s.arrival.apply_at = uint32_t(s.config.apply_step);
  else if (s.config.apply_step == kApplyOnArrival)
    s.arrival.apply_at = predicted_arrival_step(s.observer.agreed_step_ns, s.observer.agreed_allreduce_ns);
  else
    s.arrival.apply_at = 0;
}

}  // namespace co2

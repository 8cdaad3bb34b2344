// The tau advisor: from the measured time of one training step (what the caller does between
// two engine calls) and of one all-reduce (submit to completion), the smallest tau for which the
// all-reduce launched at a co2 boundary finishes before the next boundary: tau * step >= allreduce.
//
// Why these two measurements: under co2 the all-reduce of round t runs while the caller computes
// the tau steps of round t+1, so it is hidden exactly when it takes no longer than those steps.
// Time spent inside the engine (boundaries, blocking gradient averages) is not the caller's
// compute and is excluded from the step time; a pause in training (synchronize, save, ...)
// restarts the measurement instead of counting as one long step.
//
// Both are exponentially weighted means (weight kSmoothing for the newest sample, the first
// sample taken as is), so a slow first all-reduce (connection set-up) or a changed link is
// forgotten after a few rounds.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>

namespace co2 {

class TauAdvisor {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kSmoothing = 0.25;

  // The caller enters the engine (step or reduce_gradients): the time since it last left counts
  // as training-step time.
  void caller_entered(Clock::time_point now) {
    if (outside_since_valid_) outside_ns_ += ns_between(outside_since_, now);
    outside_since_valid_ = false;
  }
  // The caller leaves the engine and goes back to computing.
  void caller_left(Clock::time_point now) {
    outside_since_ = now;
    outside_since_valid_ = true;
  }
  // One training step ended (co2_engine_step was entered): record what accumulated since the
  // previous step, if the whole interval was observed.
  void step_ended() {
    if (interval_complete_) mix(step_ns_, double(outside_ns_));
    outside_ns_ = 0;
    interval_complete_ = true;
  }
  // A call that is not part of the step rhythm: the current interval is not a training step.
  void pause() {
    outside_since_valid_ = false;
    interval_complete_ = false;
    outside_ns_ = 0;
  }
  void allreduce_completed(uint64_t submit_to_completion_ns) {
    mix(allreduce_ns_, double(submit_to_completion_ns));
  }

  uint64_t step_ns() const { return step_ns_ < 0 ? 0 : uint64_t(std::llround(step_ns_)); }
  uint64_t allreduce_ns() const {
    return allreduce_ns_ < 0 ? 0 : uint64_t(std::llround(allreduce_ns_));
  }
  // 0 until both are measured. Computed from the rounded values the statistics report, so a
  // caller can check advised * step_ns >= allreduce_ns > (advised - 1) * step_ns.
  uint32_t advised_tau() const { return measured() ? advise(step_ns(), allreduce_ns()) : 0; }
  bool measured() const { return step_ns() > 0 && allreduce_ns_ >= 0; }
  // The smallest tau with tau * step >= allreduce, in [1, 1e9]; 0 when step is 0.
  static uint32_t advise(uint64_t step, uint64_t allreduce) {
    if (step == 0) return 0;
    const uint64_t tau = allreduce / step + (allreduce % step != 0);
    return tau < 1 ? 1u : tau > 1000000000u ? 1000000000u : uint32_t(tau);
  }
  // When the caller left the engine, if it has not been paused since: the start of the step in
  // progress (for the trace).
  bool outside_since(Clock::time_point* since) const {
    if (!outside_since_valid_) return false;
    *since = outside_since_;
    return true;
  }

 private:
  static uint64_t ns_between(Clock::time_point from, Clock::time_point to) {
    return to > from
               ? uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count())
               : 0;
  }
  static void mix(double& mean, double sample) {
    mean = mean < 0 ? sample : (1.0 - kSmoothing) * mean + kSmoothing * sample;
  }

  Clock::time_point outside_since_{};
  bool outside_since_valid_ = false;
  bool interval_complete_ = false;  // the caller was observed since the previous step ended
  uint64_t outside_ns_ = 0;
  double step_ns_ = -1.0;  // < 0: no sample yet
  double allreduce_ns_ = -1.0;
};

}  // namespace co2

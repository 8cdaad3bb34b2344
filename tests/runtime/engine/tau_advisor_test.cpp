// TauAdvisor with synthetic time points: which intervals count as the caller's step, how the
// means are mixed, and how the advice is rounded. No clock is read.
#include "runtime/engine/tau_advisor.hpp"

#include <gtest/gtest.h>

namespace {

using co2::TauAdvisor;
using Clock = TauAdvisor::Clock;
using std::chrono::milliseconds;

// A fake timeline: t(ms) is a time point ms milliseconds after an arbitrary origin.
Clock::time_point t(int64_t ms) { return Clock::time_point(milliseconds(1000000 + ms)); }

// The caller computes `compute_ms`, then spends `engine_ms` inside co2_engine_step.
void step(TauAdvisor& a, int64_t& now, int64_t compute_ms, int64_t engine_ms) {
  now += compute_ms;
  a.caller_entered(t(now));
  a.step_ended();
  now += engine_ms;
  a.caller_left(t(now));
}

TEST(TauAdvisor, NothingBeforeBothAreMeasured) {
  TauAdvisor a;
  EXPECT_EQ(a.step_ns(), 0u);
  EXPECT_EQ(a.allreduce_ns(), 0u);
  EXPECT_EQ(a.advised_tau(), 0u);
  int64_t now = 0;
  step(a, now, 10, 0);  // the first step has no start point: not a sample
  EXPECT_EQ(a.step_ns(), 0u);
  step(a, now, 10, 0);
  EXPECT_EQ(a.step_ns(), 10000000u);
  EXPECT_EQ(a.advised_tau(), 0u) << "no all-reduce measured yet";
  a.allreduce_completed(25000000);
  EXPECT_EQ(a.advised_tau(), 3u);
}

TEST(TauAdvisor, EngineTimeIsNotTheCallersStep) {
  TauAdvisor a;
  int64_t now = 0;
  step(a, now, 7, 500);  // a boundary that waited 500 ms
  step(a, now, 7, 500);
  step(a, now, 7, 0);
  EXPECT_EQ(a.step_ns(), 7000000u);
  // sync: a blocking gradient average between two steps is excluded as well.
  now += 3;
  a.caller_entered(t(now));
  now += 900;
  a.caller_left(t(now));
  step(a, now, 4, 0);
  EXPECT_EQ(a.step_ns(), 7000000u);
}

TEST(TauAdvisor, PauseDropsTheInterruptedInterval) {
  TauAdvisor a;
  int64_t now = 0;
  step(a, now, 10, 0);
  step(a, now, 10, 0);
  now += 5000;  // synchronize / save / evaluation
  a.pause();
  step(a, now, 10, 0);  // its interval began before the pause: not a sample
  EXPECT_EQ(a.step_ns(), 10000000u);
  step(a, now, 10, 0);
  EXPECT_EQ(a.step_ns(), 10000000u);
}

TEST(TauAdvisor, ExponentialMeanWithTheFirstSampleAsIs) {
  TauAdvisor a;
  a.allreduce_completed(100);
  EXPECT_EQ(a.allreduce_ns(), 100u);
  a.allreduce_completed(500);
  EXPECT_EQ(a.allreduce_ns(), 200u);  // 0.75 * 100 + 0.25 * 500
  for (int i = 0; i < 200; ++i) a.allreduce_completed(1000);
  EXPECT_EQ(a.allreduce_ns(), 1000u);
}

TEST(TauAdvisor, SmallestTauThatCoversTheAllReduce) {
  struct Case {
    int64_t step_ms;
    uint64_t allreduce_ns;
    uint32_t tau;
  };
  for (const Case c : {Case{10, 1, 1}, Case{10, 10000000, 1}, Case{10, 10000001, 2},
                       Case{10, 120000000, 12}, Case{10, 475000000, 48}, Case{3, 0, 1}}) {
    TauAdvisor a;
    int64_t now = 0;
    step(a, now, c.step_ms, 1);
    step(a, now, c.step_ms, 1);
    a.allreduce_completed(c.allreduce_ns);
    EXPECT_EQ(a.advised_tau(), c.tau) << c.step_ms << " ms steps, " << c.allreduce_ns << " ns";
    const uint64_t tau = a.advised_tau();
    EXPECT_GE(tau * a.step_ns(), a.allreduce_ns());
    if (tau > 1) {
      EXPECT_LT((tau - 1) * a.step_ns(), a.allreduce_ns());
    }
  }
}

}  // namespace

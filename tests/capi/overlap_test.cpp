// Overlap: a co2 boundary returns while the all-reduce it launched is still pending, and with
// inner steps longer than the collective the training thread (almost) never waits for it.
//
// Its own executable: the slowed local transport (CO2_LOCAL_TEST_BANDWIDTH, read when a
// communicator is created) is set in-process with setenv around the tests that need it, so no
// other test is slowed.
//
// Which observable proves overlap:
//  1. Causality (Overlap.BoundaryReturnsBeforeThePeerJoinsTheAllReduce), no clock involved:
//     rank 1 does not start its boundary t (so does not submit its share of AAR_t) until rank
//     0's boundary t has returned. AAR_t cannot complete without rank 1's data, so if rank 0's
//     step returns at all in that situation, it returned while AAR_t was pending. A blocking
//     implementation would never return and rank 1's wait for it times out (the test then
//     fails instead of hanging). The diloco control shows the observable discriminates: there
//     rank 0's boundary can only return after rank 1 joined.
//  2. Quantitative (Overlap.BoundaryWaitIsSmallWhenStepsOutlastTheCollective), with the
//     transport slowed so that one all-reduce takes ~130 ms and τ inner steps take 300 ms:
//     stats.last_boundary_wait_ns at every boundary is < 5% of the mean collective time
//     (stats.collective_ns / number of all-reduces, number = bytes_reduced / payload), and the
//     boundary step itself returns in < 50% of that mean. Both are ratios of quantities
//     measured in the same run, no absolute wall-clock thresholds; the collective time is also
//     checked against the lower bound the link model imposes (payload / bandwidth), so the
//     comparison is not vacuous.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;
using namespace std::chrono;

namespace {

// Sets an environment variable for the lifetime of the object (read at comm creation).
co2_engine_config_t overlap_config(co2_algorithm_t algo, int tau) {
  co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
  cfg.algorithm = algo;
  cfg.tau = tau;
  cfg.anchor_check_interval = 0;  // no blocking checksum all-gather at a boundary
  return cfg;
}

void causality(co2_algorithm_t algo, bool slowed) {
  const int W = 2, tau = 2, R = 4;
  const Layout layout = layout_single(65537);
  const Data data = make_data(layout, W, 8);
  std::unique_ptr<ScopedEnv> env;
  // 256 KiB at 4 MB/s: ~65 ms per hop, so the all-reduce is long enough to be visibly pending.
  if (slowed) env = std::make_unique<ScopedEnv>("CO2_LOCAL_TEST_BANDWIDTH", "4000000");
  std::vector<Event> rank0_returned(R), rank1_joining(R);
  std::vector<int> returned_first(R, -1);   // co2: rank 0's boundary t returned before rank 1 started it
  std::vector<int> joined_before(R, -1);    // diloco: rank 1 had joined when rank 0 returned
  const milliseconds patience = algo == CO2_ALGO_CO2 ? milliseconds(30000) : milliseconds(300);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = overlap_config(algo, tau);
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    uint64_t k = 0;
    for (int t = 0; t < R; ++t) {
      model.inner_step(k++);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      model.inner_step(k++);
      if (rank == 1) {
        // Hold back this rank's boundary t (its AAR_t submission) until rank 0's returned.
        returned_first[t] = rank0_returned[t].wait_for(patience) ? 1 : 0;
        rank1_joining[t].set();
      }
      int b = 0;
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, &b));
      EXPECT_EQ(b, 1);
      if (rank == 0) {
        joined_before[t] = rank1_joining[t].is_set() ? 1 : 0;
        rank0_returned[t].set();
      }
    }
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
  });
  for (int t = 0; t < R; ++t) {
    if (algo == CO2_ALGO_CO2) {
      EXPECT_EQ(returned_first[t], 1)
          << "boundary " << t << ": rank 0's co2 boundary step did not return while rank 1 had "
          << "not yet submitted its part of that boundary's all-reduce: the step blocked on it";
    } else {
      // Control: diloco's blocking all-reduce needs rank 1's delta of this very round.
      EXPECT_EQ(returned_first[t], 0) << "boundary " << t;
      EXPECT_EQ(joined_before[t], 1) << "boundary " << t;
    }
  }
}

TEST(Overlap, BoundaryReturnsBeforeThePeerJoinsTheAllReduce) {
  causality(CO2_ALGO_CO2, false);
}
TEST(Overlap, BoundaryReturnsBeforeThePeerJoinsTheAllReduceSlowLink) {
  causality(CO2_ALGO_CO2, true);
}
TEST(Overlap, DilocoControlBlocksUntilThePeerJoins) { causality(CO2_ALGO_DILOCO, false); }

TEST(Overlap, BoundaryWaitIsSmallWhenStepsOutlastTheCollective) {
  const int W = 2, tau = 3, R = 5;
  const size_t N = 262144;  // 1 MiB of fp32
  const double bandwidth = 8e6;  // bytes/s per directed link
  // A ring all-reduce over W = 2 ranks carries (W-1)/W of the payload per direction in the
  // reduce-scatter and again in the all-gather: N*4 bytes per directed link, >= 131 ms here.
  const double link_bound_ns = double(N * sizeof(float)) / bandwidth * 1e9;
  const milliseconds inner_step(100);  // τ inner steps: 300 ms > the collective
  ScopedEnv env("CO2_LOCAL_TEST_BANDWIDTH", std::to_string(int64_t(bandwidth)));
  const Layout layout = layout_single(N);
  const Data data = make_data(layout, W, 8);
  std::vector<std::vector<int64_t>> step_ns(W), wait_ns(W);
  std::vector<co2_engine_stats_t> before_finalize(W), after_finalize(W);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = overlap_config(CO2_ALGO_CO2, tau);
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    uint64_t k = 0;
    for (int t = 0; t < R; ++t) {
      for (int j = 0; j < tau; ++j) {
        model.inner_step(k++);
        std::this_thread::sleep_for(inner_step);
        const auto t0 = steady_clock::now();
        int b = 0;
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, &b));
        const auto t1 = steady_clock::now();
        if (b) {
          step_ns[rank].push_back(duration_cast<nanoseconds>(t1 - t0).count());
          wait_ns[rank].push_back(int64_t(get_stats(eg.engine).last_boundary_wait_ns));
        }
      }
    }
    before_finalize[rank] = get_stats(eg.engine);
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
    after_finalize[rank] = get_stats(eg.engine);
  });
  if (HasFatalFailure()) return;
  for (int r = 0; r < W; ++r) {
    const co2_engine_stats_t& st = after_finalize[r];
    const uint64_t collectives = st.bytes_reduced / (N * sizeof(float));
    ASSERT_EQ(collectives, uint64_t(R)) << "one all-reduce per boundary";
    const double mean_collective = double(st.collective_ns) / double(collectives);
    // Not vacuous: the link model makes every all-reduce at least this long.
    EXPECT_GE(mean_collective, 0.5 * link_bound_ns) << "rank " << r;
    // The boundary step's own duration is printed, not asserted: it is the fused pass, whose
    // speed depends on the build (an ASan debug build takes longer than the all-reduce).
    ASSERT_EQ(step_ns[r].size(), size_t(R));
    for (int t = 0; t < R; ++t) {
      EXPECT_LT(double(wait_ns[r][t]), 0.05 * mean_collective)
          << "rank " << r << " boundary " << t << ": waited " << wait_ns[r][t] / 1e6
          << " ms for an all-reduce of mean " << mean_collective / 1e6 << " ms";
    }
    EXPECT_LT(double(before_finalize[r].boundary_wait_ns), 0.05 * mean_collective * (R - 1))
        << "rank " << r << ": total boundary wait " << before_finalize[r].boundary_wait_ns / 1e6
        << " ms";
    std::printf("[ overlap ] rank %d: mean all-reduce %.1f ms (link bound %.1f ms), boundary "
                "wait total %.3f ms over %d boundaries, slowest boundary step %.3f ms\n",
                r, mean_collective / 1e6, link_bound_ns / 1e6,
                before_finalize[r].boundary_wait_ns / 1e6, R,
                *std::max_element(step_ns[r].begin(), step_ns[r].end()) / 1e6);
  }
}

}  // namespace

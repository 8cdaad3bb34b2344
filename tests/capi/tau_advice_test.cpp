// The tau advisor through the C API: co2_engine_get_stats reports the measured step time, the
// measured all-reduce time and the smallest tau that hides the one behind the other.
//
// Its own executable: the slowed local transport (CO2_LOCAL_TEST_BANDWIDTH) is set in-process.
// No timed assertion: the checks are the relationship between the three reported numbers
// (advised * step >= allreduce > (advised - 1) * step) and lower bounds that cannot fail on a
// slow machine (a sleep lasts at least its length; the link model makes an all-reduce at least
// payload / bandwidth long).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;
using namespace std::chrono;

namespace {

constexpr size_t kCount = 262144;      // 1 MiB of fp32
constexpr double kBandwidth = 16e6;    // bytes/s per directed link
// Ring all-reduce over two ranks: every byte of the payload crosses each directed link once.
constexpr double kLinkFloorNs = double(kCount * sizeof(float)) / kBandwidth * 1e9;  // 65.5 ms
constexpr milliseconds kInnerStep(10);

void expect_advice_hides_allreduce(const co2_engine_stats_t& st, int rank) {
  ASSERT_GT(st.step_time_ns, 0u) << "rank " << rank;
  ASSERT_GT(st.allreduce_time_ns, 0u) << "rank " << rank;
  const uint64_t tau = st.advised_tau;
  ASSERT_GE(tau, 1u) << "rank " << rank;
  EXPECT_GE(tau * st.step_time_ns, st.allreduce_time_ns)
      << "rank " << rank << ": tau = " << tau << " steps of " << st.step_time_ns
      << " ns do not cover the all-reduce of " << st.allreduce_time_ns << " ns";
  if (tau > 1) {
    EXPECT_LT((tau - 1) * st.step_time_ns, st.allreduce_time_ns)
        << "rank " << rank << ": tau = " << tau << " is not the smallest that hides it";
  }
  // Lower bounds: the caller slept kInnerStep per step, the link model bounds the all-reduce.
  EXPECT_GE(double(st.step_time_ns), double(duration_cast<nanoseconds>(kInnerStep).count()))
      << "rank " << rank;
  EXPECT_GE(double(st.allreduce_time_ns), 0.5 * kLinkFloorNs) << "rank " << rank;
  std::printf("[ advice ] rank %d: step %.2f ms, all-reduce %.2f ms (link floor %.2f ms), "
              "advised tau %u\n",
              rank, st.step_time_ns / 1e6, st.allreduce_time_ns / 1e6, kLinkFloorNs / 1e6,
              st.advised_tau);
}

// Trains `rounds` rounds of `tau` steps, sleeping kInnerStep per step (a GPU step as the host
// sees it), optionally averaging gradients every step (sync).
void run(co2_algorithm_t algo, int tau, int rounds, std::vector<co2_engine_stats_t>* before,
         std::vector<co2_engine_stats_t>* after) {
  const int W = 2;
  ScopedEnv env("CO2_LOCAL_TEST_BANDWIDTH", std::to_string(int64_t(kBandwidth)));
  const Layout layout = layout_single(kCount);
  const Data data = make_data(layout, W, 8);
  before->assign(W, co2_engine_stats_t{});
  after->assign(W, co2_engine_stats_t{});
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.algorithm = algo;
    cfg.tau = uint32_t(tau);
    cfg.anchor_check_interval = 0;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    (*before)[rank] = get_stats(eg.engine);
    std::vector<float> grad(kCount, 1.0f);
    void* grads[1] = {grad.data()};
    uint64_t k = 0;
    for (int i = 0; i < rounds * tau; ++i) {
      // Under sync the parameters must stay identical (no optimizer applies the averaged
      // gradient here), so only the other algorithms take local steps.
      if (algo != CO2_ALGO_SYNC) model.inner_step(k++);
      std::this_thread::sleep_for(kInnerStep);
      if (algo == CO2_ALGO_SYNC) CO2_ASSERT_OK(co2_engine_reduce_gradients(eg.engine, grads, 1, nullptr));
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    }
    (*after)[rank] = get_stats(eg.engine);
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
  });
}

TEST(TauAdvice, ZeroBeforeAnythingWasMeasured) {
  std::vector<co2_engine_stats_t> before, after;
  run(CO2_ALGO_CO2, 2, 0, &before, &after);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(before[r].step_time_ns, 0u);
    EXPECT_EQ(before[r].allreduce_time_ns, 0u);
    EXPECT_EQ(before[r].advised_tau, 0u);
  }
}

TEST(TauAdvice, Co2AdviceHidesTheMeasuredAllReduce) {
  std::vector<co2_engine_stats_t> before, after;
  run(CO2_ALGO_CO2, 2, 4, &before, &after);
  for (int r = 0; r < 2; ++r) expect_advice_hides_allreduce(after[r], r);
}

// Under sync the blocking gradient average happens between two steps; it is engine time, so the
// step time stays the caller's own and the advice still follows the relationship.
TEST(TauAdvice, SyncAdviceHidesTheMeasuredAllReduce) {
  std::vector<co2_engine_stats_t> before, after;
  run(CO2_ALGO_SYNC, 1, 4, &before, &after);
  for (int r = 0; r < 2; ++r) expect_advice_hides_allreduce(after[r], r);
}

// An old caller that passes the ABI-v1.0 size (up to last_clip_fraction) gets exactly that much
// written: the new fields beyond it are left alone.
TEST(TauAdvice, OldStatsSizeIsNotOverrun) {
  std::vector<co2_engine_stats_t> before, after;
  co2_engine_stats_t old_caller{};
  const size_t old_size = offsetof(co2_engine_stats_t, step_time_ns);
  run_ranks(1, [&](int, co2_comm_t comm) {
    EngineGuard eg;
    CO2_ASSERT_OK(co2_engine_create(comm, nullptr, &eg.engine));
    std::vector<float> w(16, 0.0f);
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = w.data();
    t.count = w.size();
    CO2_ASSERT_OK(co2_engine_register_tensor(eg.engine, &t));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (int i = 0; i < 30; ++i) CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    old_caller.size = old_size;
    old_caller.version = CO2_ABI_VERSION;
    old_caller.step_time_ns = 0xABCDu;
    old_caller.advised_tau = 0x1234u;
    CO2_ASSERT_OK(co2_engine_get_stats(eg.engine, &old_caller));
  });
  EXPECT_EQ(old_caller.size, old_size);
  EXPECT_EQ(old_caller.steps, 30u);
  EXPECT_EQ(old_caller.step_time_ns, 0xABCDu);
  EXPECT_EQ(old_caller.advised_tau, 0x1234u);
}

}  // namespace

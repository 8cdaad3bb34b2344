// White-box tests of the anchor checksum (docs/algorithm.md "Anchor checksum"): a 1-ulp change
// to one rank's live anchor (co2::EngineTesting::live_anchor, reached through capi/handles.hpp)
// is detected with CO2_ERR_ANCHOR_MISMATCH on every rank by co2_engine_synchronize, by
// co2_engine_save and by the periodic check every K boundaries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "capi/handles.hpp"
#include "co2/co2.h"
#include "tests/capi/rank_threads.hpp"
#include "tests/capi/synthetic.hpp"
#include "tests/runtime/engine/engine_testing.hpp"

using namespace co2test;

namespace {

float* live_anchor(co2_engine_t engine) { return co2::EngineTesting::live_anchor(*engine->engine); }

void bump_one_ulp(float* x) { *x = std::nextafter(*x, std::numeric_limits<float>::infinity()); }

struct Where {
  const char* label;
  size_t element;  // in the concatenated PARAMETER+BUFFER state of layout_mixed()
};
// layout_mixed() state: layer0.weight [0, 7), layer0.bias 7, bn.running_mean [8, 21),
// layer1.weight [21, 52), bn.num_batches [52, 55).
// First element, a BUFFER element and the last element (a BUFFER too).
const Where kWhere[] = {{"first", 0}, {"buffer", 10}, {"last", 54}};
// PARAMETER elements only: BUFFER segments are updated with α = 1 whatever the outer lr, so a
// 1-ulp change there could be rounded away by the next update before a periodic check sees it.
const Where kParamWhere[] = {{"first", 0}, {"bias", 7}, {"last_param", 51}};

// The hook is the anchor: it reads what consensus(ANCHOR) reports.
TEST(EngineAnchorHook, AnchorForTestingIsTheConsensusAnchor) {
  const int W = 2;
  const Layout layout = layout_mixed();
  const size_t n = layout.state_elements();
  const Data data = make_data(layout, W, 1);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.tau = 2;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (int k = 0; k < 6; ++k) {
      model.inner_step(k);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    }
    std::vector<float> buf(n);
    CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
    ASSERT_NE(live_anchor(eg.engine), nullptr);
    EXPECT_EQ(std::memcmp(live_anchor(eg.engine), buf.data(), n * sizeof(float)), 0);
  });
}

class AnchorMismatch : public ::testing::TestWithParam<Where> {};

// finalize (nothing in flight afterwards, p = a), then 1 ulp on rank 1's anchor, then
// synchronize: no steps since the last boundary, so no update can absorb the change; the
// checksums differ -> CO2_ERR_ANCHOR_MISMATCH on every rank. Control: without the change,
// synchronize succeeds and counts one anchor check.
TEST_P(AnchorMismatch, SynchronizeDetectsOneUlp) {
  const size_t element = GetParam().element;
  for (bool perturb : {false, true}) {
    const int W = 3;
    const Layout layout = layout_mixed();
    const Data data = make_data(layout, W, 2);
    run_ranks(W, [&](int rank, co2_comm_t comm) {
      LocalModel model(layout, data, rank);
      EngineGuard eg;
      co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
      cfg.tau = 2;
      cfg.outer_momentum = 0.5;
      cfg.penalty = CO2_PENALTY_GAP;
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      for (int k = 0; k < 6; ++k) {
        model.inner_step(k);
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      }
      CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
      const uint64_t checks = get_stats(eg.engine).anchor_checks;
      if (perturb && rank == 1) bump_one_ulp(live_anchor(eg.engine) + element);
      const co2_status_t s = co2_engine_synchronize(eg.engine);
      if (perturb) {
        EXPECT_EQ(s, CO2_ERR_ANCHOR_MISMATCH) << "rank " << rank << ": " << co2_status_string(s);
      } else {
        EXPECT_EQ(s, CO2_OK) << "rank " << rank << ": " << co2_last_error_message();
        EXPECT_EQ(get_stats(eg.engine).anchor_checks, checks + 1) << "rank " << rank;
      }
    });
  }
}

// save compares the checksums too (it is collective).
TEST_P(AnchorMismatch, SaveDetectsOneUlp) {
  const size_t element = GetParam().element;
  const int W = 2;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 3);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.tau = 2;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (int k = 0; k < 4; ++k) {
      model.inner_step(k);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    }
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
    if (rank == 0) bump_one_ulp(live_anchor(eg.engine) + element);
    std::vector<char> blob;
    auto write = [](void* user, const void* d, size_t len) -> int {
      auto* b = static_cast<std::vector<char>*>(user);
      b->insert(b->end(), static_cast<const char*>(d), static_cast<const char*>(d) + len);
      return 0;
    };
    CO2_EXPECT_STATUS(CO2_ERR_ANCHOR_MISMATCH, co2_engine_save(eg.engine, write, &blob));
  });
}

// Periodic check every K = 3 boundaries. α = 0 keeps the anchor fixed (a - 0·s = a exactly),
// so a 1-ulp change survives the updates that follow it and must be caught by the next
// periodic check: at one of the K boundaries after the change, the same one on every rank;
// every boundary before that returns OK. Control run: after 9 boundaries, 3 checks counted.
class AnchorMismatchPeriodic : public ::testing::TestWithParam<Where> {};

TEST_P(AnchorMismatchPeriodic, PeriodicCheckEveryKBoundaries) {
  const size_t element = GetParam().element;
  const int W = 3, K = 3, tau = 1, changed_after = 4;
  for (bool perturb : {false, true}) {
    const Layout layout = layout_mixed();
    const Data data = make_data(layout, W, 4);
    std::vector<int> failed_at(W, -1);
    run_ranks(W, [&](int rank, co2_comm_t comm) {
      LocalModel model(layout, data, rank);
      EngineGuard eg;
      co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
      cfg.tau = tau;
      cfg.outer_lr = 0.0;
      cfg.anchor_check_interval = 1000;  // set through set_param below
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      CO2_ASSERT_OK(co2_engine_set_param(eg.engine, CO2_PARAM_ANCHOR_CHECK_INTERVAL, K));
      double k_back = 0;
      CO2_ASSERT_OK(co2_engine_get_param(eg.engine, CO2_PARAM_ANCHOR_CHECK_INTERVAL, &k_back));
      EXPECT_EQ(k_back, double(K));
      const uint64_t checks0 = get_stats(eg.engine).anchor_checks;
      for (int t = 0; t < 3 * K; ++t) {
        model.inner_step(t);
        const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
        if (s != CO2_OK) {
          EXPECT_EQ(s, CO2_ERR_ANCHOR_MISMATCH) << "rank " << rank << " boundary " << t;
          failed_at[rank] = t;
          break;
        }
        if (perturb && t == changed_after && rank == 2)
          bump_one_ulp(live_anchor(eg.engine) + element);
      }
      if (!perturb) {
        EXPECT_EQ(get_stats(eg.engine).anchor_checks - checks0, 3u) << "rank " << rank;
      }
    });
    for (int r = 0; r < W; ++r) {
      if (!perturb) {
        EXPECT_EQ(failed_at[r], -1) << "rank " << r << " failed a clean run";
        continue;
      }
      EXPECT_GT(failed_at[r], changed_after) << "rank " << r;
      EXPECT_LE(failed_at[r], changed_after + K) << "rank " << r << ": not caught within K";
      EXPECT_EQ(failed_at[r], failed_at[0]) << "rank " << r << " failed at another boundary";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Element, AnchorMismatch, ::testing::ValuesIn(kWhere),
                         [](const ::testing::TestParamInfo<Where>& i) {
                           return std::string(i.param.label);
                         });
INSTANTIATE_TEST_SUITE_P(Element, AnchorMismatchPeriodic, ::testing::ValuesIn(kParamWhere),
                         [](const ::testing::TestParamInfo<Where>& i) {
                           return std::string(i.param.label);
                         });

}  // namespace

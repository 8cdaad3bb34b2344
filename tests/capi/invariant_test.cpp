// The invariant everything rests on (docs/algorithm.md "The invariant: identical anchors"):
// ranks that start from different parameters hold bit-identical anchors and parameters after
// commit and after every boundary; one rank's NaN never enters any anchor; a layout that differs
// across ranks fails every rank. Public C API only; ranks are threads over the local transport.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;

namespace {

uint64_t fnv1a(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

// ------------------------------------------------------------------------------------------
// Bit-identity from different starting points.
// ------------------------------------------------------------------------------------------

struct IdentityCase {
  std::string label;
  co2_algorithm_t algo;
  int world;
  Layout layout;
  co2_penalty_t penalty = CO2_PENALTY_NONE;
  co2_clip_t clip = CO2_CLIP_NONE;
  double phi = 1.0;
  int nesterov = 0;
  double beta = 0.0;
  uint64_t chunk_bytes = 0;  // small chunks: many ring blocks per segment
  int tau = 3;
  int rounds = 6;
  int eager = 0;  // co2: 1 or CO2_EAGER_AUTO: params start apart, only the anchors are shared
};

class Identity : public ::testing::TestWithParam<IdentityCase> {};

// After commit and after every boundary, every rank holds the same bytes: consensus(ANCHOR)
// (where there is an anchor) and its PARAMETER/BUFFER values; co2/diloco also p == a bitwise.
// Large layouts are compared through a 64-bit FNV-1a hash of the bytes (an equal hash of 4 MB
// of floats from different bytes is not a realistic outcome); small ones by memcmp.
TEST_P(Identity, AnchorsAndParamsBitIdentical) {
  const IdentityCase& c = GetParam();
  const size_t n = c.layout.state_elements();
  const bool keep = n < 100000;
  const bool has_anchor = c.algo == CO2_ALGO_CO2 || c.algo == CO2_ALGO_DILOCO;
  const bool eager = c.algo == CO2_ALGO_CO2 && c.eager != 0;
  const Data data = make_data(c.layout, c.world, 4242);
  const int events = c.rounds + 1;
  // [event][rank]
  std::vector<std::vector<std::vector<float>>> params(events, std::vector<std::vector<float>>(c.world));
  std::vector<std::vector<std::vector<float>>> anchors = params;
  std::vector<std::vector<uint64_t>> phash(events, std::vector<uint64_t>(c.world)), ahash = phash;
  CommOptions opts;
  opts.chunk_bytes = c.chunk_bytes;
  run_ranks(c.world, [&](int rank, co2_comm_t comm) {
    LocalModel model(c.layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = c.eager;
    cfg.algorithm = c.algo;
    cfg.tau = c.tau;
    cfg.outer_momentum = c.beta;
    cfg.outer_lr = 0.9;
    cfg.nesterov = c.nesterov;
    cfg.penalty = c.penalty;
    cfg.clip = c.clip;
    cfg.clip_threshold = c.phi;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<float> buf(n);
    auto record = [&](int ev) {
      std::vector<float> p = model.gather_state();
      phash[ev][rank] = fnv1a(p);
      if (has_anchor) {
        CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
        ahash[ev][rank] = fnv1a(buf);
        // p <- a at commit and at every boundary (eager: a + the rank's own offset).
        if (!eager || ev == 0) {
          EXPECT_TRUE(bitwise_equal(p, buf)) << "rank " << rank << " event " << ev
                                           << ": params differ from the anchor at element "
                                           << first_difference(p, buf);
        }
        if (keep) anchors[ev][rank] = buf;
      }
      if (keep) params[ev][rank] = std::move(p);
    };
    record(0);
    std::vector<std::vector<float>> grads;
    for (size_t t = 0; t < model.num_tensors(); ++t)
      if (model.role(t) == CO2_ROLE_PARAMETER) grads.emplace_back(model.count(t));
    uint64_t k = 0;
    for (int t = 0; t < c.rounds; ++t) {
      for (int j = 0; j < c.tau; ++j) {
        if (c.algo == CO2_ALGO_SYNC) {
          // sync: grad = p - target, averaged, then p -= lr * grad.
          std::vector<void*> ptrs;
          for (size_t q = 0, g = 0; q < model.num_tensors(); ++q) {
            if (model.role(q) != CO2_ROLE_PARAMETER) continue;
            for (size_t i = 0; i < model.count(q); ++i)
              grads[g][i] = model.tensor(q)[i] - data.target[rank][q][i];
            ptrs.push_back(grads[g++].data());
          }
          CO2_ASSERT_OK(co2_engine_reduce_gradients(eg.engine, ptrs.data(), ptrs.size(), nullptr));
          for (size_t q = 0, g = 0; q < model.num_tensors(); ++q) {
            if (model.role(q) != CO2_ROLE_PARAMETER) continue;
            for (size_t i = 0; i < model.count(q); ++i)
              model.tensor(q)[i] -= inner_lr(k) * grads[g][i];
            ++g;
          }
          ++k;
        } else {
          model.inner_step(k++);
        }
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      }
      // sync: BUFFER segments are averaged at the boundary, PARAMETERs with every gradient;
      // but the EXCLUDED ones are per rank (gather_state leaves them out).
      record(t + 1);
    }
  }, opts);
  if (HasFatalFailure()) return;
  for (int ev = 0; ev < events; ++ev) {
    for (int r = 1; r < c.world; ++r) {
      if (eager && ev > 0) {
        EXPECT_NE(phash[ev][r], phash[ev][0]) << "eager ranks start their rounds apart";
      } else {
        EXPECT_EQ(phash[ev][r], phash[ev][0]) << "params of rank " << r << " differ from rank 0 "
                                              << (ev == 0 ? "after commit" : "after boundary ")
                                              << (ev == 0 ? "" : std::to_string(ev - 1));
      }
      if (keep && (!eager || ev == 0)) {
        EXPECT_TRUE(bitwise_equal(params[ev][r], params[ev][0]))
            << "event " << ev << " rank " << r << " element "
            << first_difference(params[ev][r], params[ev][0]);
      }
      if (has_anchor) {
        EXPECT_EQ(ahash[ev][r], ahash[ev][0]) << "anchor of rank " << r << " event " << ev;
        if (keep) {
          EXPECT_TRUE(bitwise_equal(anchors[ev][r], anchors[ev][0]))
              << "event " << ev << " rank " << r << " element "
              << first_difference(anchors[ev][r], anchors[ev][0]);
        }
      }
    }
  }
  // The ranks really started apart: rank 1's initial values differ from rank 0's.
  EXPECT_NE(data.init[1][0][0], data.init[0][0][0]);
}

std::vector<IdentityCase> identity_cases() {
  std::vector<IdentityCase> v;
  v.push_back({"co2_W3_gap_norm_nesterov", CO2_ALGO_CO2, 3, layout_mixed(), CO2_PENALTY_GAP,
               CO2_CLIP_NORM, 0.3, 1, 0.9});
  v.push_back({"co2_W4_value_small_chunks", CO2_ALGO_CO2, 4, layout_mixed(Storage::AdoptFlat),
               CO2_PENALTY_CONSTANT, CO2_CLIP_VALUE, 0.05, 0, 0.5, 64});
  v.push_back({"co2_W2_single1", CO2_ALGO_CO2, 2, layout_single(1)});
  v.push_back({"diloco_W4_gap_value_nesterov", CO2_ALGO_DILOCO, 4, layout_mixed(),
               CO2_PENALTY_GAP, CO2_CLIP_VALUE, 0.05, 1, 0.9, 96});
  v.push_back({"localsgd_W3", CO2_ALGO_LOCALSGD, 3, layout_mixed(Storage::AllocFlat)});
  v.push_back({"sync_W3", CO2_ALGO_SYNC, 3, layout_mixed()});
  IdentityCase big{"co2_W3_big_gap_norm", CO2_ALGO_CO2, 3, layout_big(), CO2_PENALTY_GAP,
                   CO2_CLIP_NORM, 30.0, 1, 0.9, 1 << 16};
  big.tau = 1;
  big.rounds = 4;
  v.push_back(big);
  // The eager policy (explicit, and the default CO2_EAGER_AUTO on host tensors).
  for (IdentityCase e : {v[0], v[1], v[2], big}) {
    e.label += "_eager";
    e.eager = e.world == 4 ? CO2_EAGER_AUTO : 1;
    v.push_back(e);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Cases, Identity, ::testing::ValuesIn(identity_cases()),
                         [](const ::testing::TestParamInfo<IdentityCase>& i) {
                           return i.param.label;
                         });

// ------------------------------------------------------------------------------------------
// Non-finite values.
// ------------------------------------------------------------------------------------------

constexpr size_t kBadElement = 30;  // in layer1.weight of layout_mixed()

// co2: a NaN in one rank's params before boundary 2. That boundary returns OK on every rank
// (the stale average it applies is finite) with nonfinite_local == 1 on that rank only; the NaN
// travels in AAR_2, so boundary 3 returns CO2_ERR_NONFINITE on every rank and leaves every
// anchor bitwise as it was; boundary 4 is normal again. No anchor ever holds a NaN.
TEST(NonFinite, Co2LocalNaNSkipsTheNextRoundOnEveryRank) {
  const int W = 3, tau = 2, bad_rank = 1;
  const Layout layout = layout_mixed();
  const size_t n = layout.state_elements();
  const Data data = make_data(layout, W, 99);
  std::vector<std::vector<std::vector<float>>> anchors(6, std::vector<std::vector<float>>(W));
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.tau = tau;
    cfg.outer_momentum = 0.5;
    cfg.penalty = CO2_PENALTY_GAP;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<float> buf(n);
    uint64_t k = 0;
    for (int t = 0; t < 6; ++t) {
      model.inner_step(k++);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      model.inner_step(k++);
      if (t == 2 && rank == bad_rank) *model.state_element(kBadElement) = std::nanf("");
      const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
      const co2_engine_stats_t st = get_stats(eg.engine);
      if (t == 3) {
        EXPECT_EQ(s, CO2_ERR_NONFINITE) << "rank " << rank << ": boundary 3 must skip the NaN "
                                        << "average that rank " << bad_rank << " sent";
        EXPECT_EQ(st.nonfinite_rounds, 1u) << "rank " << rank;
      } else {
        EXPECT_EQ(s, CO2_OK) << "rank " << rank << " boundary " << t << ": "
                             << co2_last_error_message();
        EXPECT_EQ(st.nonfinite_rounds, t > 3 ? 1u : 0u) << "rank " << rank << " boundary " << t;
      }
      EXPECT_EQ(st.nonfinite_local, (rank == bad_rank && t >= 2) ? 1u : 0u)
          << "rank " << rank << " boundary " << t;
      EXPECT_EQ(st.rounds, uint64_t(t + 1));
      CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
      EXPECT_TRUE(all_finite(buf)) << "rank " << rank << ": a NaN entered the anchor at "
                                   << "boundary " << t;
      // p <- a, also on the NaN rank and at the skipped boundary.
      EXPECT_TRUE(bitwise_equal(model.gather_state(), buf)) << "rank " << rank << " boundary " << t;
      anchors[t][rank] = buf;
    }
    // And the engine still trains: the next boundary applies a finite average.
    EXPECT_EQ(get_stats(eg.engine).outer_updates, 4u)
        << "boundaries 1, 2, 4, 5 applied updates; 0 (pipeline fill) and 3 (skipped) did not";
  });
  if (HasFatalFailure()) return;
  for (int t = 0; t < 6; ++t)
    for (int r = 1; r < W; ++r)
      EXPECT_TRUE(bitwise_equal(anchors[t][r], anchors[t][0])) << "boundary " << t << " rank " << r;
  for (int r = 0; r < W; ++r)
    EXPECT_TRUE(bitwise_equal(anchors[3][r], anchors[2][r]))
        << "rank " << r << ": the skipped boundary 3 changed the anchor at element "
        << first_difference(anchors[3][r], anchors[2][r]);
  EXPECT_FALSE(bitwise_equal(anchors[4][0], anchors[3][0])) << "boundary 4 applied nothing";
}

// diloco: the NaN is in this round's fresh average: CO2_ERR_NONFINITE at the same boundary on
// every rank, the anchor unchanged, p <- a.
TEST(NonFinite, DilocoNaNSkipsThatBoundaryOnEveryRank) {
  for (float bad : {std::nanf(""), -INFINITY}) {
    const int W = 3, tau = 2, bad_rank = 2;
    const Layout layout = layout_mixed();
    const size_t n = layout.state_elements();
    const Data data = make_data(layout, W, 98);
    std::vector<std::vector<std::vector<float>>> anchors(4, std::vector<std::vector<float>>(W));
    run_ranks(W, [&](int rank, co2_comm_t comm) {
      LocalModel model(layout, data, rank);
      EngineGuard eg;
      co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
      cfg.eager = 0;  // the delayed schedule (eager has its own cases)
      cfg.algorithm = CO2_ALGO_DILOCO;
      cfg.tau = tau;
      cfg.outer_lr = 0.7;
      cfg.outer_momentum = 0.9;
      cfg.nesterov = 1;
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      std::vector<float> buf(n);
      uint64_t k = 0;
      for (int t = 0; t < 4; ++t) {
        model.inner_step(k++);
        CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
        model.inner_step(k++);
        if (t == 2 && rank == bad_rank) *model.state_element(kBadElement) = bad;
        const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
        EXPECT_EQ(s, t == 2 ? CO2_ERR_NONFINITE : CO2_OK) << "rank " << rank << " boundary " << t;
        EXPECT_EQ(get_stats(eg.engine).nonfinite_rounds, t >= 2 ? 1u : 0u);
        CO2_ASSERT_OK(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, buf.data(), n));
        EXPECT_TRUE(all_finite(buf)) << "rank " << rank;
        EXPECT_TRUE(bitwise_equal(model.gather_state(), buf)) << "rank " << rank << ": p <- a";
        anchors[t][rank] = buf;
      }
    });
    if (HasFatalFailure()) return;
    for (int r = 0; r < W; ++r) {
      EXPECT_TRUE(bitwise_equal(anchors[2][r], anchors[1][r])) << "rank " << r;
      EXPECT_TRUE(bitwise_equal(anchors[3][r], anchors[3][0])) << "rank " << r;
    }
  }
}

// localsgd: a non-finite average leaves every rank's p as it was; CO2_ERR_NONFINITE everywhere.
TEST(NonFinite, LocalSgdNaNLeavesParamsAsTheyWere) {
  const int W = 3, tau = 2, bad_rank = 0;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 97);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.algorithm = CO2_ALGO_LOCALSGD;
    cfg.tau = tau;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    uint64_t k = 0;
    for (int t = 0; t < 3; ++t) {
      model.inner_step(k++);
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
      model.inner_step(k++);
      if (t == 1 && rank == bad_rank) *model.state_element(kBadElement) = std::nanf("");
      const std::vector<float> before = model.gather_state();
      const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
      if (t == 1) {
        EXPECT_EQ(s, CO2_ERR_NONFINITE) << "rank " << rank;
        EXPECT_TRUE(bitwise_equal(model.gather_state(), before)) << "rank " << rank;
        // Repair, as a framework would (reload), so the run can go on.
        if (rank == bad_rank) *model.state_element(kBadElement) = 0.25f;
      } else {
        EXPECT_EQ(s, CO2_OK) << "rank " << rank;
      }
    }
  });
}

// sync: a non-finite averaged gradient is not written back; CO2_ERR_NONFINITE on every rank.
TEST(NonFinite, SyncNaNGradientIsNotWrittenBack) {
  const int W = 3;
  const Layout layout{"two", {{"a", 7, CO2_ROLE_PARAMETER}, {"b", 11, CO2_ROLE_PARAMETER}}};
  const Data data = make_data(layout, W, 96);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    cfg.algorithm = CO2_ALGO_SYNC;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<float> a(7, 0.5f + rank), b(11, -0.25f * rank);
    if (rank == 1) b[3] = std::nanf("");
    const std::vector<float> a0 = a, b0 = b;
    void* ptrs[2] = {a.data(), b.data()};
    CO2_EXPECT_STATUS(CO2_ERR_NONFINITE, co2_engine_reduce_gradients(eg.engine, ptrs, 2, nullptr));
    EXPECT_TRUE(bitwise_equal(a, a0)) << "rank " << rank;
    EXPECT_TRUE(bitwise_equal(b, b0)) << "rank " << rank;
    // The next call with finite gradients works.
    b[3] = 1.0f;
    CO2_EXPECT_OK(co2_engine_reduce_gradients(eg.engine, ptrs, 2, nullptr));
    EXPECT_FLOAT_EQ(a[0], 1.5f);  // (0.5 + 1.5 + 2.5) / 3
  });
}

// ------------------------------------------------------------------------------------------
// Layout mismatch: every rank fails commit with CO2_ERR_LAYOUT_MISMATCH.
// ------------------------------------------------------------------------------------------

struct MismatchCase {
  std::string label;
  int rank;                         // the rank whose layout differs
  std::function<void(Layout&)> edit;
};

class LayoutMismatch : public ::testing::TestWithParam<MismatchCase> {};

TEST_P(LayoutMismatch, EveryRankFailsCommit) {
  const MismatchCase& c = GetParam();
  const int W = 3;
  std::vector<Layout> layouts(W, layout_mixed());
  c.edit(layouts[c.rank]);
  std::vector<Data> data;
  for (int r = 0; r < W; ++r) data.push_back(make_data(layouts[r], W, 5));
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layouts[rank], data[rank], rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.eager = 0;  // the delayed schedule (eager has its own cases)
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_EXPECT_STATUS(CO2_ERR_LAYOUT_MISMATCH, co2_engine_commit(eg.engine));
    // The parameters were not overwritten by a broadcast of a layout that does not match.
    EXPECT_EQ(model.tensor(0)[0], data[rank].init[rank][0][0]) << "rank " << rank;
  });
}

std::vector<MismatchCase> mismatch_cases() {
  return {
      {"count", 2, [](Layout& l) { l.tensors[0].count = 8; }},
      {"name", 1, [](Layout& l) { l.tensors[1].name = "layer0.bias_"; }},
      {"role", 2, [](Layout& l) { l.tensors[2].role = CO2_ROLE_PARAMETER; }},
      {"order", 1, [](Layout& l) { std::swap(l.tensors[0], l.tensors[1]); }},
      {"extra_excluded", 2,
       [](Layout& l) { l.tensors.push_back({"extra", 3, CO2_ROLE_EXCLUDED}); }},
      {"excluded_count", 0, [](Layout& l) { l.tensors[3].count = 6; }},
      {"missing_tensor", 1, [](Layout& l) { l.tensors.pop_back(); }},
      {"flat_split", 1,
       [](Layout& l) {
         // Same total and roles in flat storage, split at another place.
         l.storage = Storage::AdoptFlat;
         l.tensors[0].count = 6;
         l.tensors[1].count = 2;
       }},
  };
}
INSTANTIATE_TEST_SUITE_P(Variants, LayoutMismatch, ::testing::ValuesIn(mismatch_cases()),
                         [](const ::testing::TestParamInfo<MismatchCase>& i) {
                           return i.param.label;
                         });

// ------------------------------------------------------------------------------------------
// Settings that change the math (or the collectives) are part of the commit-time agreement:
// ranks created with different ones fail every rank's commit with CO2_ERR_LAYOUT_MISMATCH,
// naming the setting, instead of training different models (or pairing different collectives).
// ------------------------------------------------------------------------------------------

struct ConfigMismatchCase {
  std::string label;
  std::string setting;  // the name the message gives
  std::function<void(co2_engine_config_t&)> on_every_rank;
  std::function<void(co2_engine_config_t&)> on_rank_1;
};

class ConfigMismatch : public ::testing::TestWithParam<ConfigMismatchCase> {};

TEST_P(ConfigMismatch, EveryRankFailsCommitNamingTheSetting) {
  const ConfigMismatchCase& c = GetParam();
  const int W = 2;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 5);
  CommOptions options;
  options.timeout_ms = 10000;  // before the check, a differing collective could wait this long
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    if (c.on_every_rank) c.on_every_rank(cfg);
    if (rank == 1) c.on_rank_1(cfg);
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_EXPECT_STATUS(CO2_ERR_LAYOUT_MISMATCH, co2_engine_commit(eg.engine));
    const std::string message = co2_last_error_message();
    EXPECT_NE(message.find(c.setting), std::string::npos) << "rank " << rank << ": " << message;
    // Nothing was broadcast over the parameters.
    EXPECT_EQ(model.tensor(0)[0], data.init[rank][0][0]) << "rank " << rank;
  }, options);
}

std::vector<ConfigMismatchCase> config_mismatch_cases() {
  using C = co2_engine_config_t&;
  auto bf16_wire = [](C c) { c.wire_format = CO2_WIRE_BF16; };
  return {
      {"algorithm", "algorithm", nullptr, [](C c) { c.algorithm = CO2_ALGO_DILOCO; }},
      {"eager", "eager", nullptr, [](C c) { c.eager = 0; }},
      {"error_feedback", "error_feedback", bf16_wire, [](C c) { c.error_feedback = 0; }},
      {"tau", "tau", nullptr, [](C c) { c.tau = 13; }},
      {"warmup_sync_rounds", "warmup_sync_rounds", nullptr, [](C c) { c.warmup_sync_rounds = 1; }},
      {"outer_lr", "outer_lr", nullptr, [](C c) { c.outer_lr = 0.5; }},
      {"outer_momentum", "outer_momentum", nullptr, [](C c) { c.outer_momentum = 0.5; }},
      {"nesterov", "nesterov", nullptr, [](C c) { c.nesterov = 1; }},
      {"penalty", "penalty", nullptr, [](C c) { c.penalty = CO2_PENALTY_GAP; }},
      {"penalty_constant", "penalty_constant", [](C c) { c.penalty = CO2_PENALTY_CONSTANT; },
       [](C c) { c.penalty_constant = 2.0; }},
      {"clip", "clip", nullptr, [](C c) { c.clip = CO2_CLIP_VALUE; }},
      {"clip_threshold", "clip_threshold", [](C c) { c.clip = CO2_CLIP_NORM; }, [](C c) { c.clip_threshold = 2.0; }},
      {"anchor_check_interval", "anchor_check_interval", nullptr, [](C c) { c.anchor_check_interval = 7; }},
      {"wire_format", "wire_format", nullptr, bf16_wire},
      {"shard_outer_state", "shard_outer_state", nullptr, [](C c) { c.shard_outer_state = 1; }},
      {"hierarchy", "hierarchy", nullptr, [](C c) { c.hierarchy = CO2_HIERARCHY_NODES; }},
      {"apply_step", "apply_step", nullptr, [](C c) { c.apply_step = CO2_APPLY_ON_ARRIVAL; }},
      {"apply_step_k", "apply_step", [](C c) { c.apply_step = 3; }, [](C c) { c.apply_step = 4; }},
  };
}
INSTANTIATE_TEST_SUITE_P(Settings, ConfigMismatch, ::testing::ValuesIn(config_mismatch_cases()),
                         [](const ::testing::TestParamInfo<ConfigMismatchCase>& i) {
                           return i.param.label;
                         });

// Settings that do not change the math may differ: eager AUTO and eager 1 are the same policy on
// host tensors; a penalty constant without the constant policy, a clip threshold without
// clipping and error feedback with an uncompressed wire are never used.
TEST(ConfigAgreement, SettingsThatChangeNothingMayDiffer) {
  const int W = 2;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 5);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    if (rank == 1) {
      cfg.eager = 1;
      cfg.penalty_constant = 3.0;
      cfg.clip_threshold = 5.0;
      cfg.error_feedback = 0;
      cfg.inner_lr = 0.1;
    }
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_EXPECT_OK(co2_engine_commit(eg.engine));
  });
}

// hierarchy = nodes where no rank says which node it is on (no node_id, no launcher's node
// index): every rank falls back to the host name, so a group of threads or processes on one
// host would run as one node, i.e. as sync with an outer step over a single participant, without
// a word. That is refused on every rank, naming what to set.
TEST(ConfigAgreement, HierarchyWithoutNodeIdsOnOneHostIsRefused) {
  const int W = 2;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, W, 5);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.hierarchy = CO2_HIERARCHY_NODES;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_commit(eg.engine));
    const std::string message = co2_last_error_message();
    EXPECT_NE(message.find("node_id"), std::string::npos) << "rank " << rank << ": " << message;
  });
}

}  // namespace

// Checkpoints through the public C API (docs/capi.md "Checkpoint", docs/algorithm.md
// "Checkpoint"): save at round k into a std::vector, destroy engine and communicator, create,
// register, commit, load, continue: the trajectory equals an uninterrupted run bit for bit.
// Also: saves with the co2 all-reduce in flight, mid-round saves, state_size, blobs of another
// layout, corrupted blobs (the engine stays usable and its run unchanged), another world size,
// and failing write callbacks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;

namespace {

using Blob = std::vector<char>;

int write_vec(void* user, const void* data, size_t length) {
  auto* b = static_cast<Blob*>(user);
  b->insert(b->end(), static_cast<const char*>(data), static_cast<const char*>(data) + length);
  return 0;
}

struct Reader {
  const Blob* blob = nullptr;
  size_t pos = 0;
  size_t limit = 0;         // bytes available (a truncated blob: < blob->size())
  bool zero_fill = false;   // past the limit: deliver zeros and report success
};
int read_vec(void* user, void* data, size_t length) {
  auto* r = static_cast<Reader*>(user);
  const size_t avail = r->pos < r->limit ? r->limit - r->pos : 0;
  if (length > avail && !r->zero_fill) return 1;
  const size_t n = std::min(length, avail);
  if (n > 0) std::memcpy(data, r->blob->data() + r->pos, n);
  if (length > n) std::memset(static_cast<char*>(data) + n, 0, length - n);
  r->pos += length;
  return 0;
}

co2_status_t load_blob(co2_engine_t engine, const Blob& blob, size_t limit, bool zero_fill) {
  Reader r{&blob, 0, limit, zero_fill};
  return co2_engine_load(engine, read_vec, &r);
}
co2_status_t load_blob(co2_engine_t engine, const Blob& blob) {
  return load_blob(engine, blob, blob.size(), false);
}

// The engine's state as a test can observe it: params, anchor, counters.
struct Record {
  uint64_t step = 0;  // global step index of the boundary
  std::vector<float> params, anchor;
  uint64_t rounds = 0, outer_updates = 0;
};
using Trajectory = std::vector<Record>;

// One rank: model + engine, driven by global step index.
class Trainer {
 public:
  Trainer(const Layout& layout, const Data& data, int rank) : model(layout, data, rank) {}

  void start(co2_comm_t comm, const co2_engine_config_t& cfg) {
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    CO2_ASSERT_OK(co2_engine_num_elements(eg.engine, &n));
  }
  std::vector<float> anchor() {
    std::vector<float> a(n);
    EXPECT_EQ(co2_engine_consensus(eg.engine, CO2_CONSENSUS_ANCHOR, a.data(), n), CO2_OK);
    return a;
  }
  Record record(uint64_t k) {
    const co2_engine_stats_t st = get_stats(eg.engine);
    return Record{k, model.gather_state(), anchor(), st.rounds, st.outer_updates};
  }
  // Runs global steps [from, to), recording after every boundary.
  void run(uint64_t from, uint64_t to, Trajectory* out) {
    for (uint64_t k = from; k < to; ++k) {
      model.inner_step(k);
      if (step_time.count()) std::this_thread::sleep_for(step_time);
      int b = 0;
      const co2_status_t s = co2_engine_step(eg.engine, nullptr, &b);
      ASSERT_EQ(s, CO2_OK) << "step " << k << ": " << co2_status_string(s) << ": "
                           << co2_last_error_message();
      if (b && out != nullptr) out->push_back(record(k));
    }
  }
  co2_status_t save(Blob* blob) { return co2_engine_save(eg.engine, write_vec, blob); }

  LocalModel model;
  EngineGuard eg;
  size_t n = 0;
  std::chrono::milliseconds step_time{0};  // a training step's time, beside the inner step
};

// Compares two trajectories on every boundary in [from_step, to_step), bit for bit.
void expect_same(const Trajectory& want, const Trajectory& got, uint64_t from_step,
                 const std::string& what, uint64_t to_step = UINT64_MAX) {
  size_t j = 0;
  size_t compared = 0;
  for (const Record& w : want) {
    if (w.step < from_step || w.step >= to_step) continue;
    while (j < got.size() && got[j].step < w.step) ++j;
    ASSERT_LT(j, got.size()) << what << ": no boundary at step " << w.step;
    const Record& g = got[j];
    ASSERT_EQ(g.step, w.step) << what << ": boundaries at different steps";
    EXPECT_TRUE(bitwise_equal(g.params, w.params))
        << what << " step " << w.step << ": params differ at element "
        << first_difference(g.params, w.params);
    EXPECT_TRUE(bitwise_equal(g.anchor, w.anchor))
        << what << " step " << w.step << ": anchor differs at element "
        << first_difference(g.anchor, w.anchor);
    EXPECT_EQ(g.rounds, w.rounds) << what << " step " << w.step;
    EXPECT_EQ(g.outer_updates, w.outer_updates) << what << " step " << w.step;
    ++compared;
  }
  EXPECT_GT(compared, 0u) << what << ": nothing compared";
}

// Same targets as `data` (so the synthetic optimizer is the same), different initial values
// (a restarted job's fresh model: load must override it), for `world` ranks.
Data restart_data(const Layout& layout, int world, uint64_t seed) {
  Data fresh = make_data(layout, world, seed + 1000);
  const Data same = make_data(layout, world, seed);
  fresh.target = same.target;
  return fresh;
}

// The uninterrupted run: every rank's trajectory over steps [0, total).
std::vector<Trajectory> uninterrupted(const Layout& layout, int W, uint64_t seed,
                                      const co2_engine_config_t& cfg, uint64_t total) {
  const Data data = make_data(layout, W, seed);
  std::vector<Trajectory> traj(W);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, cfg);
    if (::testing::Test::HasFatalFailure()) return;
    tr.run(0, total, &traj[rank]);
  });
  return traj;
}

// ------------------------------------------------------------------------------------------
// Save, restart, load, continue.
// ------------------------------------------------------------------------------------------

struct RestartCase {
  std::string label;
  co2_engine_config_t cfg;
  int world = 2;
  int world_after = 0;        // 0: the same
  uint64_t save_step = 0;     // steps done before the save (a multiple of τ: at a boundary)
  uint64_t total = 0;
  bool slow_link = false;     // phase 1 over a slowed link: the all-reduce surely in flight
  bool only_rank0_writes = false;
  Layout layout = layout_mixed();
};

co2_engine_config_t base_config(co2_algorithm_t algo, int tau) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.eager = 0;  // the delayed schedule (eager has its own cases)
  c.algorithm = algo;
  c.tau = tau;
  return c;
}

class Restart : public ::testing::TestWithParam<RestartCase> {};

TEST_P(Restart, ContinuationIsBitwiseEqual) {
  const RestartCase& c = GetParam();
  const int W2 = c.world_after ? c.world_after : c.world;
  const uint64_t seed = 21;
  const uint32_t tau = c.cfg.tau;
  const bool mid_round = c.save_step % tau != 0;
  const std::vector<Trajectory> base = uninterrupted(c.layout, c.world, seed, c.cfg, c.total);
  if (HasFatalFailure()) return;

  // Phase 1: run to the save point, save, destroy everything.
  const Data data1 = make_data(c.layout, c.world, seed);
  std::vector<Blob> blobs(c.world);
  std::vector<size_t> sizes(c.world, 0);
  std::vector<std::vector<std::vector<float>>> local(c.world);  // per-rank framework state
  std::vector<Trajectory> traj1(c.world);
  std::vector<std::vector<float>> saved_anchor(c.world), saved_params(c.world);
  // Under eager each rank's blob also carries its own offsets: it loads its own blob (at the
  // same W) and starts from anchor + offset, as the uninterrupted run does.
  const bool eager = c.cfg.eager != 0;
  // Error feedback is per rank too: each blob carries its rank's residual.
  const bool per_rank = eager || (c.cfg.wire_format != CO2_WIRE_FP32 && c.cfg.error_feedback);
  {
    std::unique_ptr<ScopedEnv> env;
    if (c.slow_link) env = std::make_unique<ScopedEnv>("CO2_LOCAL_TEST_LATENCY_US", "20000");
    run_ranks(c.world, [&](int rank, co2_comm_t comm) {
      Trainer tr(c.layout, data1, rank);
      tr.start(comm, c.cfg);
      if (HasFatalFailure()) return;
      tr.run(0, c.save_step, &traj1[rank]);
      if (HasFatalFailure()) return;
      CO2_ASSERT_OK(co2_engine_state_size(tr.eg.engine, &sizes[rank]));
      const bool writes = !c.only_rank0_writes || rank == 0;
      CO2_ASSERT_OK(co2_engine_save(tr.eg.engine, writes ? write_vec : nullptr,
                                    writes ? &blobs[rank] : nullptr));
      local[rank] = tr.model.snapshot_all();
      saved_anchor[rank] = tr.anchor();
      saved_params[rank] = tr.model.gather_state();
      // Saving does not change the trajectory: this run continues like the uninterrupted one.
      Trajectory rest;
      const uint64_t until = std::min<uint64_t>(c.total, c.save_step + 2 * tau);
      tr.run(c.save_step, until, &rest);
      expect_same(base[rank], rest, c.save_step,
                  "continuing after save, rank " + std::to_string(rank), until);
    });
  }
  if (HasFatalFailure()) return;
  for (int r = 0; r < c.world; ++r) {
    if (c.only_rank0_writes && r != 0) {
      EXPECT_TRUE(blobs[r].empty());
      continue;
    }
    EXPECT_EQ(blobs[r].size(), sizes[r]) << "rank " << r << ": state_size vs bytes written";
    // Shared state only: every rank writes the same canonical bytes (eager: plus its own
    // offsets, so the blobs differ, but have the same size).
    if (per_rank) {
      EXPECT_EQ(blobs[r].size(), blobs[0].size()) << "rank " << r;
    } else {
      EXPECT_TRUE(blobs[r] == blobs[0]) << "rank " << r << "'s blob differs from rank 0's";
    }
  }
  ASSERT_FALSE(blobs[0].empty());

  // Phase 2: a fresh communicator and engine (other initial values), load, continue.
  const Data data2 = restart_data(c.layout, W2, seed);
  std::vector<Trajectory> traj2(W2);
  std::vector<std::vector<float>> after_load(W2);
  run_ranks(W2, [&](int rank, co2_comm_t comm) {
    Trainer tr(c.layout, data2, rank);
    tr.start(comm, c.cfg);
    if (HasFatalFailure()) return;
    const bool own_blob = per_rank && W2 == c.world;
    CO2_ASSERT_OK(load_blob(tr.eg.engine, blobs[own_blob ? rank : 0]));
    // Load sets p <- a (the restored anchor), plus the rank's own offset under eager.
    after_load[rank] = tr.anchor();
    EXPECT_TRUE(bitwise_equal(after_load[rank], saved_anchor[0])) << "rank " << rank;
    if (eager && own_blob && !mid_round) {
      EXPECT_TRUE(bitwise_equal(tr.model.gather_state(), saved_params[rank])) << "rank " << rank;
      if (c.world > 1) { EXPECT_FALSE(bitwise_equal(saved_params[rank], saved_anchor[rank])) << "offset is zero"; }
    } else if (!(eager && own_blob)) {
      EXPECT_TRUE(bitwise_equal(tr.model.gather_state(), after_load[rank])) << "rank " << rank;
    }
    const co2_engine_stats_t st = get_stats(tr.eg.engine);
    EXPECT_EQ(st.world_size, W2);
    EXPECT_EQ(st.steps, c.save_step) << "rank " << rank << ": counters restored";
    EXPECT_EQ(st.rounds, c.save_step / tau) << "rank " << rank;
    if (mid_round) {
      ASSERT_EQ(W2, c.world);
      tr.model.restore_all(local[rank]);  // the framework restores its per-rank state
    }
    tr.run(c.save_step, c.total, &traj2[rank]);
  });
  if (HasFatalFailure()) return;
  if (W2 == c.world) {
    for (int r = 0; r < W2; ++r)
      expect_same(base[r], traj2[r], c.save_step, c.label + " rank " + std::to_string(r));
  } else {
    // Another W: the first boundary after the load applies the saved (stale) average, which does
    // not depend on the new ranks' params: its anchor equals the uninterrupted run's. Later
    // boundaries average other ranks, so only bit-identity across the new ranks is required.
    const uint64_t first = (c.save_step / tau + 1) * tau - 1;
    for (int r = 0; r < W2; ++r) {
      ASSERT_FALSE(traj2[r].empty());
      EXPECT_EQ(traj2[r][0].step, first);
      const auto it = std::find_if(base[0].begin(), base[0].end(),
                                   [&](const Record& x) { return x.step == first; });
      ASSERT_NE(it, base[0].end());
      if (c.cfg.algorithm == CO2_ALGO_CO2) {
        EXPECT_TRUE(bitwise_equal(traj2[r][0].anchor, it->anchor))
            << "rank " << r << ": the saved in-flight average was not applied as saved";
      }
      for (size_t i = 0; i < traj2[r].size(); ++i) {
        EXPECT_TRUE(bitwise_equal(traj2[r][i].anchor, traj2[0][i].anchor)) << r << " " << i;
        if (!eager) {  // eager ranks start their rounds from their own points
          EXPECT_TRUE(bitwise_equal(traj2[r][i].params, traj2[0][i].params)) << r << " " << i;
        }
      }
    }
  }
}

std::vector<RestartCase> restart_cases() {
  std::vector<RestartCase> v;
  {
    RestartCase c{"co2_plain_at_boundary", base_config(CO2_ALGO_CO2, 3)};
    c.save_step = 9;
    c.total = 21;
    v.push_back(c);
  }
  {
    // Momentum, Nesterov, gap history, norm clip: every piece of outer state matters.
    RestartCase c{"co2_momentum_gap_norm_nesterov", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.outer_momentum = 0.9;
    c.cfg.outer_lr = 0.7;
    c.cfg.nesterov = 1;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.cfg.clip = CO2_CLIP_NORM;
    c.cfg.clip_threshold = 0.3;
    c.world = 3;
    c.save_step = 12;
    c.total = 24;
    v.push_back(c);
  }
  {
    // Saved right after a boundary step over a slowed link: the all-reduce that boundary
    // launched is in flight when save is called (it takes several 20 ms message latencies).
    RestartCase c{"co2_save_with_allreduce_in_flight", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.outer_momentum = 0.5;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.world = 3;
    c.save_step = 6;
    c.total = 14;
    c.slow_link = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_mid_round", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.outer_momentum = 0.6;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.cfg.clip = CO2_CLIP_VALUE;
    c.cfg.clip_threshold = 0.05;
    c.save_step = 11;  // 2 steps into round 3
    c.total = 21;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_during_warmup", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.warmup_sync_rounds = 3;
    c.cfg.outer_momentum = 0.5;
    c.save_step = 4;  // after boundary 1 of 3 warmup boundaries
    c.total = 16;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_right_after_warmup", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.warmup_sync_rounds = 2;
    c.cfg.outer_momentum = 0.5;
    c.save_step = 6;  // after boundary 2 (like t = 0 of co2: the first average in flight)
    c.total = 16;
    v.push_back(c);
  }
  {
    RestartCase c{"diloco_momentum_gap_value_nesterov", base_config(CO2_ALGO_DILOCO, 3)};
    c.cfg.outer_momentum = 0.9;
    c.cfg.outer_lr = 0.7;
    c.cfg.nesterov = 1;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.cfg.clip = CO2_CLIP_VALUE;
    c.cfg.clip_threshold = 0.05;
    c.world = 3;
    c.save_step = 9;
    c.total = 21;
    v.push_back(c);
  }
  {
    RestartCase c{"diloco_mid_round", base_config(CO2_ALGO_DILOCO, 4)};
    c.cfg.outer_momentum = 0.5;
    c.save_step = 10;
    c.total = 20;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_only_rank0_writes", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.outer_momentum = 0.5;
    c.world = 3;
    c.save_step = 6;
    c.total = 15;
    c.only_rank0_writes = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_big", base_config(CO2_ALGO_CO2, 1)};
    c.cfg.outer_momentum = 0.9;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.layout = layout_big();
    // CO2_TEST_BIG_PARAMETERS=N shrinks the million-element tensor to N elements: the full
    // size does not finish under ThreadSanitizer (scripts/test.sh sets it there).
    if (const char* shrink = std::getenv("CO2_TEST_BIG_PARAMETERS"); shrink && std::atoll(shrink) > 0)
      c.layout.tensors.front().count = size_t(std::atoll(shrink));
    c.save_step = 3;
    c.total = 6;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_world_2_to_3", base_config(CO2_ALGO_CO2, 3)};
    c.world = 2;
    c.world_after = 3;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_world_3_to_2_momentum", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.outer_momentum = 0.8;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.world = 3;
    c.world_after = 2;
    c.save_step = 6;
    c.total = 12;
    v.push_back(c);
  }
  {
    RestartCase c{"diloco_world_2_to_4", base_config(CO2_ALGO_DILOCO, 2)};
    c.cfg.outer_momentum = 0.5;
    c.world = 2;
    c.world_after = 4;
    c.save_step = 4;
    c.total = 10;
    v.push_back(c);
  }
  // The eager policy: per-rank offsets and own-delta momentum restored by their rank.
  {
    RestartCase c{"co2_eager_momentum_gap_norm_nesterov", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.eager = 1;
    c.cfg.outer_momentum = 0.9;
    c.cfg.outer_lr = 0.7;
    c.cfg.nesterov = 1;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.cfg.clip = CO2_CLIP_NORM;
    c.cfg.clip_threshold = 0.3;
    c.world = 3;
    c.save_step = 12;
    c.total = 24;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_eager_with_allreduce_in_flight", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.eager = 1;
    c.world = 3;
    c.save_step = 6;
    c.total = 14;
    c.slow_link = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_eager_mid_round", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.eager = CO2_EAGER_AUTO;  // the default: eager on host tensors
    c.cfg.outer_momentum = 0.6;
    c.save_step = 11;
    c.total = 21;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_eager_world_2_to_3", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.eager = 1;
    c.cfg.outer_momentum = 0.5;
    c.world = 2;
    c.world_after = 3;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  // Applying the average on arrival (apply_step): saved before its step (the blob, format 7,
  // carries the average and the step it is applied at) and after it (applied: nothing in
  // flight, the offsets spent), mid-round and at a boundary, eager and delayed.
  {
    RestartCase c{"co2_arrival_saved_before_its_step", base_config(CO2_ALGO_CO2, 4)};
    c.cfg.eager = 1;
    c.cfg.apply_step = 3;
    c.cfg.outer_momentum = 0.5;
    c.cfg.penalty = CO2_PENALTY_GAP;
    c.world = 3;
    c.save_step = 9;  // step 1 of round 2: its average applies at step 3
    c.total = 20;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_arrival_saved_after_its_step", base_config(CO2_ALGO_CO2, 4)};
    c.cfg.eager = 1;
    c.cfg.apply_step = 1;
    c.cfg.outer_momentum = 0.5;
    c.cfg.nesterov = 1;
    c.world = 3;
    c.save_step = 10;  // step 2 of round 2: applied at its step 1
    c.total = 20;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_arrival_delayed_saved_at_a_boundary", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.apply_step = 2;
    c.cfg.clip = CO2_CLIP_NORM;
    c.cfg.clip_threshold = 0.3;
    c.save_step = 6;
    c.total = 15;
    c.slow_link = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_arrival_world_2_to_3", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.eager = 1;
    c.cfg.apply_step = 1;
    c.world = 2;
    c.world_after = 3;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  // The compressed outer all-reduce: each rank's error-feedback residual restored by its rank.
  {
    RestartCase c{"co2_bf16_error_feedback_momentum", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.wire_format = CO2_WIRE_BF16;
    c.cfg.outer_momentum = 0.6;
    c.world = 3;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_int8_error_feedback_in_flight", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.wire_format = CO2_WIRE_INT8;
    c.world = 3;
    c.save_step = 6;
    c.total = 14;
    c.slow_link = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_fp4_error_feedback_in_flight", base_config(CO2_ALGO_CO2, 2)};
    c.cfg.wire_format = CO2_WIRE_FP4;
    c.world = 3;
    c.save_step = 6;
    c.total = 14;
    c.slow_link = true;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_int8_error_feedback_eager", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.wire_format = CO2_WIRE_INT8;
    c.cfg.eager = 1;
    c.cfg.outer_momentum = 0.5;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  {
    RestartCase c{"diloco_int8_error_feedback_mid_round", base_config(CO2_ALGO_DILOCO, 4)};
    c.cfg.wire_format = CO2_WIRE_INT8;
    c.cfg.outer_momentum = 0.5;
    c.save_step = 10;
    c.total = 20;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_int8_without_error_feedback", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.wire_format = CO2_WIRE_INT8;
    c.cfg.error_feedback = 0;  // nothing per rank: every blob is the same
    c.save_step = 6;
    c.total = 12;
    v.push_back(c);
  }
  {
    RestartCase c{"co2_bf16_error_feedback_world_2_to_3", base_config(CO2_ALGO_CO2, 3)};
    c.cfg.wire_format = CO2_WIRE_BF16;
    c.world = 2;
    c.world_after = 3;
    c.save_step = 9;
    c.total = 18;
    v.push_back(c);
  }
  return v;
}
INSTANTIATE_TEST_SUITE_P(Cases, Restart, ::testing::ValuesIn(restart_cases()),
                         [](const ::testing::TestParamInfo<RestartCase>& i) {
                           return i.param.label;
                         });

// An AUTO β is resolved again for the new W: 0 at W = 2, 0.2 at W = 17.
// CO2_APPLY_ON_ARRIVAL: the step at which the saved average is applied comes from the saving
// run's measurements; the blob (format 7) carries it, and a restored run (which has measured
// nothing yet, so it would apply it at the boundary) applies it there, as the saving run does:
// the next boundary is bitwise the same.
TEST(CheckpointArrival, TheAgreedStepTravelsInTheBlob) {
  const Layout layout = layout_mixed();
  const int W = 3;
  const uint32_t tau = 6;
  const uint64_t save_step = 6 * tau + 1;  // step 1 of round 6, measured by then

  co2_engine_config_t cfg = base_config(CO2_ALGO_CO2, int(tau));
  cfg.eager = 1;
  cfg.apply_step = CO2_APPLY_ON_ARRIVAL;
  cfg.outer_momentum = 0.5;
  const uint64_t seed = 31;
  const Data data1 = make_data(layout, W, seed);
  std::vector<Blob> blobs(W);
  std::vector<std::vector<std::vector<float>>> local(W);
  std::vector<Trajectory> saving(W);
  std::vector<co2_engine_stats_t> saving_stats(W);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data1, rank);
    tr.step_time = std::chrono::milliseconds(3);  // a loopback all-reduce completes within one
    tr.start(comm, cfg);
    if (HasFatalFailure()) return;
    tr.run(0, save_step, nullptr);
    const uint64_t arrivals = get_stats(tr.eg.engine).arrival_updates;
    CO2_ASSERT_OK(tr.save(&blobs[rank]));
    local[rank] = tr.model.snapshot_all();
    tr.run(save_step, 7 * tau, &saving[rank]);  // to the next boundary
    saving_stats[rank] = get_stats(tr.eg.engine);
    EXPECT_EQ(saving_stats[rank].arrival_updates, arrivals + 1) << "rank " << rank << ": applied mid-round";
  });
  if (HasFatalFailure()) return;
  // Applied mid-round (else this test checks nothing): the all-reduce took less than a step.
  ASSERT_GE(saving_stats[0].last_apply_step, 1u);
  const Data data2 = restart_data(layout, W, seed);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data2, rank);
    tr.start(comm, cfg);
    if (HasFatalFailure()) return;
    CO2_ASSERT_OK(load_blob(tr.eg.engine, blobs[rank]));
    tr.model.restore_all(local[rank]);
    Trajectory restored;
    tr.run(save_step, 7 * tau, &restored);
    const co2_engine_stats_t st = get_stats(tr.eg.engine);
    EXPECT_EQ(st.last_apply_step, saving_stats[rank].last_apply_step) << "rank " << rank;
    expect_same(saving[rank], restored, save_step, "rank " + std::to_string(rank));
  });
}

TEST(CheckpointWorld, AutoBetaResolvedAgainAtTheNewWorldSize) {
  const Layout layout = layout_single(7);
  const co2_engine_config_t cfg = base_config(CO2_ALGO_CO2, 2);  // β = AUTO
  Blob blob;
  {
    const Data data = make_data(layout, 2, 1);
    run_ranks(2, [&](int rank, co2_comm_t comm) {
      Trainer tr(layout, data, rank);
      tr.start(comm, cfg);
      if (HasFatalFailure()) return;
      tr.run(0, 4, nullptr);
      EXPECT_EQ(get_stats(tr.eg.engine).resolved_outer_momentum, 0.0);
      CO2_ASSERT_OK(co2_engine_save(tr.eg.engine, rank == 0 ? write_vec : nullptr,
                                    rank == 0 ? &blob : nullptr));
    });
  }
  ASSERT_FALSE(blob.empty());
  const Data data = make_data(layout, 17, 1);
  run_ranks(17, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, cfg);
    if (HasFatalFailure()) return;
    CO2_ASSERT_OK(load_blob(tr.eg.engine, blob));
    EXPECT_EQ(get_stats(tr.eg.engine).resolved_outer_momentum, 0.2) << "rank " << rank;
    EXPECT_EQ(get_stats(tr.eg.engine).world_size, 17);
    tr.run(4, 8, nullptr);
  });
}

// ------------------------------------------------------------------------------------------
// Bad blobs: rejected, the engine untouched, its run unchanged.
// ------------------------------------------------------------------------------------------

// Everything a failed load must leave as it was.
struct Observed {
  std::vector<float> params, anchor;
  co2_engine_stats_t stats;
};
Observed observe(Trainer& tr) { return {tr.model.gather_state(), tr.anchor(), get_stats(tr.eg.engine)}; }
void expect_untouched(const Observed& a, const Observed& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.params, b.params)) << what << ": params changed";
  EXPECT_TRUE(bitwise_equal(a.anchor, b.anchor)) << what << ": anchor changed";
  EXPECT_EQ(a.stats.steps, b.stats.steps) << what;
  EXPECT_EQ(a.stats.rounds, b.stats.rounds) << what;
  EXPECT_EQ(a.stats.outer_updates, b.stats.outer_updates) << what;
  EXPECT_EQ(a.stats.world_size, b.stats.world_size) << what;
  EXPECT_EQ(a.stats.resolved_outer_momentum, b.stats.resolved_outer_momentum) << what;
}

// Finds `needle` in `hay`; npos if absent.
size_t find_bytes(const Blob& hay, const void* needle, size_t n) {
  const char* p = static_cast<const char*>(needle);
  auto it = std::search(hay.begin(), hay.end(), p, p + n);
  return it == hay.end() ? std::string::npos : size_t(it - hay.begin());
}

// A good blob is saved at step 6 of a co2 run (W = 2, τ = 3, momentum and gap, layout of two
// small tensors). Then, right after boundary 3 (the all-reduce in flight), every rank tries:
//  - the blob with one byte flipped, at every position: rejected with CHECKPOINT_CORRUPT or
//    CHECKPOINT_MISMATCH (a flip in the anchor's fp32 payload: CHECKPOINT_CORRUPT, the CRC);
//  - the blob truncated (the reader reports success and delivers zeros past the cut, so the
//    engine has to notice): CHECKPOINT_CORRUPT;
//  - a blob of another layout: CHECKPOINT_MISMATCH;
// each leaving params, anchor and counters as they were; and the run then continues exactly
// like one that never tried a bad load.
// Without an anchor (localsgd) the ranks' parameters legitimately differ mid-round: saving there
// must not compare them across ranks (it failed with ANCHOR_MISMATCH), and the blob, which holds
// only shared state, is the same on every rank. At a boundary they are compared again.
TEST(CheckpointLocalSgd, SavesMidRoundWhileTheRanksDiffer) {
  std::vector<Blob> blobs(2);
  run_ranks(2, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t cfg = base_config(CO2_ALGO_LOCALSGD, 3);
    EngineGuard eg;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    std::vector<float> w(64, 1.0f);
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = w.data();
    t.count = w.size();
    CO2_ASSERT_OK(co2_engine_register_tensor(eg.engine, &t));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    for (float& x : w) x -= 0.1f * float(rank + 1);  // one local step, different per rank
    CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    CO2_ASSERT_OK(co2_engine_save(eg.engine, write_vec, &blobs[rank]));
    for (int step = 1; step < 3; ++step) CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    Blob at_boundary;
    CO2_EXPECT_OK(co2_engine_save(eg.engine, write_vec, &at_boundary));
  });
  ASSERT_FALSE(blobs[0].empty());
  EXPECT_TRUE(blobs[0] == blobs[1]);
}

TEST(CheckpointBadBlob, RejectedAndTheRunIsUnchanged) {
  const int W = 2;
  const Layout layout{"small", {{"w", 7, CO2_ROLE_PARAMETER}, {"bn", 3, CO2_ROLE_BUFFER},
                                {"v", 5, CO2_ROLE_PARAMETER}}};
  co2_engine_config_t cfg = base_config(CO2_ALGO_CO2, 3);
  cfg.outer_momentum = 0.5;
  cfg.penalty = CO2_PENALTY_GAP;
  const uint64_t total = 24, bad_at = 12;
  const std::vector<Trajectory> base = uninterrupted(layout, W, 21, cfg, total);
  if (HasFatalFailure()) return;
  // A blob of another layout (same names, one count differs).
  Layout other = layout;
  other.tensors[2].count = 6;
  Blob other_blob;
  {
    const Data d = make_data(other, 1, 3);
    run_ranks(1, [&](int rank, co2_comm_t comm) {
      Trainer tr(other, d, rank);
      tr.start(comm, cfg);
      if (HasFatalFailure()) return;
      tr.run(0, 3, nullptr);
      CO2_ASSERT_OK(tr.save(&other_blob));
    });
  }
  const Data data = make_data(layout, W, 21);
  std::vector<Trajectory> traj(W);
  std::vector<std::vector<size_t>> accepted(W);  // flip positions that loaded OK
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, cfg);
    if (HasFatalFailure()) return;
    tr.run(0, 6, &traj[rank]);
    Blob good;
    CO2_ASSERT_OK(tr.save(&good));
    const std::vector<float> saved_anchor = tr.anchor();
    tr.run(6, bad_at, &traj[rank]);
    if (HasFatalFailure()) return;
    const Observed before = observe(tr);
    // Flip every byte, one at a time.
    for (size_t pos = 0; pos < good.size(); ++pos) {
      Blob bad = good;
      bad[pos] = char(bad[pos] ^ 0x10);
      const co2_status_t s = load_blob(tr.eg.engine, bad);
      if (s == CO2_OK) {
        accepted[rank].push_back(pos);
        continue;
      }
      EXPECT_TRUE(s == CO2_ERR_CHECKPOINT_CORRUPT || s == CO2_ERR_CHECKPOINT_MISMATCH)
          << "flip at " << pos << " -> " << s << " " << co2_status_string(s);
      if (pos % 17 == 0) expect_untouched(before, observe(tr), "flip at " + std::to_string(pos));
    }
    expect_untouched(before, observe(tr), "after the flips");
    // A flip in the anchor payload (found by its fp32 little-endian bytes): the CRC.
    const size_t at = find_bytes(good, saved_anchor.data(), 7 * sizeof(float));
    EXPECT_NE(at, std::string::npos) << "the anchor's fp32 bytes are not in the blob";
    if (at != std::string::npos) {
      Blob bad = good;
      bad[at + 9] = char(bad[at + 9] ^ 0x01);
      CO2_EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, load_blob(tr.eg.engine, bad));
    }
    // Truncated, zeros delivered past the cut.
    for (size_t cut : {size_t(0), size_t(1), size_t(8), good.size() / 2, good.size() - 4,
                       good.size() - 1}) {
      CO2_EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, load_blob(tr.eg.engine, good, cut, true));
      expect_untouched(before, observe(tr), "truncated at " + std::to_string(cut));
    }
    // Truncated, the blob physically shorter: the read callback reports failure past the end,
    // which co2.h defines as CO2_ERR_CALLBACK.
    {
      Blob shorter(good.begin(), good.begin() + good.size() / 3);
      CO2_EXPECT_STATUS(CO2_ERR_CALLBACK, load_blob(tr.eg.engine, shorter));
      expect_untouched(before, observe(tr), "shorter blob");
    }
    // Another layout.
    CO2_EXPECT_STATUS(CO2_ERR_CHECKPOINT_MISMATCH, load_blob(tr.eg.engine, other_blob));
    expect_untouched(before, observe(tr), "other layout");
    // Still usable, and the run goes on exactly as if nothing had been tried.
    tr.run(bad_at, total, &traj[rank]);
  });
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(accepted[r].empty()) << "rank " << r << ": " << accepted[r].size()
                                     << " single-byte flips were accepted, the first at byte "
                                     << (accepted[r].empty() ? 0 : accepted[r][0]);
    expect_same(base[r], traj[r], 0, "after bad loads, rank " + std::to_string(r));
  }
}

// A blob saved by another algorithm is a mismatch (docs/capi.md).
TEST(CheckpointBadBlob, AnotherAlgorithmIsAMismatch) {
  const Layout layout = layout_single(7);
  Blob blob;
  const Data data = make_data(layout, 1, 1);
  run_ranks(1, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, base_config(CO2_ALGO_DILOCO, 2));
    if (HasFatalFailure()) return;
    tr.run(0, 2, nullptr);
    CO2_ASSERT_OK(tr.save(&blob));
  });
  run_ranks(1, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, base_config(CO2_ALGO_CO2, 2));
    if (HasFatalFailure()) return;
    CO2_EXPECT_STATUS(CO2_ERR_CHECKPOINT_MISMATCH, load_blob(tr.eg.engine, blob));
  });
}

// ------------------------------------------------------------------------------------------
// Write callbacks.
// ------------------------------------------------------------------------------------------

struct FailingWriter {
  int fail_on_call = 1;  // 1-based
  int calls = 0;
};
int failing_write(void* user, const void*, size_t) {
  auto* f = static_cast<FailingWriter*>(user);
  return ++f->calls >= f->fail_on_call ? 7 : 0;
}

// A write callback returning nonzero: CO2_ERR_CALLBACK (on every rank whose writer failed; a
// rank that passed write = NULL may succeed), and the engine goes on exactly as before.
TEST(CheckpointCallback, WriteFailureIsCallbackAndHarmless) {
  const int W = 2;
  const Layout layout = layout_mixed();
  co2_engine_config_t cfg = base_config(CO2_ALGO_CO2, 3);
  cfg.outer_momentum = 0.5;
  const uint64_t total = 18;
  const std::vector<Trajectory> base = uninterrupted(layout, W, 21, cfg, total);
  if (HasFatalFailure()) return;
  const Data data = make_data(layout, W, 21);
  std::vector<Trajectory> traj(W);
  run_ranks(W, [&](int rank, co2_comm_t comm) {
    Trainer tr(layout, data, rank);
    tr.start(comm, cfg);
    if (HasFatalFailure()) return;
    tr.run(0, 6, &traj[rank]);
    // Every rank's writer fails on its first call.
    FailingWriter first{1};
    CO2_EXPECT_STATUS(CO2_ERR_CALLBACK, co2_engine_save(tr.eg.engine, failing_write, &first));
    EXPECT_GE(first.calls, 1);
    tr.run(6, 9, &traj[rank]);
    // Fails on a later call (a partial blob was written).
    FailingWriter second{2};
    CO2_EXPECT_STATUS(CO2_ERR_CALLBACK, co2_engine_save(tr.eg.engine, failing_write, &second));
    tr.run(9, 12, &traj[rank]);
    // Only rank 0 writes, and fails.
    FailingWriter third{1};
    const co2_status_t s = co2_engine_save(tr.eg.engine, rank == 0 ? failing_write : nullptr,
                                           rank == 0 ? &third : nullptr);
    if (rank == 0) {
      EXPECT_EQ(s, CO2_ERR_CALLBACK);
    } else {
      EXPECT_TRUE(s == CO2_OK || s == CO2_ERR_CALLBACK) << s;
    }
    // And a good save still works afterwards and has the announced size.
    Blob blob;
    size_t size = 0;
    CO2_ASSERT_OK(co2_engine_state_size(tr.eg.engine, &size));
    CO2_ASSERT_OK(tr.save(&blob));
    EXPECT_EQ(blob.size(), size);
    tr.run(12, total, &traj[rank]);
  });
  for (int r = 0; r < W; ++r)
    expect_same(base[r], traj[r], 0, "after failed saves, rank " + std::to_string(r));
}

}  // namespace

// Sharded outer state (runtime/backends/sharded_backend.cpp) against the replicated engine, which the
// engine tests check against the float64 reference: the same training, W = 1..4, uneven segment
// sizes and a BUFFER segment; the anchor bitwise equal on every rank; NONFINITE at the same
// boundary; checkpoints between sharded and replicated, also at another W; the memory it holds.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/buffer.hpp"
#include "runtime/base/checksum.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/runtime/engine/engine_testing.hpp"
#include "tests/runtime/thread_group.hpp"
#include "transports/local/transport.hpp"

namespace co2 {
namespace {

using std::chrono::milliseconds;

std::vector<std::shared_ptr<Communicator>> make_group(int size, const transport::local::LinkModel& link = {}) {
  static int counter = 0;
  const std::string name = "sharded#" + std::to_string(counter++);
  CommOptions options;
  options.timeout = milliseconds(30000);
  auto joined = test::form_thread_group(
      size, [&](int rank) { return transport::local::join(name, rank, size, milliseconds(20000), link); }, options);
  return {std::make_move_iterator(joined.begin()), std::make_move_iterator(joined.end())};
}

// Uneven sizes: shards cut segments in the middle, and one rank's shard may hold no PARAMETER.
struct Shape {
  const char* name;
  size_t count;
  int role;
};
const Shape kShapes[] = {{"w", 1003, 0}, {"b", 17, 0}, {"stats", 9, 1}};

float gradient(size_t tensor, size_t i, int step, int rank) {
  return std::sin(0.013f * float(i) + 0.31f * float(step) + 0.7f * float(rank) + float(tensor));
}

struct Rank {
  std::vector<std::vector<float>> params;
  std::vector<float> anchor;
  EngineStats stats;
  std::vector<int> nonfinite_steps;
  Status failed = Status::Ok;  // another error ended the training
  std::string failure;
  bool full_anchor_while_saving = false;  // the engine held a full-size anchor copy at a write
};

// What one rank's training does between engine calls; `before_step` may poison the parameters.
struct Plan {
  int steps = 24;
  int first_step = 0;
  std::function<void(int step, int rank, std::vector<std::vector<float>>&)> before_step;
  int save_after = -1;                              // save at this step count (collective)
  bool portable = false;                            // save_portable (else save: per rank if sharded)
  std::vector<std::vector<char>>* saved = nullptr;  // per rank
  const std::vector<std::vector<char>>* restore = nullptr;
  // The gradient of element i of tensor t (default: gradient()); PARAMETER gradients averaged by
  // reduce_gradients when set; the rank's config (default: the one given).
  std::function<float(size_t t, size_t i, int step, int rank)> gradient_of;
  bool reduce_gradients = false;
  std::function<void(int rank, EngineConfig&)> configure;
  // Called after each engine.step (returned: whether it was a boundary).
  std::function<void(int step, int rank, bool boundary, Engine&)> after_step;
  transport::local::LinkModel link;  // a slowed link keeps a chain in flight longer
  bool abort_group_on_error = true;  // off: every rank must learn of a failure from the engine
  // Called before each step's gradients, with the rank's engine (e.g. to evaluate mid-round).
  std::function<void(int step, int rank, Engine&, Rank&)> at_step;
};

std::vector<Rank> train(int world, EngineConfig config, const Plan& plan) {
  auto group = make_group(world, plan.link);
  std::vector<Rank> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      Rank& me = out[size_t(rank)];
      EngineConfig mine = config;
      if (plan.configure) plan.configure(rank, mine);
      try {
      Engine engine(group[size_t(rank)], mine);
      for (size_t t = 0; t < std::size(kShapes); ++t) {
        me.params.emplace_back(kShapes[t].count);
        for (size_t i = 0; i < kShapes[t].count; ++i) me.params[t][i] = 0.01f * float(i % 89) - 0.4f + 0.1f * float(t);
        TensorDesc desc;
        desc.name = kShapes[t].name;
        desc.data = me.params[t].data();
        desc.count = kShapes[t].count;
        desc.role = kShapes[t].role;
        engine.register_tensor(desc);
      }
      engine.commit();
      if (plan.restore) {
        const std::vector<char>& blob = (*plan.restore)[size_t(rank) % plan.restore->size()];
        size_t offset = 0;
        engine.load([&](void* data, size_t length) {
          if (offset + length > blob.size()) return false;
          std::memcpy(data, blob.data() + offset, length);
          offset += length;
          return true;
        });
      }
      for (int step = plan.first_step; step < plan.steps; ++step) {
        if (step == plan.save_after) {
          std::vector<char>& blob = (*plan.saved)[size_t(rank)];
          const WriteFn write = [&](const void* data, size_t length) {
            me.full_anchor_while_saving = me.full_anchor_while_saving || EngineTesting::holds_full_anchor(engine);
            blob.insert(blob.end(), static_cast<const char*>(data), static_cast<const char*>(data) + length);
            return true;
          };
          if (plan.portable)
            engine.save_portable(write);
          else
            engine.save(write);
        }
        if (plan.at_step) plan.at_step(step, rank, engine, me);
        std::vector<std::vector<float>> g(me.params.size());
        std::vector<void*> trained;
        for (size_t t = 0; t < me.params.size(); ++t) {
          g[t].resize(me.params[t].size());
          // A pull towards 0 makes the trajectory depend on where each round starts (the eager
          // offset, the anchor), not only on the sum of the data's gradients.
          for (size_t i = 0; i < g[t].size(); ++i)
            g[t][i] = (plan.gradient_of ? plan.gradient_of(t, i, step, rank) : gradient(t, i, step, rank)) +
                      0.5f * me.params[t][i];
          if (kShapes[t].role == 0) trained.push_back(g[t].data());
        }
        if (plan.reduce_gradients) engine.reduce_gradients(trained.data(), trained.size(), nullptr);
        for (size_t t = 0; t < me.params.size(); ++t)
          for (size_t i = 0; i < me.params[t].size(); ++i)
            me.params[t][i] -= (kShapes[t].role == 1 ? 0.02f : 0.05f) * g[t][i];
        if (plan.before_step) plan.before_step(step, rank, me.params);
        bool boundary = false;
        try {
          boundary = engine.step(nullptr);
        } catch (const Error& e) {
          if (e.status() != Status::NonFinite) throw;
          me.nonfinite_steps.push_back(step);
        }
        if (plan.after_step) plan.after_step(step, rank, boundary, engine);
      }
      engine.finalize();
      me.anchor.resize(engine.num_elements());
      engine.consensus(ConsensusKind::Anchor, me.anchor.data(), me.anchor.size());
      me.stats = engine.stats();
      } catch (const Error& e) {
        me.failed = e.status();
        me.failure = e.what();
        if (plan.abort_group_on_error) group[size_t(rank)]->abort();  // the others fail promptly
      }
    });
  for (auto& thread : threads) thread.join();
  return out;
}

EngineConfig co2_config(bool sharded) {
  EngineConfig c;
  c.algorithm = Algorithm::Co2;
  c.tau = 3;
  c.outer_lr = 0.7;
  c.outer_momentum = 0.6;
  c.nesterov = true;
  c.penalty = Penalty::Constant;
  c.penalty_constant = 1.5;
  c.clip = Clip::Value;
  c.clip_threshold = 0.05;
  c.eager = Eager::Off;
  c.anchor_check_interval = 2;
  c.shard_outer_state = sharded;
  return c;
}

// Within fp32 rounding of the deltas: the sharded pass sends (next anchor - p) and adds the step
// back after the average, the replicated one sends (anchor - p).
void expect_close(const std::vector<float>& sharded, const std::vector<float>& replicated, const std::string& what) {
  ASSERT_EQ(sharded.size(), replicated.size()) << what;
  for (size_t i = 0; i < sharded.size(); ++i)
    ASSERT_NEAR(sharded[i], replicated[i], 2e-5f * (1.0f + std::fabs(replicated[i]))) << what << " element " << i;
}

void expect_bitwise_equal_across_ranks(const std::vector<Rank>& ranks, const std::string& what) {
  for (size_t r = 1; r < ranks.size(); ++r)
    EXPECT_EQ(std::memcmp(ranks[r].anchor.data(), ranks[0].anchor.data(), ranks[0].anchor.size() * sizeof(float)), 0)
        << what << ": rank " << r << "'s anchor differs from rank 0's";
}

// The policies: constant penalty and value clipping (elementwise), the gap penalty and norm
// clipping (per-segment norms from every shard's part), without a momentum.
// GapNormWarmUp: the same after two blocking warm-up rounds.
// Eager / EagerNoMomentum: the eager policy (each rank's round start and momentum full-size).
enum class Policy { ConstantValue, GapNorm, NoMomentum, GapNormWarmUp, Eager, EagerNoMomentum };

EngineConfig with_policy(EngineConfig c, Policy p) {
  if (p == Policy::GapNormWarmUp) c.warmup_sync_rounds = 2;
  if (p == Policy::GapNorm || p == Policy::GapNormWarmUp) {
    c.penalty = Penalty::Gap;
    c.clip = Clip::Norm;
    c.clip_threshold = 0.5;  // low enough that some rounds clip
  }
  if (p == Policy::Eager || p == Policy::EagerNoMomentum) c.eager = Eager::On;
  if (p == Policy::NoMomentum || p == Policy::EagerNoMomentum) {
    c.outer_momentum = 0.0;
    c.nesterov = false;
  }
  return c;
}

TEST(ShardedOuterState, EqualsTheReplicatedEngineAtEveryWorldSize) {
  for (int world = 1; world <= 4; ++world) {
    for (Policy policy : {Policy::ConstantValue, Policy::GapNorm, Policy::NoMomentum, Policy::GapNormWarmUp,
                          Policy::Eager, Policy::EagerNoMomentum}) {
      const EngineConfig replicated = with_policy(co2_config(false), policy);
      const EngineConfig sharded = with_policy(co2_config(true), policy);
      const std::string what = "W=" + std::to_string(world) + " policy " + std::to_string(int(policy));
      const auto a = train(world, replicated, Plan{});
      const auto b = train(world, sharded, Plan{});
      expect_bitwise_equal_across_ranks(b, what);
      expect_close(b[0].anchor, a[0].anchor, what + " anchor");
      for (int r = 0; r < world; ++r)
        for (size_t t = 0; t < std::size(kShapes); ++t)
          expect_close(b[size_t(r)].params[t], a[size_t(r)].params[t], what + " rank " + std::to_string(r) + " " + kShapes[t].name);
      EXPECT_EQ(b[0].stats.outer_updates, a[0].stats.outer_updates) << what;
      EXPECT_GT(b[0].stats.outer_updates, 5u) << what;
      EXPECT_NEAR(b[0].stats.last_penalty_min, a[0].stats.last_penalty_min, 1e-6) << what;
      EXPECT_NEAR(b[0].stats.last_clip_scale_min, a[0].stats.last_clip_scale_min, 1e-6) << what;
      if (policy == Policy::GapNorm || policy == Policy::GapNormWarmUp) {
        EXPECT_LT(a[0].stats.last_clip_scale_min, 1.0) << what << ": nothing was clipped";
      }
    }
  }
}

TEST(ShardedOuterState, HoldsOneModelCopyPlusItsShards) {
  size_t n = 0;
  for (const Shape& s : kShapes) n += s.count;
  for (int world : {1, 2, 4}) {
    const auto a = train(world, co2_config(false), Plan{});
    const auto b = train(world, co2_config(true), Plan{});
    const double copies = double(b[0].stats.outer_state_bytes) / double(n * sizeof(float));
    // B, and anchor, step and momentum shards of ceil(N / W), and one verdict per rank.
    EXPECT_LE(copies, 1.0 + 3.0 / world + 3.0 * world / double(n) + 1e-9) << "W=" << world;
    EXPECT_GE(double(a[0].stats.outer_state_bytes) / double(n * sizeof(float)), 3.0) << "W=" << world;
  }
}

TEST(ShardedOuterState, ANonFiniteDeltaIsRefusedAtTheSameBoundaryAsReplicated) {
  Plan plan;
  plan.before_step = [](int step, int rank, std::vector<std::vector<float>>& p) {
    if (step == 7 && rank == 1) p[0][500] = std::nanf("");  // the last step of round 3
  };
  for (int world : {2, 3}) {
    const auto a = train(world, co2_config(false), plan);
    const auto b = train(world, co2_config(true), plan);
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(b[size_t(r)].nonfinite_steps, a[size_t(r)].nonfinite_steps) << "W=" << world << " rank " << r;
      EXPECT_EQ(b[size_t(r)].nonfinite_steps.size(), 1u) << "W=" << world << " rank " << r;
    }
    expect_bitwise_equal_across_ranks(b, "after a refused average");
    // The momentum was left as it was: the training after it matches the replicated engine.
    expect_close(b[0].anchor, a[0].anchor, "W=" + std::to_string(world) + " after a refused average");
    EXPECT_EQ(b[0].stats.nonfinite_rounds, a[0].stats.nonfinite_rounds);
  }
}

// beta set while a round's chain is in flight (right after a boundary, over a slowed link that
// keeps the chain running): the update in flight takes the settings and the momentum buffer of
// the moment its deltas were submitted, as the replicated engine's does, and the next one the new
// beta, whenever the call lands. From beta 0, the momentum is allocated mid-chain.
TEST(ShardedOuterState, BetaChangedWhileAChainIsInFlightActsAsReplicated) {
  for (double beta : {0.0, 0.3}) {
    Plan plan;
    plan.link.bytes_per_second = 200e3;  // the chain takes tens of ms, set_param microseconds
    plan.after_step = [](int step, int, bool boundary, Engine& engine) {
      if (boundary && step == 5) engine.set_param(Param::OuterMomentum, 0.7);
    };
    EngineConfig replicated = with_policy(co2_config(false), Policy::NoMomentum);
    replicated.outer_momentum = beta;
    EngineConfig sharded = replicated;
    sharded.shard_outer_state = true;
    const std::string what = "beta " + std::to_string(beta) + " -> 0.7";
    const auto a = train(2, replicated, plan);
    const auto b = train(2, sharded, plan);
    for (const Rank& r : b) ASSERT_EQ(r.failed, Status::Ok) << what << ": " << r.failure;
    expect_bitwise_equal_across_ranks(b, what);
    expect_close(b[0].anchor, a[0].anchor, what);
    EXPECT_EQ(b[0].stats.resolved_outer_momentum, 0.7) << what;
  }
}

// A refused average saved in flight (the blob's average slot says so by a NaN) and loaded into
// a sharded engine: the next boundary refuses it there too and keeps the anchor, as a
// replicated engine loading the same blob does (issue 23, 11: before, the sharded engine took
// the refused average for its anchor).
TEST(ShardedOuterState, ARefusedAverageRestoredFromACheckpointKeepsTheAnchor) {
  Plan save;
  save.before_step = [](int step, int rank, std::vector<std::vector<float>>& p) {
    if (step == 7 && rank == 1) p[0][500] = std::nanf("");  // round 3's deltas are not finite
  };
  save.steps = 14;       // past the refusal at step 11: the saving run ends well
  save.save_after = 9;  // round 3's average in flight
  save.portable = true;
  std::vector<std::vector<char>> blobs(2), shards(2);
  save.saved = &blobs;
  for (const Rank& r : train(2, co2_config(true), save)) ASSERT_EQ(r.failed, Status::Ok) << r.failure;
  save.portable = false;  // and each rank's shard (flags.refused_average)
  save.saved = &shards;
  for (const Rank& r : train(2, co2_config(true), save)) ASSERT_EQ(r.failed, Status::Ok) << r.failure;
  Plan resume;
  resume.restore = &blobs;
  resume.first_step = 9;
  const auto replicated = train(2, co2_config(false), resume);
  EXPECT_EQ(replicated[0].nonfinite_steps, std::vector<int>{11});  // refused at the next boundary
  for (const auto* saved : {&blobs, &shards}) {
    resume.restore = saved;
    const std::string what = saved == &blobs ? "sharded resume of a refused average" : "per-rank resume of it";
    const auto sharded = train(2, co2_config(true), resume);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(sharded[size_t(r)].nonfinite_steps, replicated[size_t(r)].nonfinite_steps) << what << " rank " << r;
      EXPECT_EQ(sharded[size_t(r)].failed, Status::Ok) << sharded[size_t(r)].failure;
    }
    ASSERT_TRUE(all_of(sharded[0].anchor.begin(), sharded[0].anchor.end(), [](float v) { return std::isfinite(v); }));
    expect_close(sharded[0].anchor, replicated[0].anchor, what);
  }
}

// Flat sharding with the eager policy keeps each rank's round start R = a + e; the blob holds
// e = R - a (the replicated format), and a load adds it to the anchor again. R was itself rounded
// from a + (its offset), so R comes back bit for bit, and a save followed by a load (co2.torch's
// save_portable restores its run that way) leaves the trajectory as it was. Resumed mid-round
// with the rank's own parameters, as state_dict() does.
TEST(ShardedOuterState, EagerRoundStartSurvivesACheckpointBitForBit) {
  for (bool portable : {true, false}) {
  EngineConfig config = with_policy(co2_config(true), Policy::Eager);
  config.clip = Clip::None;
  std::vector<std::vector<char>> blobs(2);
  Plan save;
  save.portable = portable;  // per rank: the blob holds R itself
  // Large steps: offsets larger than the anchor's elements.
  save.gradient_of = [](size_t t, size_t i, int step, int rank) { return 100.0f * gradient(t, i, step, rank); };
  save.save_after = 4;  // mid-round 1: the anchor is still the initial one, some elements ~1e-8
  save.saved = &blobs;
  std::vector<std::vector<std::vector<float>>> params_at_save(2);
  save.at_step = [&](int step, int rank, Engine&, Rank& me) {
    if (step == 4) params_at_save[size_t(rank)] = me.params;
  };
  const auto straight = train(2, config, save);
  Plan resume;
  resume.gradient_of = save.gradient_of;
  resume.restore = &blobs;
  resume.first_step = 4;
  resume.at_step = [&](int step, int rank, Engine&, Rank& me) {
    if (step == 4) me.params = params_at_save[size_t(rank)];  // the rank's mid-round values
  };
  const auto resumed = train(2, config, resume);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(resumed[size_t(r)].failed, Status::Ok) << resumed[size_t(r)].failure;
    for (size_t t = 0; t < std::size(kShapes); ++t)
      EXPECT_EQ(resumed[size_t(r)].params[t], straight[size_t(r)].params[t])
          << (portable ? "portable" : "per rank") << " rank " << r << " " << kShapes[t].name;
  }
  }
}

// Saved at a boundary with the average in flight (steps 12 = 4 rounds of 3) and resumed.
std::vector<Rank> save_then_resume(int save_world, bool save_sharded, int load_world, bool load_sharded) {
  std::vector<std::vector<char>> blobs(static_cast<size_t>(save_world));
  Plan save;
  save.save_after = 12;
  save.saved = &blobs;
  save.portable = true;
  train(save_world, co2_config(save_sharded), save);
  Plan resume;
  resume.restore = &blobs;
  resume.first_step = 12;
  return train(load_world, co2_config(load_sharded), resume);
}

TEST(ShardedOuterState, CheckpointsMoveBetweenShardedAndReplicatedAndAcrossWorldSizes) {
  // The same world size, each direction: equal to staying in one mode.
  for (auto [from, to] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
    const auto reference = save_then_resume(2, false, 2, false);
    const auto moved = save_then_resume(2, from, 2, to);
    const std::string what = std::string(from ? "sharded" : "replicated") + " -> " + (to ? "sharded" : "replicated");
    expect_close(moved[0].anchor, reference[0].anchor, what);
    EXPECT_EQ(moved[0].stats.outer_updates, reference[0].stats.outer_updates) << what;
  }
  // Another world size: a sharded W = 2 blob resumes as sharded W = 3 like a replicated one.
  const auto reference = save_then_resume(2, false, 3, false);
  const auto moved = save_then_resume(2, true, 3, true);
  expect_bitwise_equal_across_ranks(moved, "W 2 -> 3");
  expect_close(moved[0].anchor, reference[0].anchor, "sharded W 2 -> sharded W 3");
}

// Hierarchical CO2, 2 nodes x 2 ranks (node = rank / 2), gradients averaged inside each node.
// BUFFER segments are not averaged by reduce_gradients: each rank's differ, and the boundary
// averages them inside the node (they move linearly, so that is the node-averaged update).
int node_of(int rank) { return rank / 2; }

Plan hierarchical_2x2() {
  Plan plan;
  plan.reduce_gradients = true;
  plan.configure = [](int rank, EngineConfig& c) {
    c.hierarchy = Hierarchy::Nodes;
    c.node_id = node_of(rank);
  };
  return plan;
}

// The same training as flat co2 over 2 ranks whose gradients are their node's average: checks
// it (every rank against its node's flat rank) and returns the hierarchical run.
std::vector<Rank> expect_equal_to_flat_over_the_nodes(const EngineConfig& config, const std::string& what) {
  Plan flat;
  flat.gradient_of = [](size_t t, size_t i, int step, int node) {
    return (gradient(t, i, step, 2 * node) + gradient(t, i, step, 2 * node + 1)) * 0.5f;
  };
  const auto h = train(4, config, hierarchical_2x2());
  const auto f = train(2, config, flat);
  for (const Rank& r : h) EXPECT_EQ(r.failed, Status::Ok) << what << ": " << r.failure;
  expect_bitwise_equal_across_ranks(h, what);
  expect_close(h[0].anchor, f[0].anchor, what + " anchor");
  for (int rank = 0; rank < 4; ++rank)
    for (size_t t = 0; t < std::size(kShapes); ++t)
      expect_close(h[size_t(rank)].params[t], f[size_t(node_of(rank))].params[t],
                   what + " rank " + std::to_string(rank) + " " + kShapes[t].name);
  EXPECT_EQ(h[0].stats.outer_updates, f[0].stats.outer_updates) << what;
  return h;
}

TEST(HierarchicalCo2, EqualsFlatCo2OverTheNodesAverageGradients) {
  const auto h = expect_equal_to_flat_over_the_nodes(co2_config(false), "hierarchical 2 x 2");
  size_t n = 0;
  for (const Shape& s : kShapes) n += s.count;
  EXPECT_LE(double(h[0].stats.outer_state_bytes) / double(n * sizeof(float)), 1.0 + 3.0 / 2 + 0.02);
}

// Norm clipping and the gap penalty: a segment's norm and its step's norm are sums over one
// node's shards (every node holds the same ones), so the clip scale and the gap history are flat
// co2's over the nodes. The history is checked through a checkpoint: resumed as flat co2 over
// the nodes, the run goes on as the flat one straight through (the penalty of the updates after
// the restore mixes the stored history with new steps).
TEST(HierarchicalCo2, NormClippingAndTheGapHistoryEqualFlatCo2OverTheNodes) {
  const EngineConfig config = with_policy(co2_config(false), Policy::GapNorm);
  const auto h = expect_equal_to_flat_over_the_nodes(config, "hierarchical 2 x 2, gap penalty, norm clipping");
  EXPECT_LT(h[0].stats.last_clip_scale_min, 1.0) << "nothing was clipped";
  Plan flat;
  flat.gradient_of = [](size_t t, size_t i, int step, int node) {
    return (gradient(t, i, step, 2 * node) + gradient(t, i, step, 2 * node + 1)) * 0.5f;
  };
  const auto straight = train(2, config, flat);
  std::vector<std::vector<char>> blobs(4);
  Plan save = hierarchical_2x2();
  save.save_after = 12;
  save.saved = &blobs;
  save.portable = true;  // to resume without hierarchy
  train(4, config, save);
  const std::vector<std::vector<char>> node_blobs = {blobs[0], blobs[2]};
  Plan resume = flat;
  resume.restore = &node_blobs;
  resume.first_step = 12;
  const auto resumed = train(2, config, resume);
  for (const Rank& r : resumed) ASSERT_EQ(r.failed, Status::Ok) << r.failure;
  expect_close(resumed[0].anchor, straight[0].anchor, "hierarchical checkpoint resumed flat");
  EXPECT_NEAR(resumed[0].stats.last_penalty_min, straight[0].stats.last_penalty_min, 1e-6);
}

// The same under the eager policy: a node's ranks share one offset, sharded like the anchor.
TEST(HierarchicalCo2, EagerEqualsFlatEagerCo2OverTheNodesAverageGradients) {
  EngineConfig config = co2_config(false);
  config.eager = Eager::On;
  for (bool nesterov : {true, false}) {
    config.nesterov = nesterov;
    expect_equal_to_flat_over_the_nodes(config, std::string("eager, nesterov ") + (nesterov ? "on" : "off"));
  }
  // Checkpoints keep the node's offsets: resumed at a boundary, the same as straight through.
  std::vector<std::vector<char>> blobs(4);
  Plan save = hierarchical_2x2();
  save.save_after = 12;
  save.saved = &blobs;
  const auto straight = train(4, config, save);
  Plan resume = hierarchical_2x2();
  resume.restore = &blobs;
  resume.first_step = 12;
  const auto resumed = train(4, config, resume);
  for (const Rank& r : resumed) ASSERT_EQ(r.failed, Status::Ok) << r.failure;
  expect_close(resumed[0].anchor, straight[0].anchor, "eager resumed");
  for (size_t t = 0; t < std::size(kShapes); ++t) expect_close(resumed[1].params[t], straight[1].params[t], "eager resumed params");
}

// Applying the average on arrival (a fixed step) with sharded outer state: flat sharding equals
// the replicated engine, hierarchical co2 equals flat co2 over the nodes, delayed and eager; and
// per-rank checkpoints saved with the average not yet applied resume bit for bit.
TEST(ShardedOuterState, ApplyOnArrivalEqualsTheReplicatedEngine) {
  for (Policy policy : {Policy::GapNorm, Policy::Eager, Policy::EagerNoMomentum}) {
    EngineConfig replicated = with_policy(co2_config(false), policy);
    replicated.apply_step = 2;
    EngineConfig sharded = with_policy(co2_config(true), policy);
    sharded.apply_step = 2;
    const std::string what = "apply_step 2, policy " + std::to_string(int(policy));
    const auto a = train(3, replicated, Plan{});
    const auto b = train(3, sharded, Plan{});
    expect_bitwise_equal_across_ranks(b, what);
    expect_close(b[0].anchor, a[0].anchor, what + " anchor");
    for (int r = 0; r < 3; ++r)
      for (size_t t = 0; t < std::size(kShapes); ++t)
        expect_close(b[size_t(r)].params[t], a[size_t(r)].params[t], what + " rank " + std::to_string(r) + " " + kShapes[t].name);
    EXPECT_EQ(b[0].stats.arrival_updates, a[0].stats.arrival_updates) << what;
    EXPECT_GT(b[0].stats.arrival_updates, 3u) << what;
  }
}

TEST(HierarchicalCo2, ApplyOnArrivalEqualsFlatCo2OverTheNodes) {
  for (Eager eager : {Eager::Off, Eager::On}) {
    EngineConfig config = co2_config(false);
    config.eager = eager;
    config.apply_step = 1;
    const auto h = expect_equal_to_flat_over_the_nodes(config, std::string("apply_step 1, eager ") +
                                                                   (eager == Eager::On ? "on" : "off"));
    EXPECT_GT(h[0].stats.arrival_updates, 3u);
  }
}

TEST(ShardedOuterState, ApplyOnArrivalCheckpointsResumeBitForBit) {
  for (bool hierarchical : {false, true})
    for (Eager eager : {Eager::Off, Eager::On}) {
      EngineConfig config = co2_config(!hierarchical);
      config.eager = eager;
      config.apply_step = 2;
      const std::string what = std::string(hierarchical ? "hierarchical" : "flat") + (eager == Eager::On ? " eager" : "");
      const int world = hierarchical ? 4 : 2;
      std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
      Plan save = hierarchical ? hierarchical_2x2() : Plan{};
      save.save_after = 12;  // a boundary: the average in flight, applied at step 2 of the round
      save.saved = &blobs;
      const auto straight = train(world, config, save);
      Plan resume = hierarchical ? hierarchical_2x2() : Plan{};
      resume.restore = &blobs;
      resume.first_step = 12;
      const auto resumed = train(world, config, resume);
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(resumed[size_t(r)].failed, Status::Ok) << what << ": " << resumed[size_t(r)].failure;
        EXPECT_EQ(resumed[size_t(r)].anchor, straight[size_t(r)].anchor) << what << " rank " << r;
        for (size_t t = 0; t < std::size(kShapes); ++t)
          EXPECT_EQ(resumed[size_t(r)].params[t], straight[size_t(r)].params[t]) << what << " rank " << r << " " << kShapes[t].name;
      }
    }
}

TEST(HierarchicalCo2, RanksOfANodeThatTrainDifferentModelsFailLoudly) {
  Plan plan = hierarchical_2x2();
  plan.reduce_gradients = false;  // no intra-node average: each rank follows its own gradients
  const auto h = train(4, co2_config(false), plan);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(h[size_t(rank)].failed, Status::Ok) << "rank " << rank << " trained on";
    if (h[size_t(rank)].failed == Status::AnchorMismatch) {
      EXPECT_NE(h[size_t(rank)].failure.find("averaged inside the node"), std::string::npos) << h[size_t(rank)].failure;
    }
  }
  EXPECT_TRUE(std::any_of(h.begin(), h.end(), [](const Rank& r) { return r.failed == Status::AnchorMismatch; }));
}

// A node's link across the nodes fails alone (rank 0's inter-node communicator, aborted right
// after a boundary, while or after that boundary's chain runs; or mid-round, with nothing of it
// in flight): the rest of the chain does not run on a partly reduced shard, and every rank fails
// with that link's error at its next engine call, through the engine alone (no rank aborts its
// own communicator here), well within the communicators' timeout.
TEST(HierarchicalCo2, AFailedInterNodeLinkFailsTheEngineOnEveryRank) {
  for (int abort_after : {8, 10}) {
    Plan plan = hierarchical_2x2();
    plan.abort_group_on_error = false;
    plan.after_step = [abort_after](int step, int rank, bool, Engine& engine) {
      if (step == abort_after && rank == 0) engine.node_communicator_for_testing(/*inter=*/true)->abort();
    };
    const auto h = train(4, co2_config(false), plan);
    for (int rank = 0; rank < 4; ++rank) {
      const Rank& r = h[size_t(rank)];
      const std::string what = "aborted after step " + std::to_string(abort_after) + ", rank " + std::to_string(rank);
      EXPECT_TRUE(r.failed == Status::Aborted || r.failed == Status::PeerLost)
          << what << ": status " << int(r.failed) << ": " << r.failure;
      EXPECT_NE(r.failure.find("communicator aborted on rank 0"), std::string::npos)
          << what << " does not name the failed link: " << r.failure;
    }
  }
}

// state_size of a sharded or hierarchical engine (whose full-size copies exist only during a
// save) with an average in flight is the size of the blob save writes; under UBSan
// (CO2_SANITIZE=1) it also proves that counting forms no pointer into an absent buffer.
TEST(ShardedOuterState, StateSizeIsTheSizeOfTheSavedBlob) {
  for (bool hierarchical : {false, true}) {
    Plan plan = hierarchical ? hierarchical_2x2() : Plan{};
    std::vector<size_t> counted(4, 0), written(4, 0);
    plan.after_step = [&](int step, int rank, bool boundary, Engine& engine) {
      if (!boundary || step != 5) return;
      counted[size_t(rank)] = engine.state_size();
      engine.save([&](const void*, size_t length) {
        written[size_t(rank)] += length;
        return true;
      });
    };
    const auto ranks = train(4, co2_config(!hierarchical), plan);
    for (int rank = 0; rank < 4; ++rank) {
      ASSERT_EQ(ranks[size_t(rank)].failed, Status::Ok) << ranks[size_t(rank)].failure;
      EXPECT_GT(counted[size_t(rank)], 0u);
      EXPECT_EQ(counted[size_t(rank)], written[size_t(rank)]) << (hierarchical ? "hierarchical" : "sharded")
                                                               << " rank " << rank;
    }
  }
}

// Saved while a refused (non-finite) average is in flight (a NaN delta at the last step of round
// 3, step 8, saved after that boundary) and restored by the same engine kind: the restored run refuses
// that average at the same boundary and then trains on exactly as the run that never stopped,
// with a finite model (the blob marks the refusal with a NaN in its average slot, which must
// never become the anchor).
TEST(ShardedOuterState, ARefusedAverageSavedInFlightIsRefusedAgainAfterARestore) {
  for (bool hierarchical : {false, true}) {
    const std::string what = hierarchical ? "hierarchical 2 x 2" : "sharded W 4";
    Plan straight = hierarchical ? hierarchical_2x2() : Plan{};
    straight.before_step = [hierarchical](int step, int rank, std::vector<std::vector<float>>& p) {
      // Hierarchical: both ranks of node 0, whose parameters stay equal (the shard owning
      // element 500 sends it).
      if (step == 8 && (hierarchical ? node_of(rank) == 0 : rank == 1)) p[0][500] = std::nanf("");
    };
    std::vector<std::vector<char>> blobs(4);
    straight.save_after = 9;
    straight.saved = &blobs;
    const EngineConfig config = co2_config(!hierarchical);
    const auto a = train(4, config, straight);
    Plan resume = hierarchical ? hierarchical_2x2() : Plan{};
    resume.restore = &blobs;
    resume.first_step = 9;
    const auto b = train(4, config, resume);
    for (int rank = 0; rank < 4; ++rank) {
      ASSERT_EQ(a[size_t(rank)].failed, Status::Ok) << what << ": " << a[size_t(rank)].failure;
      ASSERT_EQ(b[size_t(rank)].failed, Status::Ok) << what << ": " << b[size_t(rank)].failure;
      EXPECT_EQ(a[size_t(rank)].nonfinite_steps, std::vector<int>{11}) << what << " rank " << rank;
      EXPECT_EQ(b[size_t(rank)].nonfinite_steps, std::vector<int>{11}) << what << " rank " << rank;
      for (float x : b[size_t(rank)].anchor) ASSERT_TRUE(std::isfinite(x)) << what << " rank " << rank;
    }
    expect_bitwise_equal_across_ranks(b, what + " resumed");
    expect_close(b[0].anchor, a[0].anchor, what + " resumed after a refused average");
  }
}

// An automatic beta counts the outer participants: 8 nodes of 4 ranks resolve beta for 8 (0.0),
// not for 32 ranks (0.2), at commit and again when a checkpoint is restored.
TEST(HierarchicalCo2, AutomaticBetaCountsNodesAlsoAfterARestore) {
  EngineConfig config = co2_config(false);
  config.outer_momentum = -1.0;
  Plan save;
  save.reduce_gradients = true;
  save.steps = 6;
  save.save_after = 3;
  std::vector<std::vector<char>> blobs(32);
  save.saved = &blobs;
  save.configure = [](int rank, EngineConfig& c) {
    c.hierarchy = Hierarchy::Nodes;
    c.node_id = rank / 4;
  };
  // A node's ranks must move together: every rank of node n takes rank 4n's gradients.
  save.gradient_of = [](size_t t, size_t i, int step, int rank) { return gradient(t, i, step, rank / 4); };
  const auto saved = train(32, config, save);
  ASSERT_EQ(saved[0].failed, Status::Ok) << saved[0].failure;
  EXPECT_EQ(saved[0].stats.resolved_outer_momentum, default_outer_momentum(8));
  EXPECT_NE(default_outer_momentum(8), default_outer_momentum(32));
  Plan resume = save;
  resume.save_after = -1;
  resume.saved = nullptr;
  resume.restore = &blobs;
  resume.first_step = 3;
  const auto resumed = train(32, config, resume);
  ASSERT_EQ(resumed[0].failed, Status::Ok) << resumed[0].failure;
  EXPECT_EQ(resumed[0].stats.resolved_outer_momentum, default_outer_momentum(8));
}

// consensus(ANCHOR) pairs no collective under sharding or hierarchy (issue 23, 5): one rank
// evaluates alone mid-round and gets the anchor its next boundary starts from (the average in
// flight applied), bitwise; every rank then trains on exactly as without the evaluation.
void expect_consensus_of_one_rank_is_local(int world, const EngineConfig& config, Plan plan, const std::string& what) {
  const int evaluator = world - 1;
  std::vector<float> seen, next_start;
  plan.at_step = [&](int step, int rank, Engine& engine, Rank& me) {
    if (rank != evaluator) return;
    if (step == 7) {  // mid-round: the average of boundary 2 (after step 5) is in flight
      seen.assign(engine.num_elements(), std::nanf(""));
      engine.consensus(ConsensusKind::Anchor, seen.data(), seen.size());
    }
    if (step == 9)  // after the boundary of step 8: the parameters took the anchor
      for (const auto& tensor : me.params) next_start.insert(next_start.end(), tensor.begin(), tensor.end());
  };
  const auto evaluated = train(world, config, plan);
  plan.at_step = nullptr;
  const auto plain = train(world, config, plan);
  for (const Rank& r : evaluated) ASSERT_EQ(r.failed, Status::Ok) << what << ": " << r.failure;
  ASSERT_EQ(seen.size(), next_start.size()) << what;
  EXPECT_EQ(std::memcmp(seen.data(), next_start.data(), seen.size() * sizeof(float)), 0)
      << what << ": consensus(ANCHOR) is not the anchor the next boundary starts from";
  for (size_t r = 0; r < evaluated.size(); ++r)
    for (size_t t = 0; t < std::size(kShapes); ++t)
      EXPECT_EQ(evaluated[r].params[t], plain[r].params[t]) << what << ": rank " << r << " " << kShapes[t].name;
}

TEST(ShardedOuterState, ConsensusOfTheAnchorOnOneRankNeedsNoCollective) {
  expect_consensus_of_one_rank_is_local(2, co2_config(true), Plan{}, "sharded W 2");
  expect_consensus_of_one_rank_is_local(3, with_policy(co2_config(true), Policy::GapNorm), Plan{}, "sharded W 3, gap/norm");
}

// A sharded save writes the replicated format without a full-size copy of the anchor (or of the
// momentum, the node's offsets): one segment at a time from the shards (issue 23, 11). What it
// writes is checked by the checkpoint tests around (sharded <-> replicated, other W, eager).
TEST(ShardedOuterState, SaveHoldsNoFullSizeCopyOfTheShardedState) {
  for (bool hierarchical : {false, true}) {
    std::vector<std::vector<char>> blobs(4);
    Plan plan = hierarchical ? hierarchical_2x2() : Plan{};
    plan.save_after = 12;
    plan.saved = &blobs;
    plan.portable = true;
    EngineConfig config = co2_config(!hierarchical);
    config.eager = Eager::On;
    const std::string what = hierarchical ? "hierarchical" : "flat sharded";
    const auto straight = train(hierarchical ? 4 : 2, config, plan);
    for (const Rank& r : straight) {
      ASSERT_EQ(r.failed, Status::Ok) << r.failure;
      EXPECT_FALSE(r.full_anchor_while_saving) << what;
    }
    Plan resume = hierarchical ? hierarchical_2x2() : Plan{};
    resume.restore = &blobs;
    resume.first_step = 12;
    const auto resumed = train(hierarchical ? 4 : 2, config, resume);
    ASSERT_EQ(resumed[0].failed, Status::Ok) << resumed[0].failure;
    expect_close(resumed[0].anchor, straight[0].anchor, what + " resumed");
    for (size_t t = 0; t < std::size(kShapes); ++t)
      expect_close(resumed[1].params[t], straight[1].params[t], what + " resumed " + kShapes[t].name);
  }
}

TEST(HierarchicalCo2, ConsensusOfTheAnchorOnOneRankNeedsNoCollective) {
  expect_consensus_of_one_rank_is_local(4, co2_config(false), hierarchical_2x2(), "hierarchical 2 x 2");
}

TEST(ShardedOuterState, RefusesWhatItDoesNotImplementNamingIt) {
  auto group = make_group(1);
  for (auto change : std::vector<std::function<void(EngineConfig&)>>{
           [](EngineConfig& c) { c.algorithm = Algorithm::Diloco; }}) {
    EngineConfig c = co2_config(true);
    change(c);
    try {
      Engine engine(group[0], c);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("shard"), std::string::npos) << e.what();
    }
  }
}

// --- the per-rank checkpoint of a sharded engine (issue 23, 11) ---

// Rank threads meet here (C++17 has no std::barrier).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int count_, arrived_ = 0;
  uint64_t generation_ = 0;
};

struct CheckpointMemory {
  size_t state_floats = 0;  // PARAMETER + BUFFER elements (N)
  size_t save_extra = 0;    // floats of FloatBuffers the save added at its peak, per rank
  size_t load_extra = 0;    // ... the load
  size_t blob_bytes = 0;    // rank 0's blob
  std::vector<float> anchor_before, anchor_after;  // rank 0's consensus(ANCHOR)
};

// W rank threads train co2 (momentum, the average in flight at the save) over a PARAMETER
// tensor of `trained` elements and a BUFFER of 9, save (per rank, or portable), and load the
// blobs back into the same engines. The FloatBuffers of every rank together are measured from
// a quiet point (every rank at a barrier) to the next, divided by W.
CheckpointMemory measure_checkpoint(int world, bool hierarchical, size_t trained, bool portable) {
  auto group = make_group(world);
  Barrier barrier(world);
  CheckpointMemory out;
  std::vector<std::string> failures(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        EngineConfig config = co2_config(true);
        if (hierarchical) {
          config.hierarchy = Hierarchy::Nodes;
          config.node_id = rank / 2;
        }
        Engine engine(group[size_t(rank)], config);
        std::vector<std::vector<float>> params{std::vector<float>(trained), std::vector<float>(9)};
        for (size_t t = 0; t < 2; ++t) {
          for (size_t i = 0; i < params[t].size(); ++i) params[t][i] = 0.01f * float(i % 89) - 0.4f;
          TensorDesc desc;
          desc.name = t == 0 ? "w" : "stats";
          desc.data = params[t].data();
          desc.count = params[t].size();
          desc.role = int(t);
          engine.register_tensor(desc);
        }
        engine.commit();
        for (int step = 0; step < 12; ++step) {  // 4 boundaries of tau 3: an average in flight
          for (auto& p : params)
            for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.05f * (gradient(0, i, step, 0) + 0.5f * p[i]);
          engine.step(nullptr);
        }
        std::vector<char> blob;
        const WriteFn write = [&](const void* data, size_t length) {
          blob.insert(blob.end(), static_cast<const char*>(data), static_cast<const char*>(data) + length);
          return true;
        };
        size_t base = 0;
        const auto quiet_start = [&] {
          barrier.wait();
          if (rank == 0) {
            base = FloatBuffer::floats_in_use();
            FloatBuffer::reset_peak();
          }
          barrier.wait();
        };
        const auto quiet_end = [&](size_t* extra) {
          barrier.wait();
          if (rank == 0) *extra = (FloatBuffer::peak_floats() - base) / size_t(world);
          barrier.wait();
        };
        quiet_start();
        if (portable)
          engine.save_portable(write);
        else
          engine.save(write);
        quiet_end(&out.save_extra);
        if (rank == 0) {
          out.state_floats = engine.num_elements();
          out.blob_bytes = blob.size();
          out.anchor_before.resize(engine.num_elements());
          engine.consensus(ConsensusKind::Anchor, out.anchor_before.data(), out.anchor_before.size());
        }
        size_t offset = 0;
        quiet_start();
        engine.load([&](void* data, size_t length) {
          if (offset + length > blob.size()) return false;
          std::memcpy(data, blob.data() + offset, length);
          offset += length;
          return true;
        });
        quiet_end(&out.load_extra);
        if (rank == 0) {
          out.anchor_after.resize(engine.num_elements());
          engine.consensus(ConsensusKind::Anchor, out.anchor_after.data(), out.anchor_after.size());
        }
        engine.finalize();
      } catch (const Error& e) {
        failures[size_t(rank)] = e.what();
        group[size_t(rank)]->abort();
      }
    });
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world; ++rank) EXPECT_EQ(failures[size_t(rank)], "") << "rank " << rank;
  return out;
}

// A sharded engine's save writes this rank's shard without any full-size buffer, and its load
// reads the shards back with only shard-size buffers (the anchor, momentum and collected next
// anchor of this rank's shard): peak N + O(N / W). A portable blob's load keeps only the
// shards too (before, it held the full anchor, momentum and average). The state comes back bit
// for bit.
TEST(ShardedOuterState, SavesAndLoadsItsOwnShardWithoutAFullSizeCopy) {
  for (bool portable : {false, true})
  for (auto [world, hierarchical] : {std::pair{2, false}, std::pair{4, false}, std::pair{4, true}}) {
    const std::string what = std::string(portable ? "portable" : "per rank") + " W=" + std::to_string(world) +
                             (hierarchical ? " hierarchical" : " flat");
    const CheckpointMemory m = measure_checkpoint(world, hierarchical, 1003, portable);
    const size_t shards = hierarchical ? 2 : size_t(world);
    const size_t shard = (m.state_floats + shards - 1) / shards;
    if (!portable) { EXPECT_EQ(m.save_extra, 0u) << what; }
    EXPECT_LE(m.load_extra, 3 * shard) << what << ": the load held more than 3 shards (N = " << m.state_floats << ")";
    if (!portable) {
      EXPECT_LE(m.blob_bytes, 3 * shard * sizeof(float) + 512) << what << ": the blob holds more than the shard";
    }
    ASSERT_EQ(m.anchor_after.size(), m.anchor_before.size()) << what;
    EXPECT_EQ(std::memcmp(m.anchor_after.data(), m.anchor_before.data(), m.anchor_before.size() * sizeof(float)), 0)
        << what << ": the anchor did not come back bit for bit";
  }
}

// Per-rank blobs saved at a boundary with the average in flight resume bit for bit, under every
// policy with per-rank or sharded state: norm clipping and the gap penalty, the eager policy
// (flat: each rank's round start; hierarchical: the node's offsets) and error feedback (each
// rank's residual).
TEST(ShardedOuterState, PerRankCheckpointsResumeBitForBit) {
  for (bool hierarchical : {false, true})
    for (int variant = 0; variant < 3; ++variant) {
      EngineConfig config = with_policy(co2_config(!hierarchical), variant == 0 ? Policy::GapNorm : Policy::Eager);
      if (variant == 2) {
        config.eager = Eager::Off;
        config.wire_format = WireFormat::Int8;
        config.error_feedback = true;
      }
      const std::string what = std::string(hierarchical ? "hierarchical" : "flat") + " variant " + std::to_string(variant);
      const int world = hierarchical ? 4 : 2;
      std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
      Plan save = hierarchical ? hierarchical_2x2() : Plan{};
      save.save_after = 12;
      save.saved = &blobs;
      const auto straight = train(world, config, save);
      Plan resume = hierarchical ? hierarchical_2x2() : Plan{};
      resume.restore = &blobs;
      resume.first_step = 12;
      const auto resumed = train(world, config, resume);
      for (int r = 0; r < world; ++r) {
        ASSERT_EQ(resumed[size_t(r)].failed, Status::Ok) << what << ": " << resumed[size_t(r)].failure;
        EXPECT_EQ(resumed[size_t(r)].anchor, straight[size_t(r)].anchor) << what << " rank " << r;
        for (size_t t = 0; t < std::size(kShapes); ++t)
          EXPECT_EQ(resumed[size_t(r)].params[t], straight[size_t(r)].params[t]) << what << " rank " << r << " " << kShapes[t].name;
      }
    }
}

// The numbers of docs/algorithm.md ("Checkpoints of sharded engines"), N = 4M: run with
// --gtest_also_run_disabled_tests.
TEST(ShardedOuterState, DISABLED_CheckpointPeakMemoryAtFourMillion) {
  for (bool portable : {false, true})
    for (int world : {2, 4}) {
      const CheckpointMemory m = measure_checkpoint(world, false, (size_t(4) << 20) - 9, portable);
      std::printf("%s W=%d N=%zu: save +%zu floats (%.3f N), load +%zu floats (%.3f N), blob %zu bytes\n",
                  portable ? "portable" : "per rank", world, m.state_floats, m.save_extra,
                  double(m.save_extra) / double(m.state_floats), m.load_extra,
                  double(m.load_extra) / double(m.state_floats), m.blob_bytes);
    }
}

// Per-rank blobs, then a load where one rank's blob is bad: every rank fails (none loads, none
// waits for a timeout), the bad rank with its reason, the others naming that rank.
TEST(ShardedOuterState, OneRanksBadShardFailsTheLoadOnEveryRank) {
  std::vector<std::vector<char>> blobs(2);
  Plan save;
  save.save_after = 12;
  save.saved = &blobs;
  for (const Rank& r : train(2, co2_config(true), save)) ASSERT_EQ(r.failed, Status::Ok) << r.failure;
  // Rank 1's first anchor element: after the header (172 bytes with the shard's fields) and
  // segment w's record (41 bytes), inside rank 1's part of w.
  constexpr size_t kAnchorAt = 172 + 41;
  ASSERT_EQ(blobs[1][176], 'w');
  struct Case {
    const char* what;
    std::function<void(std::vector<std::vector<char>>&)> spoil;
    Status bad_rank, other_rank;
  };
  const auto fix_crc = [](std::vector<char>& blob) {
    const uint32_t crc = crc32_update(0, blob.data(), blob.size() - 12);
    std::memcpy(blob.data() + blob.size() - 12, &crc, sizeof crc);
  };
  const Case cases[] = {
      {"a flipped byte", [](auto& b) { b[1][kAnchorAt + 1] ^= 0x10; }, Status::CheckpointCorrupt,
       Status::CheckpointCorrupt},
      {"a non-finite anchor element (CRC valid)",
       [&](auto& b) {
         const float nan = std::nanf("");
         std::memcpy(b[1].data() + kAnchorAt, &nan, sizeof nan);
         fix_crc(b[1]);
       },
       Status::CheckpointCorrupt, Status::CheckpointCorrupt},
      {"rank 0's shard on rank 1", [](auto& b) { b[1] = b[0]; }, Status::CheckpointMismatch,
       Status::CheckpointMismatch},
      {"a read callback that fails at once", [](auto& b) { b[1].clear(); }, Status::Callback, Status::Callback},
  };
  for (const Case& c : cases) {
    auto spoiled = blobs;
    c.spoil(spoiled);
    Plan resume;
    resume.restore = &spoiled;
    resume.first_step = 12;
    resume.abort_group_on_error = false;  // each rank learns it from its own load
    const auto ranks = train(2, co2_config(true), resume);
    EXPECT_EQ(ranks[1].failed, c.bad_rank) << c.what << ": " << ranks[1].failure;
    EXPECT_EQ(ranks[0].failed, c.other_rank) << c.what << ": " << ranks[0].failure;
    EXPECT_NE(ranks[0].failure.find("rank 1 could not load"), std::string::npos) << c.what << ": " << ranks[0].failure;
  }
  // A shard in an engine that does not shard, or at another W: refused, naming the way out.
  Plan resume;
  resume.restore = &blobs;
  resume.first_step = 12;
  resume.abort_group_on_error = false;  // every rank fails at its own load
  for (const auto& [world, sharded] : {std::pair{2, false}, std::pair{3, true}}) {
    const auto ranks = train(world, co2_config(sharded), resume);
    EXPECT_EQ(ranks[0].failed, Status::CheckpointMismatch) << ranks[0].failure;
    EXPECT_NE(ranks[0].failure.find("co2_engine_save_portable"), std::string::npos) << ranks[0].failure;
  }
}

}  // namespace
}  // namespace co2

// Elastic membership of a group of threads (the local transport, runtime/group/local_membership.*):
// threads join a running group and leave it again, many times in one run, and a thread whose
// request is not admitted fails with a status that names why, without changing the group.
// The fp64 reference of one join and one leave is in engine_math_test.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;

namespace {

using Clock = std::chrono::steady_clock;

// Waits (bounded) until `flag` is set; false when it never was.
bool wait_for(const std::atomic<bool>& flag, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto deadline = Clock::now() + limit;
  while (!flag.load() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return flag.load();
}

co2_engine_config_t engine_config(bool sharded = false) {
  co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
  cfg.tau = 3;
  cfg.outer_momentum = 0.5;
  cfg.shard_outer_state = sharded;
  return cfg;
}

// Two members train; five times a thread joins, trains a few steps and leaves again with
// co2_engine_leave. Every change reaches every member at the same step, the joiners and the
// members see the sizes they should, and the members end with one model.
void join_and_leave_five_times(bool sharded) {
  const int members = 2, cycles = 5;
  const uint64_t cycle_steps = 40, total_steps = cycle_steps * (cycles + 1);
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, members + cycles, 17);
  const std::string group = unique_group_name();
  CommOptions options;
  options.elastic_min_ranks = 1;
  std::vector<std::atomic<bool>> asking(cycles);
  std::atomic<int> members_at_cycle{0};
  std::vector<std::vector<uint64_t>> changes(members);
  std::vector<std::vector<float>> final_state(members);
  std::vector<int32_t> joined_as_size(cycles, 0);
  std::vector<int> joiner_status(cycles, -1);

  run_threads(members + cycles, [&](int thread) {
    co2_comm_t comm = nullptr;
    if (thread >= members) {  // joiner c: asks once the members reached its cycle
      const int c = thread - members;
      const auto deadline = Clock::now() + std::chrono::seconds(60);
      while (members_at_cycle.load() <= c && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_GT(members_at_cycle.load(), c) << "the members never reached cycle " << c;
      asking[size_t(c)] = true;
      ASSERT_EQ(create_comm(group, 0, 1, &comm, options), CO2_OK) << co2_last_error_message();
      {
        LocalModel model(layout, data, thread);
        EngineGuard eg;
        co2_engine_config_t cfg = engine_config(sharded);
        CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
        CO2_ASSERT_OK(model.register_with(eg.engine));
        CO2_ASSERT_OK(co2_engine_commit(eg.engine));
        CO2_ASSERT_OK(co2_comm_size(comm, &joined_as_size[size_t(c)]));
        uint64_t k = get_stats(eg.engine).steps;
        const uint64_t leave_at = k + 5;
        co2_status_t s = CO2_OK;
        for (; s == CO2_OK && k < total_steps; ++k) {
          if (k == leave_at) CO2_ASSERT_OK(co2_engine_leave(eg.engine));
          model.inner_step(k);
          s = co2_engine_step(eg.engine, nullptr, nullptr);
        }
        joiner_status[size_t(c)] = s;
      }
      co2_comm_destroy(comm);
      return;
    }
    ASSERT_EQ(create_comm(group, thread, members, &comm, options), CO2_OK) << co2_last_error_message();
    {
      LocalModel model(layout, data, thread);
      EngineGuard eg;
      co2_engine_config_t cfg = engine_config(sharded);
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      for (uint64_t k = 0; get_stats(eg.engine).steps < total_steps; ++k) {
        model.inner_step(k);
        const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
        const uint64_t steps = get_stats(eg.engine).steps;
        if (s != CO2_OK) {
          ASSERT_EQ(s, CO2_MEMBERSHIP_CHANGED) << co2_last_error_message();
          changes[size_t(thread)].push_back(steps);
          k = steps - 1;  // the step count is the group's
        }
        // At the start of cycle c the members wait until joiner c asked (so that it is admitted
        // while they train); rank 0 lets it go.
        if (steps % cycle_steps == 1 && steps / cycle_steps < uint64_t(cycles)) {
          const int c = int(steps / cycle_steps);
          if (thread == 0) members_at_cycle = c + 1;
          ASSERT_TRUE(wait_for(asking[size_t(c)])) << "joiner " << c << " never asked";
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its request is at the door
        }
      }
      CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
      final_state[size_t(thread)] = model.gather_state();
      int32_t size = 0;
      CO2_ASSERT_OK(co2_comm_size(comm, &size));
      EXPECT_EQ(size, members);
    }
    co2_comm_destroy(comm);
  });
  if (::testing::Test::HasFailure()) return;
  ASSERT_EQ(changes[0].size(), size_t(2 * cycles)) << "a join and a leave per cycle";
  EXPECT_EQ(changes[0], changes[1]) << "the members saw the changes at different steps";
  for (int c = 0; c < cycles; ++c) {
    EXPECT_EQ(joined_as_size[size_t(c)], members + 1) << "joiner " << c;
    EXPECT_EQ(joiner_status[size_t(c)], CO2_LEFT) << "joiner " << c;
  }
  ASSERT_EQ(final_state[0].size(), final_state[1].size());
  for (size_t i = 0; i < final_state[0].size(); ++i)
    ASSERT_EQ(final_state[0][i], final_state[1][i]) << "the members differ at element " << i;
}

TEST(LocalElastic, ThreadsJoinAndLeaveFiveTimesInOneRun) { join_and_leave_five_times(false); }

// The same with the outer state sharded: each change gathers the shards and cuts them anew.
TEST(LocalElastic, ThreadsJoinAndLeaveFiveTimesWithShardedOuterState) { join_and_leave_five_times(true); }

// A thread that asks to join a group which then finishes without admitting it fails at once
// (the group's end closes the door), not after its timeout.
TEST(LocalElastic, AJoinerOfAGroupThatEndsFailsAtOnce) {
  const std::string group = unique_group_name();
  CommOptions options;
  options.elastic_min_ranks = 1;
  std::atomic<bool> asking{false};
  co2_status_t joined = CO2_OK;
  std::string message;
  double waited_s = 0.0;
  run_threads(3, [&](int thread) {
    co2_comm_t comm = nullptr;
    if (thread == 2) {
      ASSERT_TRUE(wait_for(asking));
      const auto start = Clock::now();
      joined = create_comm(group, 0, 1, &comm, options);
      waited_s = std::chrono::duration<double>(Clock::now() - start).count();
      message = co2_last_error_message();
      if (comm) co2_comm_destroy(comm);
      return;
    }
    ASSERT_EQ(create_comm(group, thread, 2, &comm, options), CO2_OK) << co2_last_error_message();
    if (thread == 0) asking = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the request is at the door
    co2_comm_destroy(comm);
  });
  EXPECT_EQ(joined, CO2_ERR_RENDEZVOUS) << message;
  EXPECT_NE(message.find("ended before it admitted"), std::string::npos) << message;
  EXPECT_LT(waited_s, 30.0) << "the joiner waited for its timeout";
}

// A joiner that gives up (its timeout) before the members reach a boundary withdraws its request:
// the members count it at their next boundary, admit nobody and train on unchanged.
TEST(LocalElastic, AJoinerThatGaveUpLeavesTheGroupAsItWas) {
  const int members = 2;
  const uint64_t total_steps = 30;
  const Layout layout = layout_mixed();
  const Data data = make_data(layout, members, 23);
  const std::string group = unique_group_name();
  CommOptions options;
  options.elastic_min_ranks = 1;
  std::atomic<bool> members_waiting{false}, joiner_gave_up{false};
  co2_status_t joined = CO2_OK;
  std::string message;
  std::vector<int> changes(members, 0);
  std::vector<std::vector<float>> final_state(members);
  run_threads(members + 1, [&](int thread) {
    co2_comm_t comm = nullptr;
    if (thread == members) {
      ASSERT_TRUE(wait_for(members_waiting));
      CommOptions impatient = options;
      impatient.timeout_ms = 300;
      joined = create_comm(group, 0, 1, &comm, impatient);
      message = co2_last_error_message();
      if (comm) co2_comm_destroy(comm);
      joiner_gave_up = true;
      return;
    }
    ASSERT_EQ(create_comm(group, thread, members, &comm, options), CO2_OK) << co2_last_error_message();
    {
      LocalModel model(layout, data, thread);
      EngineGuard eg;
      co2_engine_config_t cfg = engine_config();
      CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
      CO2_ASSERT_OK(model.register_with(eg.engine));
      CO2_ASSERT_OK(co2_engine_commit(eg.engine));
      for (uint64_t k = 0; k < total_steps; ++k) {
        if (k == 2) {  // mid-round: no boundary while the joiner waits
          if (thread == 0) members_waiting = true;
          ASSERT_TRUE(wait_for(joiner_gave_up));
        }
        model.inner_step(k);
        const co2_status_t s = co2_engine_step(eg.engine, nullptr, nullptr);
        if (s == CO2_MEMBERSHIP_CHANGED) ++changes[size_t(thread)];
        else CO2_ASSERT_OK(s);
      }
      CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
      final_state[size_t(thread)] = model.gather_state();
      int32_t size = 0;
      CO2_ASSERT_OK(co2_comm_size(comm, &size));
      EXPECT_EQ(size, members);
    }
    co2_comm_destroy(comm);
  });
  EXPECT_EQ(joined, CO2_ERR_RENDEZVOUS) << message;
  EXPECT_NE(message.find("did not admit this thread"), std::string::npos) << message;
  EXPECT_EQ(changes, std::vector<int>(members, 0));
  ASSERT_EQ(final_state[0].size(), final_state[1].size());
  for (size_t i = 0; i < final_state[0].size(); ++i)
    ASSERT_EQ(final_state[0][i], final_state[1][i]) << "the members differ at element " << i;
}

}  // namespace

namespace {

// Hierarchical co2 is not elastic: refused at commit, naming the way out, on every rank alike.
TEST(LocalElastic, HierarchicalCo2IsRefusedInAnElasticGroupNamingIt) {
  CommOptions options;
  options.elastic_min_ranks = 1;
  options.ranks_per_node = 1;
  run_ranks(2, [&](int, co2_comm_t comm) {
    co2_engine_config_t cfg = engine_config();
    cfg.hierarchy = CO2_HIERARCHY_NODES;
    EngineGuard eg;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    std::vector<float> weights(64, 1.0f);
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.data = weights.data();
    tensor.count = weights.size();
    CO2_ASSERT_OK(co2_engine_register_tensor(eg.engine, &tensor));
    EXPECT_EQ(co2_engine_commit(eg.engine), CO2_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(co2_last_error_message()).find("CO2_HIERARCHY_FLAT"), std::string::npos)
        << co2_last_error_message();
  }, options);
}

}  // namespace

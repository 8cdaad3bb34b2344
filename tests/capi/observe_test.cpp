// Observability through the C API (docs/observability.md): the hidden fraction in the
// statistics, the tau advice agreed across ranks, and the CO2_TRACE file of each rank. The trace's
// content and the log line are checked with real processes (multiprocess/observe_test.py).
//
// Its own executable: the slowed local transport (CO2_LOCAL_TEST_BANDWIDTH) and CO2_TRACE are
// set in-process. No timed upper bound: a slowed link makes an all-reduce at least
// payload / bandwidth long and a sleep lasts at least its length, whatever the machine's load.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"
#include "synthetic.hpp"

using namespace co2test;
using namespace std::chrono;

namespace {

// 128 KiB of fp32: above the control lane's 64 KiB, small enough that a step's own work stays
// far below its sleep, even under ThreadSanitizer.
constexpr size_t kCount = 32768;
constexpr double kBandwidth = 2e6;  // bytes/s per directed link: one all-reduce >= 65 ms

struct Training {
  co2_algorithm_t algorithm = CO2_ALGO_CO2;
  int tau = 2;
  int rounds = 6;
  int world = 2;
  bool slow_link = false;
  // Milliseconds rank r sleeps per step: base + r * per_rank.
  int sleep_ms = 1;
  int sleep_per_rank_ms = 0;
};

struct Trained {
  std::vector<co2_engine_stats_t> before_finalize;  // training only (finalize waits for the last all-reduce)
  std::vector<co2_engine_stats_t> after_finalize;
};

// Trains `run` and returns each rank's statistics.
Trained train(const Training& run) {
  std::unique_ptr<ScopedEnv> link;
  if (run.slow_link) link = std::make_unique<ScopedEnv>("CO2_LOCAL_TEST_BANDWIDTH", std::to_string(int64_t(kBandwidth)));
  const Layout layout = layout_single(kCount);
  const Data data = make_data(layout, run.world, 8);
  Trained stats;
  stats.before_finalize.assign(size_t(run.world), co2_engine_stats_t{});
  stats.after_finalize.assign(size_t(run.world), co2_engine_stats_t{});
  run_ranks(run.world, [&](int rank, co2_comm_t comm) {
    LocalModel model(layout, data, rank);
    EngineGuard eg;
    co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
    cfg.algorithm = run.algorithm;
    cfg.tau = uint32_t(run.tau);
    cfg.anchor_check_interval = 0;
    CO2_ASSERT_OK(co2_engine_create(comm, &cfg, &eg.engine));
    CO2_ASSERT_OK(model.register_with(eg.engine));
    CO2_ASSERT_OK(co2_engine_commit(eg.engine));
    std::vector<float> grad(kCount, 1.0f);
    void* grads[1] = {grad.data()};
    const auto sleep = milliseconds(run.sleep_ms + rank * run.sleep_per_rank_ms);
    uint64_t k = 0;
    for (int i = 0; i < run.rounds * run.tau; ++i) {
      // Under sync no optimizer applies the averaged gradient, so the parameters stay equal.
      if (run.algorithm != CO2_ALGO_SYNC) model.inner_step(k++);
      std::this_thread::sleep_for(sleep);
      if (run.algorithm == CO2_ALGO_SYNC) CO2_ASSERT_OK(co2_engine_reduce_gradients(eg.engine, grads, 1, nullptr));
      CO2_ASSERT_OK(co2_engine_step(eg.engine, nullptr, nullptr));
    }
    stats.before_finalize[size_t(rank)] = get_stats(eg.engine);
    CO2_ASSERT_OK(co2_engine_finalize(eg.engine));
    stats.after_finalize[size_t(rank)] = get_stats(eg.engine);
  });
  return stats;
}

double expected_hidden(uint64_t waited, uint64_t collective) {
  return collective == 0 ? 0.0 : std::min(1.0, std::max(0.0, 1.0 - double(waited) / double(collective)));
}

// The fields are what their definitions say, from the other fields of the same snapshot.
void expect_consistent(const co2_engine_stats_t& st, int rank) {
  EXPECT_GT(st.collective_ns, 0u) << "rank " << rank;
  EXPECT_GT(st.last_collective_ns, 0u) << "rank " << rank;
  EXPECT_LE(st.last_collective_ns, st.collective_ns) << "rank " << rank;
  EXPECT_DOUBLE_EQ(st.hidden_fraction, expected_hidden(st.boundary_wait_ns, st.collective_ns)) << "rank " << rank;
  EXPECT_DOUBLE_EQ(st.last_hidden_fraction, expected_hidden(st.last_boundary_wait_ns, st.last_collective_ns))
      << "rank " << rank;
  std::printf("[ hidden ] rank %d: collectives %.2f ms, waited %.2f ms: hidden %.1f%% (last: %.2f ms, waited "
              "%.2f ms, %.1f%%), round %.2f ms\n",
              rank, st.collective_ns / 1e6, st.boundary_wait_ns / 1e6, 100 * st.hidden_fraction,
              st.last_collective_ns / 1e6, st.last_boundary_wait_ns / 1e6, 100 * st.last_hidden_fraction,
              st.last_round_ns / 1e6);
}

// co2 with a round (4 x 40 ms) far longer than its all-reduce (in memory): the all-reduce
// is done when the next boundary looks for it. (Not 1: on a loaded machine one rank may reach a
// boundary late enough that the others wait for it once; the long round makes that rare.)
TEST(Observe, HiddenFractionNearOneWhenTheCollectiveIsFast) {
  Training run;
  run.tau = 4;
  run.rounds = 5;
  run.sleep_ms = 40;
  const auto stats = train(run).before_finalize;
  for (int r = 0; r < run.world; ++r) {
    expect_consistent(stats[r], r);
    EXPECT_GT(stats[r].hidden_fraction, 0.7) << "rank " << r;
    EXPECT_GE(stats[r].last_round_ns,
              uint64_t(duration_cast<nanoseconds>(milliseconds(run.tau * run.sleep_ms)).count()))
        << "rank " << r << ": a round is four steps of at least 40 ms";
  }
}

// co2 whose all-reduce (>= 65 ms over the slowed link) is far longer than its round (1 step of
// 1 ms): every boundary waits for most of it.
TEST(Observe, HiddenFractionLowWhenTheBoundaryWaits) {
  Training run;
  run.tau = 1;
  run.slow_link = true;
  const auto stats = train(run).before_finalize;
  for (int r = 0; r < run.world; ++r) {
    expect_consistent(stats[r], r);
    EXPECT_LT(stats[r].hidden_fraction, 0.5) << "rank " << r;
    EXPECT_LT(stats[r].last_hidden_fraction, 0.5) << "rank " << r;
  }
}

// sync waits for every gradient average as soon as it is submitted: nothing is hidden.
TEST(Observe, HiddenFractionOfBlockingAveragesIsLow) {
  Training run;
  run.algorithm = CO2_ALGO_SYNC;
  run.tau = 1;
  run.rounds = 4;
  run.slow_link = true;
  const auto stats = train(run).after_finalize;
  for (int r = 0; r < run.world; ++r) {
    expect_consistent(stats[r], r);
    EXPECT_LT(stats[r].hidden_fraction, 0.2) << "rank " << r;
  }
}

// Ranks whose steps differ (3 ranks: 2, 14, 26 ms) measure different step times and, because
// the fast ranks' all-reduce includes waiting for the slow one, different all-reduce times:
// alone they would advise different taus. The advice is agreed: identical on every rank, from
// the slowest rank's step and the shortest all-reduce.
TEST(Observe, AdvisedTauIsTheSameOnEveryRank) {
  Training run;
  run.world = 3;
  run.tau = 2;
  run.rounds = 6;
  run.slow_link = true;
  run.sleep_ms = 2;
  run.sleep_per_rank_ms = 12;
  const auto stats = train(run).after_finalize;
  uint64_t slowest_step = 0;
  for (int r = 0; r < run.world; ++r) {
    const co2_engine_stats_t& st = stats[r];
    std::printf("[ agree ] rank %d: own step %.2f ms, own all-reduce %.2f ms -> agreed step %.2f ms, all-reduce "
                "%.2f ms, advised tau %u\n",
                r, st.rank_step_time_ns / 1e6, st.rank_allreduce_time_ns / 1e6, st.step_time_ns / 1e6,
                st.allreduce_time_ns / 1e6, st.advised_tau);
    slowest_step = std::max(slowest_step, st.rank_step_time_ns);
    EXPECT_GE(st.advised_tau, 1u) << "rank " << r;
    EXPECT_EQ(st.advised_tau, stats[0].advised_tau) << "rank " << r;
    EXPECT_EQ(st.step_time_ns, stats[0].step_time_ns) << "rank " << r;
    EXPECT_EQ(st.allreduce_time_ns, stats[0].allreduce_time_ns) << "rank " << r;
    // The advice is exact in the agreed numbers.
    EXPECT_GE(uint64_t(st.advised_tau) * st.step_time_ns, st.allreduce_time_ns) << "rank " << r;
    if (st.advised_tau > 1) {
      EXPECT_LT(uint64_t(st.advised_tau - 1) * st.step_time_ns, st.allreduce_time_ns) << "rank " << r;
    }
  }
  // The ranks' own measurements differ (each at least its own sleep): alone they would not agree.
  for (int r = 0; r < run.world; ++r)
    EXPECT_GE(stats[r].rank_step_time_ns, uint64_t(run.sleep_ms + r * run.sleep_per_rank_ms) * 1000000u);
  EXPECT_FALSE(stats[0].rank_step_time_ns == stats[1].rank_step_time_ns &&
               stats[1].rank_step_time_ns == stats[2].rank_step_time_ns);
  // The last step was a boundary, so no step was measured after the last agreement.
  EXPECT_EQ(stats[0].step_time_ns, slowest_step);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class TraceDir {
 public:
  TraceDir() {
    char pattern[] = "/tmp/co2-observe-XXXXXX";
    const char* made = mkdtemp(pattern);
    path_ = made ? made : "";
  }
  ~TraceDir() {
    if (!path_.empty()) std::system(("rm -rf '" + path_ + "'").c_str());
  }
  const std::string& path() const { return path_; }
  bool exists(const std::string& name) const { return access((path_ + "/" + name).c_str(), F_OK) == 0; }

 private:
  std::string path_;
};

void short_run(co2_comm_t comm, int engines) {
  std::vector<EngineGuard> guards(static_cast<size_t>(engines));
  std::vector<std::vector<float>> weights(static_cast<size_t>(engines), std::vector<float>(64, 1.0f));
  for (int e = 0; e < engines; ++e) {
    CO2_ASSERT_OK(co2_engine_create(comm, nullptr, &guards[e].engine));
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = weights[e].data();
    t.count = weights[e].size();
    CO2_ASSERT_OK(co2_engine_register_tensor(guards[e].engine, &t));
    CO2_ASSERT_OK(co2_engine_commit(guards[e].engine));
    for (int i = 0; i < 24; ++i) CO2_ASSERT_OK(co2_engine_step(guards[e].engine, nullptr, nullptr));
    CO2_ASSERT_OK(co2_engine_finalize(guards[e].engine));
  }
}

// One file per rank, the rank inserted before the extension; a rank's second engine adds
// ".engine2"; the file is written at finalize and is a trace object.
TEST(Observe, TraceFileNamesFollowTheRule) {
  TraceDir dir;
  ASSERT_FALSE(dir.path().empty());
  const ScopedEnv trace("CO2_TRACE", dir.path() + "/run.trace.json");
  run_ranks(2, [&](int, co2_comm_t comm) { short_run(comm, 2); });
  for (const char* name : {"run.trace.rank0.json", "run.trace.rank1.json", "run.trace.rank0.engine2.json",
                           "run.trace.rank1.engine2.json"}) {
    ASSERT_TRUE(dir.exists(name)) << name;
    const std::string text = read_file(dir.path() + "/" + name);
    EXPECT_EQ(text.rfind("{\"traceEvents\":[", 0), 0u) << name;
    EXPECT_NE(text.find("\"name\":\"boundary\""), std::string::npos) << name;
  }
  EXPECT_FALSE(dir.exists("run.trace.json"));
}

TEST(Observe, TraceWithoutExtensionAppendsTheRank) {
  TraceDir dir;
  ASSERT_FALSE(dir.path().empty());
  const ScopedEnv trace("CO2_TRACE", dir.path() + "/timeline");
  run_ranks(2, [&](int, co2_comm_t comm) { short_run(comm, 1); });
  EXPECT_TRUE(dir.exists("timeline.rank0"));
  EXPECT_TRUE(dir.exists("timeline.rank1"));
}

// A trace that cannot be written is reported and costs the run nothing else.
TEST(Observe, UnwritableTracePathDoesNotStopTraining) {
  const ScopedEnv trace("CO2_TRACE", "/nonexistent-co2-dir/trace.json");
  run_ranks(2, [&](int, co2_comm_t comm) { short_run(comm, 1); });
  EXPECT_NE(access("/nonexistent-co2-dir", F_OK), 0);
}

}  // namespace

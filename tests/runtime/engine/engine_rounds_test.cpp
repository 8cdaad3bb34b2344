// The engine's round logic (runtime/engine/engine.cpp) over a recording backend: which backend calls a
// boundary makes, in which order, and what the engine concludes from their results. The
// recording backend stands in for the device backend: each co2 call appends the ops of the plan
// phase the device backend executes for it (runtime/backends/device/selection.hpp), so that the order the
// engine produces is checked by the same plan checker as the plan itself, on machines without a
// GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backends/backend.hpp"
#include "runtime/backends/device/selection.hpp"
#include "runtime/engine/engine_state.hpp"
#include "transports/local/transport.hpp"

namespace co2 {
namespace {

using device::Averaging;
using device::Op;

// What the next collected average does.
enum class Outcome { Finite, NonFinite, CollectiveFails };

// Every call a no-op that succeeds: the tests' backends override what they watch.
class QuietBackend : public Backend {
 public:
  void check_memory(const void*, size_t, const std::string&) override {}
  void* allocate_flat(size_t, ParamDType) override { return nullptr; }
  void commit() override {}
  void momentum_needed() override {}
  void begin_new_group() override {}
  Arrival collect_average() override { return {}; }
  DeltasFinite boundary_pass(const BoundaryPass&) override { return DeltasFinite::Yes; }
  void submit_average() override {}
  void apply_update() override {}
  void clear_eager_state() override {}
  void apply_on_arrival() override {}
  bool average_deltas_blocking() override { return true; }
  void apply_blocking_update() override {}
  bool average_parameters(bool) override { return true; }
  bool average_gradients(void* const*, size_t) override { return true; }
  void set_parameters_to_anchor() override {}
  uint64_t anchor_checksum() override { return 0; }
  uint64_t parameters_checksum(bool) override { return 0; }
  void consensus_into(float*, size_t, bool, bool) override {}
  void set_caller_stream(void*) override {}
  void wait_for_caller(const char*) override {}
  Finished finished(bool) override { return {}; }
  void drain() noexcept override {}
  bool has_momentum() const override { return false; }
  void stage_out() override {}
  void stage_in() override {}
  void release_staged() override {}
};

class RecordingBackend final : public QuietBackend {
 public:
  RecordingBackend(Averaging averaging, std::vector<std::string>* calls, std::vector<std::vector<Op>>* boundaries,
                   std::deque<Outcome>* outcomes)
      : averaging_(averaging), calls_(calls), boundaries_(boundaries), outcomes_(outcomes) {}

  void commit() override { calls_->push_back("commit"); }

  Arrival collect_average() override {
    boundaries_->emplace_back();  // a co2 boundary (or finalize) starts with its collect phase
    Arrival a;
    if (!in_flight_) return a;
    in_flight_ = false;
    const auto phases = device::co2_boundary_phases(averaging_, true);
    const Outcome outcome = outcomes_->empty() ? Outcome::Finite : outcomes_->front();
    if (!outcomes_->empty()) outcomes_->pop_front();
    if (outcome == Outcome::CollectiveFails) {
      // HostWaitAverage throws: nothing after it runs.
      record_ops({phases.collect.front()});
      calls_->push_back("collect:failed");
      fail(Status::PeerTimeout, "the outer all-reduce timed out (injected)");
    }
    record_ops(phases.collect);
    a.have = true;
    a.finite = outcome == Outcome::Finite;
    calls_->push_back(a.finite ? "collect:finite" : "collect:nonfinite");
    return a;
  }
  DeltasFinite boundary_pass(const BoundaryPass& plan) override {
    return pass(plan.eager ? "pass:eager" : plan.update ? "pass:update+deltas" : "pass:deltas");
  }
  void submit_average() override {
    record_ops(device::co2_boundary_phases(averaging_, true).submit);
    calls_->push_back("submit");
    in_flight_ = true;
  }
  void apply_update() override { pass("pass:update"); }
  bool average_deltas_blocking() override {
    calls_->push_back("diloco:average");
    return true;
  }
  void apply_blocking_update() override { calls_->push_back("diloco:apply"); }
  bool average_parameters(bool) override {
    calls_->push_back("average_parameters");
    return true;
  }
  void set_parameters_to_anchor() override { calls_->push_back("parameters=anchor"); }
  uint64_t anchor_checksum() override {
    calls_->push_back("checksum");
    return 7;
  }

 private:
  DeltasFinite pass(const char* what) {
    if (boundaries_->empty()) boundaries_->emplace_back();
    record_ops(device::co2_boundary_phases(averaging_, false).pass);
    calls_->push_back(what);
    return DeltasFinite::Later;
  }
  void record_ops(const std::vector<Op>& ops) {
    boundaries_->back().insert(boundaries_->back().end(), ops.begin(), ops.end());
  }

  Averaging averaging_;
  std::vector<std::string>* calls_;
  std::vector<std::vector<Op>>* boundaries_;
  std::deque<Outcome>* outcomes_;
  bool in_flight_ = false;
};

std::shared_ptr<Communicator> one_rank() {
  static int counter = 0;
  const std::string name = std::string("engine_rounds#") + std::to_string(counter++);
  CommOptions options;
  options.timeout = std::chrono::milliseconds(20000);
  return std::make_shared<Communicator>(transport::local::join(name, 0, 1, std::chrono::milliseconds(20000), {}),
                                        options);
}

struct Rig {
  std::vector<std::string> calls;
  std::vector<std::vector<Op>> boundaries;
  std::deque<Outcome> outcomes;
  std::vector<float> parameters = std::vector<float>(64, 1.0f);
  std::unique_ptr<Engine> engine;

  Rig(Averaging averaging, EngineConfig config) {
    config.eager = Eager::Off;
    engine = std::make_unique<Engine>(one_rank(), config);
    engine->use_backend_for_testing([&, averaging](Engine::State&) {
      return std::make_unique<RecordingBackend>(averaging, &calls, &boundaries, &outcomes);
    });
    TensorDesc tensor;
    tensor.name = "w";
    tensor.data = parameters.data();
    tensor.count = parameters.size();
    engine->register_tensor(tensor);
    engine->commit();
    calls.clear();
  }

  // Steps until the next boundary; returns the boundary's status.
  Status boundary() {
    try {
      while (!engine->step(nullptr)) {
      }
      return Status::Ok;
    } catch (const Error& e) {
      return e.status();
    }
  }
};

EngineConfig co2_config(uint32_t tau = 3) {
  EngineConfig config;
  config.algorithm = Algorithm::Co2;
  config.tau = tau;
  config.anchor_check_interval = 0;
  return config;
}

class Co2Rounds : public ::testing::TestWithParam<Averaging> {};

TEST_P(Co2Rounds, EveryBoundaryRunsThePlanInOrderAndTheSequenceHoldsItsInvariants) {
  Rig rig(GetParam(), co2_config());
  for (int b = 0; b < 5; ++b) ASSERT_EQ(rig.boundary(), Status::Ok);
  ASSERT_EQ(rig.boundaries.size(), 5u);
  for (size_t b = 0; b < rig.boundaries.size(); ++b)
    EXPECT_EQ(rig.boundaries[b], device::co2_boundary_plan(GetParam(), b > 0)) << "boundary " << b;
  EXPECT_EQ(device::check_plan_sequence(rig.boundaries), "");
  const std::vector<std::string> expected = {"pass:deltas", "submit", "collect:finite", "pass:update+deltas", "submit"};
  EXPECT_EQ(std::vector<std::string>(rig.calls.begin(), rig.calls.begin() + 5), expected);
}

TEST_P(Co2Rounds, ANonFiniteAverageIsReportedByTheBoundaryThatSkipsIt) {
  Rig rig(GetParam(), co2_config());
  ASSERT_EQ(rig.boundary(), Status::Ok);
  rig.outcomes = {Outcome::NonFinite};
  rig.calls.clear();
  EXPECT_EQ(rig.boundary(), Status::NonFinite);
  // No update: this round's deltas only, and they are still submitted (every rank skipped).
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:nonfinite", "pass:deltas", "submit"}));
  EXPECT_EQ(rig.engine->stats().nonfinite_rounds, 1u);
  rig.calls.clear();
  EXPECT_EQ(rig.boundary(), Status::Ok);
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:finite", "pass:update+deltas", "submit"}));
  EXPECT_EQ(device::check_plan_sequence(rig.boundaries), "");
}

TEST_P(Co2Rounds, AFailedCollectiveAppliesNothingOfItsAverage) {
  Rig rig(GetParam(), co2_config());
  ASSERT_EQ(rig.boundary(), Status::Ok);
  rig.outcomes = {Outcome::CollectiveFails};
  rig.calls.clear();
  EXPECT_EQ(rig.boundary(), Status::PeerTimeout);
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:failed"}));
  const std::vector<Op>& failed = rig.boundaries.back();
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].kind, device::OpKind::HostWaitAverage);
}

TEST_P(Co2Rounds, TheAnchorIsCheckedAfterThePassAndBeforeTheNextSubmit) {
  EngineConfig config = co2_config();
  config.anchor_check_interval = 2;
  Rig rig(GetParam(), config);
  for (int b = 0; b < 4; ++b) ASSERT_EQ(rig.boundary(), Status::Ok);
  const std::vector<std::string> expected = {
      "pass:deltas",        "submit",                                       // round 1
      "collect:finite",     "pass:update+deltas", "checksum", "submit",     // round 2
      "collect:finite",     "pass:update+deltas", "submit",                 // round 3
      "collect:finite",     "pass:update+deltas", "checksum", "submit"};    // round 4
  EXPECT_EQ(rig.calls, expected);
}

// finalize is synchronize (docs/algorithm.md, "End of training, evaluation"): at a boundary it
// applies the last average; mid-round it first runs a boundary, so the partial round is kept.
TEST_P(Co2Rounds, FinalizeCollectsAndAppliesTheLastAverage) {
  Rig rig(GetParam(), co2_config());
  ASSERT_EQ(rig.boundary(), Status::Ok);
  rig.calls.clear();
  rig.engine->finalize();
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:finite", "pass:update", "checksum"}));
  // Collect then pass of the finalizing "boundary": the same invariants hold.
  EXPECT_EQ(device::check_plan_sequence(rig.boundaries), "");
  rig.calls.clear();
  rig.engine->finalize();  // nothing in flight: the parameters take the anchor
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"parameters=anchor", "checksum"}));
}

TEST_P(Co2Rounds, FinalizeMidRoundRunsABoundaryThenAppliesItsAverage) {
  Rig rig(GetParam(), co2_config());
  ASSERT_EQ(rig.boundary(), Status::Ok);
  ASSERT_FALSE(rig.engine->step(nullptr));
  rig.calls.clear();
  rig.engine->finalize();
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:finite", "pass:update+deltas", "submit", "collect:finite",
                                                  "pass:update", "checksum"}));
}

TEST_P(Co2Rounds, SynchronizeMidRoundRunsABoundaryThenAppliesItsAverage) {
  Rig rig(GetParam(), co2_config());
  ASSERT_EQ(rig.boundary(), Status::Ok);
  ASSERT_FALSE(rig.engine->step(nullptr));
  rig.calls.clear();
  rig.engine->synchronize();
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"collect:finite", "pass:update+deltas", "submit", "collect:finite",
                                                  "pass:update", "checksum"}));
}

TEST_P(Co2Rounds, WarmUpRoundsAreBlockingAndTheFirstCo2RoundHasNoAverage) {
  EngineConfig config = co2_config();
  config.warmup_sync_rounds = 2;
  Rig rig(GetParam(), config);
  for (int b = 0; b < 3; ++b) ASSERT_EQ(rig.boundary(), Status::Ok);
  EXPECT_EQ(rig.calls, (std::vector<std::string>{"diloco:average", "diloco:apply", "diloco:average", "diloco:apply",
                                                  "pass:deltas", "submit"}));
}

INSTANTIATE_TEST_SUITE_P(Averaging, Co2Rounds, ::testing::Values(Averaging::Collective, Averaging::StagedHost),
                         [](const auto& info) {
                           return info.param == Averaging::Collective ? std::string("Collective")
                                                                      : std::string("Staged");
                         });

// A rank whose average is refused in a blocking round (diloco) resets its parameters to the
// unchanged anchor and reports NONFINITE at that round.
class RefusingDiloco final : public QuietBackend {
 public:
  explicit RefusingDiloco(std::vector<std::string>* calls) : calls_(calls) {}
  bool average_deltas_blocking() override {
    calls_->push_back("diloco:average");
    return false;
  }
  void apply_blocking_update() override { calls_->push_back("diloco:apply"); }
  void set_parameters_to_anchor() override { calls_->push_back("parameters=anchor"); }

 private:
  std::vector<std::string>* calls_;
};

TEST(DilocoRounds, ARefusedAverageResetsTheParametersAndIsReportedAtOnce) {
  std::vector<std::string> calls;
  EngineConfig config;
  config.algorithm = Algorithm::Diloco;
  config.tau = 2;
  Engine engine(one_rank(), config);
  engine.use_backend_for_testing([&](Engine::State&) { return std::make_unique<RefusingDiloco>(&calls); });
  std::vector<float> w(8, 0.5f);
  TensorDesc tensor;
  tensor.name = "w";
  tensor.data = w.data();
  tensor.count = w.size();
  engine.register_tensor(tensor);
  engine.commit();
  EXPECT_FALSE(engine.step(nullptr));
  try {
    engine.step(nullptr);
    ADD_FAILURE() << "the boundary did not report the refused average";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::NonFinite);
  }
  EXPECT_EQ(calls, (std::vector<std::string>{"diloco:average", "parameters=anchor"}));
  EXPECT_EQ(engine.stats().nonfinite_rounds, 1u);
}

}  // namespace
}  // namespace co2

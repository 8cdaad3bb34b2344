// co2run --probe as a user runs it before a long job: real rank processes over UCX (loopback),
// the all-reduce per wire format timed across them, the tau that hides each, and the advice.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>

#include <unistd.h>

#include "tests/subprocess.hpp"

#ifndef CO2RUN
#error "CO2RUN must name the co2run program"
#endif

namespace {

using co2::testing::Subprocess;
using namespace std::chrono_literals;

// Generous: a probe of a 1M-parameter model that has not finished by then hangs.
constexpr auto kHangDeadline = 120s;

std::vector<std::string> co2run(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), CO2RUN);
  return arguments;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Row {
  double sent_mb, allreduce_ms;
  long long tau;
};

// Rank 0's table rows by format.
std::map<std::string, Row> rows_of(const std::string& out) {
  std::map<std::string, Row> rows;
  const std::regex row(R"(\[rank 0\] (fp32|bf16|int8|fp4)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9]+))");
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row)) rows[m[1]] = {std::stod(m[2]), std::stod(m[3]), std::stoll(m[5])};
  }
  return rows;
}

TEST(Probe, TimesEveryFormatAcrossTheRanksAndAdvisesTheMostExactThatHides) {
  const double step_ms = 2.0;
  Subprocess run(co2run({"--nproc-per-node", "2", "--probe", "--params", "1M", "--step-ms", "2", "--rounds", "3"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.out(), "co2 probe: 2 ranks, 1000000 parameters")) << run.out();
  const auto rows = rows_of(run.out());
  ASSERT_EQ(rows.size(), 4u) << run.out();
  for (const auto& [format, row] : rows) {
    // The tau advisor's rule on the printed (rounded) time: tau * step >= all-reduce > (tau - 1) * step.
    EXPECT_GE(row.tau, 1) << format;
    EXPECT_GE(double(row.tau) * step_ms, row.allreduce_ms - 0.01) << format;
    if (row.tau > 1) { EXPECT_LT(double(row.tau - 1) * step_ms, row.allreduce_ms + 0.01) << format; }
  }
  // What a rank sends per all-reduce at W = 2 (half the model each way): 4 MB in fp32, half of it
  // in bf16, about 1/3.9 in int8 and 1/7.1 in fp4 (the groups' scales included).
  EXPECT_NEAR(rows.at("fp32").sent_mb, 4.0, 0.01);
  EXPECT_NEAR(rows.at("bf16").sent_mb, 2.0, 0.01);
  EXPECT_NEAR(rows.at("fp32").sent_mb / rows.at("int8").sent_mb, 3.88, 0.05);
  EXPECT_NEAR(rows.at("fp32").sent_mb / rows.at("fp4").sent_mb, 7.11, 0.05);
  // The advice is the first of fp32, bf16, int8, fp4 whose tau is at most 12 (the default).
  std::string advised;
  for (const char* format : {"fp32", "bf16", "int8", "fp4"})
    if (advised.empty() && rows.at(format).tau <= 12) advised = format;
  if (advised.empty()) {
    EXPECT_TRUE(contains(run.out(), "advice: no format hides behind 12 steps")) << run.out();
  } else {
    EXPECT_TRUE(contains(run.out(), "advice: tau 12 with wire format " + advised)) << run.out();
  }
}

TEST(Probe, WhenNothingHidesItSaysSoAndNamesTheFewestSteps) {
  Subprocess run(co2run({"--nproc-per-node", "2", "--probe", "--params", "256k", "--step-ms", "0.0001", "--tau", "1",
                         "--rounds", "1", "--formats", "fp32,int8"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  const auto rows = rows_of(run.out());
  ASSERT_EQ(rows.size(), 2u) << run.out();
  EXPECT_EQ(rows.count("bf16"), 0u);
  const std::string fewest = rows.at("int8").tau <= rows.at("fp32").tau ? "int8" : "fp32";
  EXPECT_TRUE(contains(run.out(), "advice: no format hides behind 1 steps; the fewest are " +
                                      std::to_string(rows.at(fewest).tau) + " steps with " + fewest))
      << run.out();
}

TEST(Probe, BadArgumentsAreUsageErrorsOnEveryRank) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--step-ms", "10"}, "--params is required"},
      {{"--params", "1M"}, "--step-ms is required"},
      {{"--params", "x", "--step-ms", "10"}, "--params wants a positive count"},
      {{"--params", "1M", "--step-ms", "-3"}, "--step-ms wants positive milliseconds"},
      {{"--params", "1M", "--step-ms", "10", "--formats", "fp8"}, "not one of fp32, bf16, int8, fp4: 'fp8'"},
      {{"--params", "1M", "--step-ms", "10", "--tau", "2.5"}, "--tau wants an integer"},
      {{"--params", "1M", "--step-ms", "10", "--rounds", "5000"}, "--rounds wants an integer in [1, 1000]"},
      {{"--params", "1M", "--step-ms", "10", "stray"}, "unexpected argument 'stray'"},
  };
  for (const auto& [arguments, message] : cases) {
    std::vector<std::string> line = {"--probe"};
    line.insert(line.end(), arguments.begin(), arguments.end());
    Subprocess run(co2run(line));
    ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
    EXPECT_FALSE(run.exited_with(0)) << run.describe();
    EXPECT_TRUE(contains(run.err(), message)) << "expected '" << message << "':\n" << run.describe();
  }
  Subprocess help(co2run({"--probe", "--help"}));
  ASSERT_TRUE(help.finish(kHangDeadline)) << help.describe();
  EXPECT_TRUE(help.exited_with(0)) << help.describe();
  EXPECT_TRUE(contains(help.out(), "--step-ms")) << help.describe();
}

TEST(Probe, Co2runWithoutTheProbeBesideItSaysWhere) {
  char directory[] = "/tmp/co2_probe_test_XXXXXX";
  ASSERT_NE(mkdtemp(directory), nullptr);
  const std::string lone = std::string(directory) + "/co2run";
  Subprocess copy({"/bin/cp", CO2RUN, lone});
  ASSERT_TRUE(copy.finish(kHangDeadline) && copy.exited_with(0)) << copy.describe();
  Subprocess run({lone, "--probe", "--params", "1M", "--step-ms", "10"});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(1)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "co2-probe from co2run's directory")) << run.describe();
  std::remove(lone.c_str());
  ::rmdir(directory);
}

}  // namespace

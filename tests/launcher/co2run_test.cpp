// co2run as a user runs it: a real process starting real ranks (rank_helper, shells, the TCP
// store helper), under real signals.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "tests/subprocess.hpp"

#ifndef CO2RUN
#error "CO2RUN must name the co2run program"
#endif

namespace {

using co2::testing::Subprocess;
using namespace std::chrono_literals;

// Generous: co2run that has not finished by then hangs.
constexpr auto kHangDeadline = 60s;

std::vector<std::string> co2run(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), CO2RUN);
  return arguments;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Co2run, HelpExplainsTheOptions) {
  Subprocess run(co2run({"--help"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  for (const char* part : {"usage: co2run", "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                           "--master-port", "--grace-period", "CO2_AUTH_TOKEN", "CO2_MASTER_PORT", "GROUP_RANK",
                           "simulated nodes", "--probe", "--elastic", "--max-restarts"})
    EXPECT_TRUE(contains(run.out(), part)) << part;
}

TEST(Co2run, BadCommandLinesAreUsageErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no PROGRAM"},
      {{"--nproc-per-node", "0", "true"}, "out of range"},
      {{"--nproc-per-node", "two", "true"}, "wants an integer"},
      {{"--nproc-per-node"}, "needs a value"},
      {{"--bogus", "true"}, "unknown option"},
      {{"--nnodes", "2", "--node-rank", "0", "true"}, "--master-addr and --master-port"},
      {{"--nnodes", "2", "--node-rank", "-1", "true"}, "out of range"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-addr", "h", "--master-port", "1", "true"}, "not below --nnodes"},
      {{"--master-port", "70000", "true"}, "out of range"},
      {{"--grace-period", "-1", "true"}, "--grace-period"},
      {{"--grace_period", "x", "true"}, "--grace-period wants seconds"},
      {{"--n", "2", "true"}, "ambiguous option '--n'"},
      {{"--master-addr=", "true"}, "--master-addr is empty"},
      {{"--elastic", "0", "true"}, "out of range"},
      {{"--nproc-per-node", "2", "--elastic", "3", "true"}, "--elastic 3 is more ranks than the job has (2)"},
      {{"--max-restarts", "2", "true"}, "--max-restarts needs --elastic"},
      {{"--elastic", "1", "--max-restarts", "-1", "true"}, "out of range"},
  };
  for (const auto& [arguments, message] : cases) {
    Subprocess run(co2run(arguments));
    ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
    EXPECT_TRUE(run.exited_with(2)) << run.describe();
    EXPECT_TRUE(contains(run.err(), message)) << "expected '" << message << "':\n" << run.describe();
  }
}

TEST(Co2run, EachRankGetsItsEnvironmentAndPrefixedOutput) {
  Subprocess run(co2run({"--nproc-per-node", "3", CO2_RANK_HELPER, "env"}), {{"CO2_AUTH_TOKEN", std::nullopt}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  const std::regex line(
      R"(\[rank (\d)\] RANK=(\d) WORLD_SIZE=3 LOCAL_RANK=(\d) LOCAL_WORLD_SIZE=3 MASTER_ADDR=127\.0\.0\.1 )"
      R"(MASTER_PORT=(\d+) CO2_AUTH_TOKEN=([0-9a-f]{32}))");
  std::set<std::string> ranks, ports, tokens;
  for (const auto& text : lines_of(run.out())) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(text, match, line)) << text;
    EXPECT_EQ(match[1], match[2]);
    EXPECT_EQ(match[2], match[3]);
    ranks.insert(match[1]);
    ports.insert(match[4]);
    tokens.insert(match[5]);
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2"}));
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same port";
  EXPECT_NE(*ports.begin(), "0");
  EXPECT_EQ(tokens.size(), 1u) << "every rank must see the same made-up token";
  // stderr stays stderr, prefixed too.
  EXPECT_FALSE(contains(run.out(), "to-stderr"));
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(contains(run.err(), "[rank " + std::to_string(rank) + "] to-stderr\n")) << run.describe();
}

// Below the ephemeral range no outgoing connection can take the port between co2run's pick and
// rank 0's bind (a parallel test's connections once did, in CI, to the examples' MASTER_PORT + 1).
TEST(Co2run, ThePickedPortLiesBelowTheEphemeralRange) {
  int ephemeral_low = 32768, ephemeral_high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low >> ephemeral_high;
  for (int run_index = 0; run_index < 3; ++run_index) {
    Subprocess run(co2run({"--nproc-per-node", "1", CO2_RANK_HELPER, "env"}));
    ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
    ASSERT_TRUE(run.exited_with(0)) << run.describe();
    std::smatch match;
    const std::string out = run.out();
    ASSERT_TRUE(std::regex_search(out, match, std::regex(R"(MASTER_PORT=(\d+))"))) << out;
    const int port = std::stoi(match[1]);
    EXPECT_GE(port, 10000) << out;
    EXPECT_LT(port + 1, ephemeral_low) << "MASTER_PORT and MASTER_PORT + 1 below the ephemeral range\n" << out;
  }
}

TEST(Co2run, OptionsTakeEitherSpellingAndAnUnambiguousPrefix) {
  for (const auto& arguments : std::vector<std::vector<std::string>>{{"--nproc_per_node=2"},
                                                                     {"--nproc", "2"},
                                                                     {"--nproc-per-node", "2", "--"}}) {
    std::vector<std::string> command = arguments;
    command.push_back(CO2_RANK_HELPER);
    command.push_back("env");
    Subprocess run(co2run(command));
    ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
    EXPECT_TRUE(run.exited_with(0)) << run.describe();
    EXPECT_EQ(Subprocess::occurrences(run.out(), " WORLD_SIZE=2 "), 2) << run.describe();
  }
}

TEST(Co2run, MultiNodeRanksAndTheUsersToken) {
  Subprocess run(co2run({"--nnodes", "3", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr", "10.1.2.3",
                         "--master-port", "29555", CO2_RANK_HELPER, "env"}),
                 {{"CO2_AUTH_TOKEN", "users-secret"}, {"RANK", "77"}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  for (int local = 0; local < 2; ++local) {
    const int rank = 2 + local;
    const std::string expected = "[rank " + std::to_string(rank) + "] RANK=" + std::to_string(rank) +
                                 " WORLD_SIZE=6 LOCAL_RANK=" + std::to_string(local) +
                                 " LOCAL_WORLD_SIZE=2 MASTER_ADDR=10.1.2.3 MASTER_PORT=29555 CO2_AUTH_TOKEN=users-secret\n";
    EXPECT_TRUE(contains(run.out(), expected)) << expected << run.describe();
  }
  EXPECT_FALSE(contains(run.err(), "warning")) << run.describe();
}

// Without --node-rank every node runs here: ranks K*N .. K*N+N-1 are node K, as on a cluster.
TEST(Co2run, SimulatedNodesOnOneMachine) {
  Subprocess run(co2run({"--nnodes", "2", "--nproc-per-node", "2", CO2_RANK_HELPER, "node-env"}),
                 {{"CO2_AUTH_TOKEN", std::nullopt}, {"CO2_STORE_BIND", std::nullopt}, {"GROUP_RANK", "9"}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  for (int rank = 0; rank < 4; ++rank) {
    const std::string expected = "[rank " + std::to_string(rank) + "] RANK=" + std::to_string(rank) +
                                 " LOCAL_RANK=" + std::to_string(rank % 2) + " LOCAL_WORLD_SIZE=2 GROUP_RANK=" +
                                 std::to_string(rank / 2) +
                                 " GROUP_WORLD_SIZE=2 WORLD_SIZE=4 CO2_STORE_BIND=127.0.0.1\n";
    EXPECT_TRUE(contains(run.out(), expected)) << expected << run.describe();
  }
  // One machine: a made-up token, no warning.
  EXPECT_FALSE(contains(run.err(), "warning")) << run.describe();
}

TEST(Co2run, NodeRankStartsOnlyThatNode) {
  Subprocess run(co2run({"--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "2", "--master-addr", "10.1.2.3",
                         "--master-port", "29555", CO2_RANK_HELPER, "node-env"}),
                 {{"CO2_AUTH_TOKEN", "secret"}, {"CO2_STORE_BIND", std::nullopt}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  ASSERT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_EQ(lines_of(run.out()).size(), 2u) << run.describe();
  for (int local = 0; local < 2; ++local) {
    const std::string expected = "[rank " + std::to_string(4 + local) + "] RANK=" + std::to_string(4 + local) +
                                 " LOCAL_RANK=" + std::to_string(local) +
                                 " LOCAL_WORLD_SIZE=2 GROUP_RANK=2 GROUP_WORLD_SIZE=3 WORLD_SIZE=6 "
                                 "CO2_STORE_BIND=<unset>\n";
    EXPECT_TRUE(contains(run.out(), expected)) << expected << run.describe();
  }
}

TEST(Co2run, MultiNodeWithoutATokenWarns) {
  Subprocess run(co2run({"--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--master-port", "29555",
                         CO2_RANK_HELPER, "env"}),
                 {{"CO2_AUTH_TOKEN", std::nullopt}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "co2run: warning: CO2_AUTH_TOKEN is not set")) << run.describe();
  EXPECT_TRUE(contains(run.out(), "CO2_AUTH_TOKEN=<unset>")) << run.describe();
}

TEST(Co2run, OneNodeKeepsTheUsersToken) {
  Subprocess run(co2run({"--nproc-per-node", "2", CO2_RANK_HELPER, "env"}), {{"CO2_AUTH_TOKEN", "mine"}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_EQ(Subprocess::occurrences(run.out(), "CO2_AUTH_TOKEN=mine\n"), 2) << run.describe();
}

TEST(Co2run, ARankThatExitsNonZeroStopsTheOthers) {
  Subprocess run(co2run({"--nproc-per-node", "4", CO2_RANK_HELPER, "fail", "1", "3"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << "the other ranks were not stopped\n" << run.describe();
  EXPECT_TRUE(run.exited_with(3)) << run.describe();
  const std::regex line(R"(co2run: rank 1 \(pid \d+\) exited with code 3; stopped the other 3 ranks\n)");
  EXPECT_TRUE(std::regex_search(run.err(), line)) << run.describe();
}

TEST(Co2run, ARankKilledByASignalStopsTheOthers) {
  Subprocess run(co2run({"--nproc-per-node", "4", CO2_RANK_HELPER, "signal", "2", "9"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << "the other ranks were not stopped\n" << run.describe();
  EXPECT_TRUE(run.exited_with(128 + 9)) << run.describe();
  const std::regex line(R"(co2run: rank 2 \(pid \d+\) was killed by signal 9 \(SIGKILL\); stopped the other 3 ranks\n)");
  EXPECT_TRUE(std::regex_search(run.err(), line)) << run.describe();
}

TEST(Co2run, ElasticKeepsTheOthersRunningWhenARankFails) {
  // Rank 1 fails at once; the others finish a second later, each printing its
  // CO2_ELASTIC_MIN_RANKS: co2run waits for them and succeeds, naming the lost rank.
  Subprocess run(co2run({"--nproc-per-node", "3", "--elastic", "2", "/bin/sh", "-c",
                         "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 1; echo min=$CO2_ELASTIC_MIN_RANKS"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.out(), "[rank 0] min=2\n") && contains(run.out(), "[rank 2] min=2\n")) << run.describe();
  const std::regex lost(R"(co2run: rank 1 \(pid \d+\) exited with code 7; --elastic: the other ranks go on without it\n)");
  EXPECT_TRUE(std::regex_search(run.err(), lost)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "1 rank process of 3 failed (0 started again); the group went on and 2 ranks finished with exit code 0"))
      << run.describe();
}

TEST(Co2run, ElasticStartsAFailedRankAgainUpToTheLimit) {
  // Rank 1 fails while a file it counts with holds fewer than 3 lines: the first start and two
  // restarts fail, the third restart is past --max-restarts 2, so rank 1 stays down.
  const std::string counter = ::testing::TempDir() + "co2run_restarts_" + std::to_string(::getpid());
  std::remove(counter.c_str());
  Subprocess run(co2run({"--nproc-per-node", "2", "--elastic", "1", "--max-restarts", "2", "/bin/sh", "-c",
                         "if [ \"$RANK\" = 1 ]; then echo ${CO2_RESTART_COUNT:-first} >> " + counter +
                             "; exit 9; fi; sleep 2; echo rank0 done"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "starting it again (restart 1 of 2)")) << run.describe();
  EXPECT_TRUE(contains(run.err(), "starting it again (restart 2 of 2)")) << run.describe();
  EXPECT_FALSE(contains(run.err(), "restart 3")) << run.describe();
  EXPECT_TRUE(contains(run.err(), "3 rank processes of 4 failed (2 started again)")) << run.describe();
  std::ifstream lines(counter);
  std::vector<std::string> starts;  // CO2_RESTART_COUNT of each start
  for (std::string line; std::getline(lines, line);) starts.push_back(line);
  EXPECT_EQ(starts, (std::vector<std::string>{"first", "1", "2"}));
  std::remove(counter.c_str());
}

TEST(Co2run, ElasticStartsRankZeroAgainLikeAnyRank) {
  // co2run serves the group's store (its door), so a failed rank 0 is started again: the new
  // process would join the others. Here it fails again, once, and the restarts are used up.
  Subprocess run(co2run({"--nproc-per-node", "2", "--elastic", "1", "--max-restarts", "1", "/bin/sh", "-c",
                         "if [ \"$RANK\" = 0 ]; then echo served=$CO2_LAUNCHER_SERVES_STORE; exit 5; fi; sleep 2; "
                         "echo rank1 done"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "rank 0 (pid")) << run.describe();
  EXPECT_TRUE(contains(run.err(), "starting it again (restart 1 of 1)")) << run.describe();
  EXPECT_EQ(Subprocess::occurrences(run.out(), "[rank 0] served=1\n"), 2) << run.describe();
  EXPECT_TRUE(contains(run.out(), "[rank 1] rank1 done\n")) << run.describe();
}

TEST(Co2run, ElasticStartsNoRankAgainAfterRankZeroFinished) {
  // Rank 0 finishes first; rank 1 fails after it, with restarts left: the group is finishing.
  Subprocess run(co2run({"--nproc-per-node", "2", "--elastic", "1", "--max-restarts", "3", "/bin/sh", "-c",
                         "if [ \"$RANK\" = 1 ]; then sleep 1; exit 6; fi; echo rank0 done"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "not started again: rank 0 finished, so the group is finishing")) << run.describe();
  EXPECT_FALSE(contains(run.err(), "starting it again")) << run.describe();
}

TEST(Co2run, ElasticFailsWhenNoRankFinishes) {
  Subprocess run(co2run({"--nproc-per-node", "2", "--elastic", "1", "/bin/sh", "-c", "exit $((RANK + 3))"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_FALSE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(run.exited_with(3) || run.exited_with(4)) << run.describe();
}

TEST(Co2run, WithoutElasticTheVariableIsNotPassedOn) {
  Subprocess run(co2run({"/bin/sh", "-c", "echo min=${CO2_ELASTIC_MIN_RANKS:-unset}"}),
                 {{"CO2_ELASTIC_MIN_RANKS", std::string("3")}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(contains(run.out(), "[rank 0] min=unset\n")) << run.describe();
}

TEST(Co2run, RanksThatIgnoreSigtermGetSigkillAfterTheGracePeriod) {
  // Rank 0 fails once every rank is up; ranks 1 and 2 ignore SIGTERM.
  Subprocess run(co2run({"--nproc-per-node", "3", "--grace-period", "0.5", "/bin/sh", "-c",
                         "if [ \"$RANK\" = 0 ]; then sleep 1; exit 5; fi; exec " + std::string(CO2_RANK_HELPER) +
                             " ignore-term"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << "SIGKILL never came\n" << run.describe();
  EXPECT_TRUE(run.exited_with(5)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "exited with code 5; stopped the other 2 ranks (2 ranks needed SIGKILL after the 0.5 s grace period)"))
      << run.describe();
}

TEST(Co2run, SigtermIsForwardedToEveryRank) {
  Subprocess run(co2run({"--nproc-per-node", "3", CO2_RANK_HELPER, "trap-term"}));
  ASSERT_TRUE(run.wait_for_stdout("ready", 3, kHangDeadline)) << run.describe();
  ::kill(run.pid(), SIGTERM);
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_TRUE(contains(run.out(), "[rank " + std::to_string(rank) + "] got SIGTERM\n")) << run.describe();
  EXPECT_TRUE(run.exited_with(128 + SIGTERM)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "co2run: received SIGTERM; forwarded it to the 3 ranks running")) << run.describe();
  EXPECT_FALSE(contains(run.err(), "stopped the other")) << "an interrupt is not a rank's failure\n" << run.describe();
}

TEST(Co2run, SigintIsForwardedToAShellProgram) {
  Subprocess run(co2run({"--nproc-per-node", "2", "/bin/sh", "-c",
                         "trap 'echo got INT in $RANK; exit 0' INT; echo ready; while :; do sleep 0.05; done"}));
  ASSERT_TRUE(run.wait_for_stdout("ready", 2, kHangDeadline)) << run.describe();
  ::kill(run.pid(), SIGINT);
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(contains(run.out(), "[rank 0] got INT in 0\n")) << run.describe();
  EXPECT_TRUE(contains(run.out(), "[rank 1] got INT in 1\n")) << run.describe();
  EXPECT_TRUE(run.exited_with(128 + SIGINT)) << run.describe();
}

TEST(Co2run, AProgramThatDoesNotExist) {
  Subprocess run(co2run({"--nproc-per-node", "2", "/nonexistent/program"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(127)) << run.describe();
  EXPECT_TRUE(contains(run.err(), "co2run: cannot run '/nonexistent/program': No such file or directory")) << run.describe();
  EXPECT_TRUE(contains(run.err(), "exited with code 127")) << run.describe();
}

TEST(Co2run, ExitZeroOnlyWhenEveryRankExitsZero) {
  Subprocess all_good(co2run({"--nproc-per-node", "3", "/bin/sh", "-c", "exit 0"}));
  ASSERT_TRUE(all_good.finish(kHangDeadline)) << all_good.describe();
  EXPECT_TRUE(all_good.exited_with(0)) << all_good.describe();
  // The last rank fails after the others have exited 0: nothing left to stop, still a failure.
  Subprocess last_fails(co2run({"--nproc-per-node", "3", "/bin/sh", "-c",
                                "if [ \"$RANK\" = 2 ]; then sleep 0.5; exit 9; fi; exit 0"}));
  ASSERT_TRUE(last_fails.finish(kHangDeadline)) << last_fails.describe();
  EXPECT_TRUE(last_fails.exited_with(9)) << last_fails.describe();
  EXPECT_TRUE(contains(last_fails.err(), "rank 2 (pid")) << last_fails.describe();
}

TEST(Co2run, RanksReadStdinFromDevNull) {
  Subprocess run(co2run({"--nproc-per-node", "2", CO2_RANK_HELPER, "stdin"}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_EQ(Subprocess::occurrences(run.out(), "stdin at its end"), 2) << run.describe();
}

TEST(Co2run, LinesAreWholeAndStreamsStayApart) {
  constexpr int kLines = 2000;
  Subprocess run(co2run({"--nproc-per-node", "3", CO2_RANK_HELPER, "lines", std::to_string(kLines)}));
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.err();
  ASSERT_TRUE(run.exited_with(0)) << run.err();
  const std::regex out_line(R"(\[rank (\d)\] rank (\d) (line \d+ x{200}|no newline))");
  const std::regex err_line(R"(\[rank (\d)\] rank (\d) error \d+)");
  std::map<std::string, int> counted;
  for (const auto& line : lines_of(run.out())) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, out_line)) << "a broken stdout line: " << line;
    EXPECT_EQ(match[1], match[2]) << line;
    ++counted[match[1]];
  }
  for (const auto& line : lines_of(run.err())) {
    std::smatch match;
    ASSERT_TRUE(std::regex_match(line, match, err_line)) << "a broken stderr line: " << line;
    EXPECT_EQ(match[1], match[2]) << line;
  }
  for (const char* rank : {"0", "1", "2"}) EXPECT_EQ(counted[rank], kLines + 1) << "rank " << rank;
}

// The whole chain: co2run picks the port and the token; rank 0 serves the TCP store on it;
// four processes meet through it.
TEST(Co2run, RanksMeetThroughTheTcpStore) {
  Subprocess run(co2run({"--nproc-per-node", "4", CO2_TCP_STORE_HELPER, "rank"}), {{"CO2_TEST_SERVE", "1"}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_TRUE(contains(run.out(), "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                        " of 4: saw 4 addresses"))
        << run.describe();
}

}  // namespace

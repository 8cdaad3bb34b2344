// Programs started by mpirun or torchrun find each other without co2run: the ranks read their
// launcher's variables and rank 0 serves the TCP store (tcp_store_helper with CO2_TEST_SERVE=1).
// Skipped where the launcher is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "launcher/master_port.hpp"
#include "tests/subprocess.hpp"

namespace {

using co2::testing::Subprocess;
using namespace std::chrono_literals;

// Generous: torchrun alone takes seconds to import torch.
constexpr auto kHangDeadline = 120s;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string find_program(const std::vector<std::string>& names) {
  const char* path = std::getenv("PATH");
  std::string directories = std::string(path ? path : "") + ":/usr/bin:/bin";
  size_t start = 0;
  while (start <= directories.size()) {
    const size_t end = std::min(directories.find(':', start), directories.size());
    const std::string directory = directories.substr(start, end - start);
    for (const auto& name : names) {
      const std::string candidate = directory + "/" + name;
      if (!directory.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    start = end + 1;
  }
  return "";
}

TEST(OtherLaunchers, OpenMpiRanksMeetWithoutCo2run) {
  // Debian installs mpirun through alternatives; mpirun.openmpi is there even when those are not set up.
  const std::string mpirun = find_program({"mpirun", "mpirun.openmpi"});
  if (mpirun.empty()) GTEST_SKIP() << "no mpirun";
  Subprocess run({mpirun, "--oversubscribe", "-np", "3", CO2_TCP_STORE_HELPER, "rank"},
                 {{"CO2_TEST_SERVE", "1"},
                  {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                  {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                  {"OMPI_MCA_btl", "self"},  // the ranks need no MPI transport; keep mpirun quiet
                  {"RANK", std::nullopt},
                  {"WORLD_SIZE", std::nullopt},
                  {"MASTER_ADDR", std::nullopt},
                  {"MASTER_PORT", std::nullopt},
                  {"CO2_MASTER_PORT", std::nullopt}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(run.out(), "rank " + std::to_string(rank) + " of 3: saw 3 addresses")) << run.describe();
    // mpirun exports no node index: co2 compares host names.
    EXPECT_TRUE(contains(run.out(), "rank " + std::to_string(rank) + " node: this host's name")) << run.describe();
  }
}

// torchrun's arguments. "--redirects 2 --tee 2": torch 1.13 under Python 3.11 cannot parse the
// default "0" (IntFlag no longer lists the zero member); stderr to a log file and the console
// works everywhere.
std::vector<std::string> torchrun(int ranks, int master_port) {
  return {"/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node", std::to_string(ranks),
          "--master_port", std::to_string(master_port), "--redirects", "2", "--tee", "2", "--no_python",
          CO2_TCP_STORE_HELPER, "rank"};
}

bool torch_installed() {
  static const bool installed = [] {
    if (::access("/usr/bin/python3", X_OK) != 0) return false;
    // find_spec does not import torch (which takes seconds).
    Subprocess probe({"/usr/bin/python3", "-c",
                      "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"});
    return probe.finish(kHangDeadline) && probe.exited_with(0);
  }();
  return installed;
}

TEST(OtherLaunchers, TorchrunRanksMeetOnCo2MasterPort) {
  if (!torch_installed()) GTEST_SKIP() << "no torch for /usr/bin/python3";
  Subprocess run(torchrun(3, co2::launcher::pick_master_port()),
                 {{"CO2_TEST_SERVE", "1"}, {"CO2_MASTER_PORT", std::to_string(co2::launcher::pick_master_port())}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_TRUE(run.exited_with(0)) << run.describe();
  const std::string output = run.out() + run.err();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(contains(output, "rank " + std::to_string(rank) + " of 3: saw 3 addresses")) << run.describe();
    // The real torchrun sets GROUP_RANK, co2's node under it.
    EXPECT_TRUE(contains(output, "rank " + std::to_string(rank) + " node: 0 from GROUP_RANK")) << run.describe();
  }
}

// Why CO2_MASTER_PORT exists: torchrun's agent serves its own store on MASTER_PORT.
TEST(OtherLaunchers, UnderTorchrunMasterPortIsTakenAndTheErrorSaysWhatToDo) {
  if (!torch_installed()) GTEST_SKIP() << "no torch for /usr/bin/python3";
  Subprocess run(torchrun(2, co2::launcher::pick_master_port()),
                 {{"CO2_TEST_SERVE", "1"}, {"CO2_MASTER_PORT", std::nullopt}});
  ASSERT_TRUE(run.finish(kHangDeadline)) << run.describe();
  EXPECT_FALSE(run.exited_with(0)) << run.describe();
  EXPECT_TRUE(contains(run.out() + run.err(), "CO2_MASTER_PORT")) << run.describe();
}

}  // namespace

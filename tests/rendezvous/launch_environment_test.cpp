// read_launch_environment() under each launcher family, with the variables set in-test.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

#include "runtime/base/status.hpp"
#include "rendezvous/launch_environment.hpp"

namespace co2::store {
namespace {

// Every variable read_launch_environment() looks at; each test starts with none of them set.
const char* const kVariables[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CO2_MASTER_PORT",
    "CO2_STORE_BIND",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid", "SLURM_PROCID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS",
    "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "GROUP_RANK", "TORCHELASTIC_RUN_ID"};

class LaunchEnvironmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : kVariables) {
      if (const char* value = std::getenv(name)) saved_[name] = value;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kVariables) ::unsetenv(name);
    for (const auto& [name, value] : saved_) ::setenv(name.c_str(), value.c_str(), 1);
  }

  static void set(std::map<std::string, std::string> variables) {
    for (const auto& [name, value] : variables) ::setenv(name.c_str(), value.c_str(), 1);
  }

  // The message of the InvalidArgument error read_launch_environment() throws ("" if none).
  static std::string invalid_argument() {
    try {
      read_launch_environment();
    } catch (const Error& error) {
      EXPECT_EQ(error.status(), Status::InvalidArgument);
      return error.what();
    }
    return "";
  }

  std::map<std::string, std::string> saved_;
};

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST_F(LaunchEnvironmentTest, NothingSetMeansNotLaunched) {
  const auto environment = read_launch_environment();
  EXPECT_FALSE(environment.present);
  EXPECT_EQ(environment.rank, 0);
  EXPECT_EQ(environment.world_size, 1);
  EXPECT_EQ(environment.source, "");
}

TEST_F(LaunchEnvironmentTest, TorchrunNames) {
  set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
       {"MASTER_ADDR", "node0.cluster"}, {"MASTER_PORT", "29500"}});
  const auto environment = read_launch_environment();
  EXPECT_TRUE(environment.present);
  EXPECT_EQ(environment.source, "torchrun/co2run");
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.world_size, 8);
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.local_world_size, 4);
  EXPECT_EQ(environment.master_addr, "node0.cluster");
  EXPECT_EQ(environment.master_port, 29500);
}

TEST_F(LaunchEnvironmentTest, Co2MasterPortWinsOverTorchrunsMasterPort) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"},
       {"CO2_MASTER_PORT", "29612"}});
  const auto environment = read_launch_environment();
  EXPECT_EQ(environment.master_port, 29612);
  EXPECT_EQ(environment.master_port_variable, "CO2_MASTER_PORT");
  // Without local variables every rank is taken to be on this host.
  EXPECT_EQ(environment.local_rank, 0);
  EXPECT_EQ(environment.local_world_size, 2);
}

// A taken port names the variable that chose it, and torchrun's agent when torchrun launched us.
TEST_F(LaunchEnvironmentTest, PortInUseMessageNamesWhoseItIs) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
  auto environment = read_launch_environment();
  EXPECT_EQ(environment.master_port_variable, "MASTER_PORT");
  EXPECT_FALSE(environment.under_torchrun);
  EXPECT_CONTAINS(port_in_use_message(environment), "MASTER_PORT=29500 is already in use");
  EXPECT_CONTAINS(port_in_use_message(environment), "set MASTER_PORT to a free port on every rank");
  set({{"TORCHELASTIC_RUN_ID", "job"}});
  environment = read_launch_environment();
  EXPECT_TRUE(environment.under_torchrun);
  EXPECT_CONTAINS(port_in_use_message(environment), "MASTER_PORT=29500 is taken by torchrun's agent");
  EXPECT_CONTAINS(port_in_use_message(environment), "CO2_MASTER_PORT");
  set({{"CO2_MASTER_PORT", "29612"}});  // co2's own port under torchrun: not the agent's
  EXPECT_CONTAINS(port_in_use_message(read_launch_environment()), "CO2_MASTER_PORT=29612 is already in use");
}

TEST_F(LaunchEnvironmentTest, SingleHostWithoutMasterAddrUsesLoopback) {
  set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  const auto environment = read_launch_environment();
  EXPECT_EQ(environment.master_addr, "127.0.0.1");
  EXPECT_EQ(environment.master_port, 0);  // nobody said, nothing to derive it from
}

TEST_F(LaunchEnvironmentTest, MalformedTorchrunValuesNameTheVariable) {
  set({{"RANK", "abc"}, {"WORLD_SIZE", "4"}});
  EXPECT_CONTAINS(invalid_argument(), "RANK='abc' is not an integer");
  set({{"RANK", "1"}, {"WORLD_SIZE", "4x"}});
  EXPECT_CONTAINS(invalid_argument(), "WORLD_SIZE='4x'");
  set({{"WORLD_SIZE", ""}});
  EXPECT_CONTAINS(invalid_argument(), "WORLD_SIZE=''");
  set({{"WORLD_SIZE", "0"}});
  EXPECT_CONTAINS(invalid_argument(), "WORLD_SIZE='0' is out of range");
  set({{"WORLD_SIZE", "4"}, {"RANK", "-1"}});
  EXPECT_CONTAINS(invalid_argument(), "RANK='-1' is out of range");
  set({{"RANK", "99999999999999999999"}});
  EXPECT_CONTAINS(invalid_argument(), "RANK=");
  set({{"RANK", "4"}});
  EXPECT_CONTAINS(invalid_argument(), "rank 4 is not below the world size 4");
  set({{"RANK", "3"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_CONTAINS(invalid_argument(), "local rank 2 is not below the local world size 2");
  set({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_CONTAINS(invalid_argument(), "local world size 8 exceeds the world size 4");
  set({{"LOCAL_WORLD_SIZE", "4"}, {"MASTER_PORT", "65536"}});
  EXPECT_CONTAINS(invalid_argument(), "MASTER_PORT='65536' is out of range");
  set({{"MASTER_PORT", "29500"}, {"CO2_MASTER_PORT", "port"}});
  EXPECT_CONTAINS(invalid_argument(), "CO2_MASTER_PORT='port' is not an integer");
  set({{"CO2_MASTER_PORT", "0"}});
  EXPECT_CONTAINS(invalid_argument(), "CO2_MASTER_PORT='0'");
  set({{"CO2_MASTER_PORT", "1234"}, {"MASTER_ADDR", ""}});
  EXPECT_CONTAINS(invalid_argument(), "MASTER_ADDR='' is empty");
}

TEST_F(LaunchEnvironmentTest, RankWithoutWorldSizeIsAnError) {
  set({{"RANK", "0"}});
  EXPECT_CONTAINS(invalid_argument(), "WORLD_SIZE is not set");
  ::unsetenv("RANK");
  set({{"WORLD_SIZE", "2"}});
  EXPECT_CONTAINS(invalid_argument(), "RANK is not set");
  set({{"RANK", "0"}, {"LOCAL_RANK", "0"}});
  EXPECT_CONTAINS(invalid_argument(), "LOCAL_WORLD_SIZE is not set");
}

TEST_F(LaunchEnvironmentTest, OpenMpiOnOneHost) {
  set({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}, {"OMPI_MCA_ess_base_jobid", "1227554817"}});
  const auto environment = read_launch_environment();
  EXPECT_TRUE(environment.present);
  EXPECT_EQ(environment.source, "openmpi");
  EXPECT_EQ(environment.rank, 2);
  EXPECT_EQ(environment.world_size, 4);
  EXPECT_EQ(environment.local_rank, 2);
  EXPECT_EQ(environment.local_world_size, 4);
  EXPECT_EQ(environment.master_addr, "127.0.0.1");
  // Derived from the job id: the same on every rank of the job, in the documented range.
  EXPECT_GE(environment.master_port, 10000);
  EXPECT_LT(environment.master_port, 30000);
  const uint16_t derived = environment.master_port;
  EXPECT_EQ(read_launch_environment().master_port, derived);
  set({{"OMPI_MCA_ess_base_jobid", "1227620353"}});
  EXPECT_NE(read_launch_environment().master_port, derived) << "another job, (almost surely) another port";
  set({{"MASTER_PORT", "23456"}});
  EXPECT_EQ(read_launch_environment().master_port, 23456);
}

TEST_F(LaunchEnvironmentTest, OpenMpiAcrossHostsNeedsMasterAddr) {
  set({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  auto environment = read_launch_environment();
  EXPECT_EQ(environment.master_addr, "");  // unknown: the caller reports it
  EXPECT_EQ(environment.master_port, 0);
  set({{"MASTER_ADDR", "head-node"}, {"MASTER_PORT", "29400"}});
  environment = read_launch_environment();
  EXPECT_EQ(environment.master_addr, "head-node");
  EXPECT_EQ(environment.master_port, 29400);
}

TEST_F(LaunchEnvironmentTest, MalformedOpenMpiValuesNameTheVariable) {
  set({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "one"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_CONTAINS(invalid_argument(), "OMPI_COMM_WORLD_LOCAL_RANK='one'");
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  set({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_CONTAINS(invalid_argument(), "OMPI_COMM_WORLD_LOCAL_SIZE is not set");
}

TEST_F(LaunchEnvironmentTest, SlurmJobStep) {
  set({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "7"}, {"SLURM_NTASKS", "99"},
       {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"}, {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
       {"SLURM_JOB_ID", "481516"}, {"SLURM_STEP_NODELIST", "gpu[03-05,9],login1"}});
  auto environment = read_launch_environment();
  EXPECT_TRUE(environment.present);
  EXPECT_EQ(environment.source, "slurm");
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.world_size, 7);  // the step's, not the allocation's
  EXPECT_EQ(environment.local_rank, 1);
  EXPECT_EQ(environment.local_world_size, 2);
  EXPECT_EQ(environment.master_addr, "gpu03");
  EXPECT_GE(environment.master_port, 10000);
  EXPECT_LT(environment.master_port, 30000);

  set({{"SLURM_NODEID", "3"}, {"SLURM_PROCID", "6"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(read_launch_environment().local_world_size, 1);  // the ",1" node
  set({{"SLURM_STEP_NODELIST", "a-[7-8]-ib,b"}});
  EXPECT_EQ(read_launch_environment().master_addr, "a-7-ib");
  set({{"SLURM_STEP_NODELIST", "single"}, {"MASTER_ADDR", "explicit"}, {"CO2_MASTER_PORT", "4242"}});
  environment = read_launch_environment();
  EXPECT_EQ(environment.master_addr, "explicit");
  EXPECT_EQ(environment.master_port, 4242);
}

TEST_F(LaunchEnvironmentTest, SlurmBatchScriptIsNotAJobStep) {
  // sbatch's own script has SLURM_PROCID=0 and the allocation's task count, but no step.
  set({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "1"}});
  EXPECT_FALSE(read_launch_environment().present);
}

TEST_F(LaunchEnvironmentTest, MalformedSlurmValuesNameTheVariable) {
  set({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "4(x"}});
  EXPECT_CONTAINS(invalid_argument(), "SLURM_TASKS_PER_NODE='4(x'");
  set({{"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NODEID", "2"}});
  EXPECT_CONTAINS(invalid_argument(), "lists no node 2");
  set({{"SLURM_NODEID", "0"}, {"SLURM_NTASKS", "four"}});
  EXPECT_CONTAINS(invalid_argument(), "SLURM_NTASKS='four'");
}

TEST_F(LaunchEnvironmentTest, TorchrunNamesWinOverMpiAndSlurm) {
  // torchrun inside an Slurm allocation, or mpirun running torchrun-style programs.
  set({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"},
       {"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "3"}});
  auto environment = read_launch_environment();
  EXPECT_EQ(environment.source, "torchrun/co2run");
  EXPECT_EQ(environment.rank, 1);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  set({{"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
  EXPECT_EQ(read_launch_environment().source, "openmpi");
}

// read_node_name(): which node each launcher family says a rank is on.
std::string this_host() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

TEST_F(LaunchEnvironmentTest, NodeOfTorchrunAndCo2runIsGroupRank) {
  set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "7"}});
  NodeName node = read_node_name();
  EXPECT_EQ(node.id, 7);  // GROUP_RANK wins over the derivation ((5 - 1) / 4 = 1)
  EXPECT_EQ(node.source, "GROUP_RANK");
  ::unsetenv("GROUP_RANK");
  node = read_node_name();
  EXPECT_EQ(node.id, 1);
  EXPECT_EQ(node.source, "(RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE");
  set({{"RANK", "2"}, {"LOCAL_RANK", "2"}});
  EXPECT_EQ(read_node_name().id, 0);
}

TEST_F(LaunchEnvironmentTest, NodeFallsBackToTheHostName) {
  NodeName node = read_node_name();  // no launcher
  EXPECT_EQ(node.id, -1);
  EXPECT_EQ(node.host, this_host());
  EXPECT_CONTAINS(node.source, "no launcher");
  // Ranks not numbered node by node: no derivation.
  set({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}});
  node = read_node_name();
  EXPECT_EQ(node.id, -1);
  EXPECT_EQ(node.host, this_host());
  EXPECT_CONTAINS(node.source, "not a multiple of LOCAL_WORLD_SIZE");
  ::unsetenv("LOCAL_RANK");
  ::unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(read_node_name().id, -1);
  // Open MPI: its NODE_RANK counts ranks within a node, so it is not used even when Slurm's
  // variables are inherited too.
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  set({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"SLURM_PROCID", "0"},
       {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "5"}});
  node = read_node_name();
  EXPECT_EQ(node.id, -1);
  EXPECT_CONTAINS(node.source, "Open MPI");
}

TEST_F(LaunchEnvironmentTest, NodeOfASlurmJobStepIsSlurmNodeid) {
  set({{"SLURM_PROCID", "5"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "2"}});
  NodeName node = read_node_name();
  EXPECT_EQ(node.id, 2);
  EXPECT_EQ(node.source, "SLURM_NODEID");
  ::unsetenv("SLURM_STEP_ID");  // the batch script: not a launched rank
  EXPECT_EQ(read_node_name().id, -1);
}

TEST_F(LaunchEnvironmentTest, MalformedNodeVariablesNameTheVariable) {
  const auto message = [] {
    try {
      read_node_name();
    } catch (const Error& error) {
      EXPECT_EQ(error.status(), Status::InvalidArgument);
      return std::string(error.what());
    }
    return std::string();
  };
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"GROUP_RANK", "node1"}});
  EXPECT_CONTAINS(message(), "GROUP_RANK='node1' is not an integer");
  set({{"GROUP_RANK", "-1"}});
  EXPECT_CONTAINS(message(), "GROUP_RANK='-1' is out of range");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  set({{"SLURM_PROCID", "0"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_CONTAINS(message(), "SLURM_NODEID is not set");
}

TEST_F(LaunchEnvironmentTest, RankZeroListensOnMasterAddrUnlessCo2StoreBindSaysOtherwise) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}});
  std::string why;
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "127.0.0.1");
  EXPECT_EQ(why, "");
  set({{"CO2_STORE_BIND", "*"}});
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "") << "'*' is every address";
  set({{"CO2_STORE_BIND", "127.0.0.2"}});
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "127.0.0.2");
  set({{"CO2_STORE_BIND", ""}});
  EXPECT_CONTAINS(invalid_argument(), "CO2_STORE_BIND");
}

TEST_F(LaunchEnvironmentTest, AMasterAddrOtherHostsCannotUseHereMeansEveryAddress) {
  // 192.0.2.1 (TEST-NET-1) is no address of this host: a NAT or a balancer in front of rank 0.
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"},
       {"MASTER_ADDR", "192.0.2.1"}, {"MASTER_PORT", "29500"}});
  std::string why;
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "");
  EXPECT_CONTAINS(why, "not an address of rank 0's host");
  // Loopback while the ranks span hosts: the other hosts could never reach it.
  set({{"MASTER_ADDR", "127.0.1.1"}});
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "");
  EXPECT_CONTAINS(why, "loopback");
  // On one host, loopback is right.
  set({{"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(choose_store_bind(read_launch_environment(), why), "127.0.1.1");
  EXPECT_EQ(why, "");
}

}  // namespace
}  // namespace co2::store

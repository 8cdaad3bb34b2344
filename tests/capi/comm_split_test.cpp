// co2_comm_split on the local transport (ranks are threads): groups by color, ranks by (key,
// parent rank), CO2_SPLIT_NONE joins none, the parent stays usable, bad arguments are refused.
// co2_comm_split_nodes on the same: nodes from explicit node ids (config or the parent's),
// an older header's config, unequal and mixed nodes refused on every rank.
// The same over real processes (UCX) is tests/capi/multiprocess/split_worker.cpp and
// split_nodes_worker.cpp.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "rank_threads.hpp"

namespace {

using co2test::run_ranks;

// Sum over a communicator of one int64 per rank.
int64_t sum_over(co2_comm_t comm, int64_t value) {
  co2_request_t request = nullptr;
  EXPECT_EQ(co2_allreduce(comm, &value, 1, CO2_DTYPE_INT64, CO2_REDUCE_SUM, nullptr, &request), CO2_OK)
      << co2_last_error_message();
  EXPECT_EQ(co2_request_wait(request, 60000), CO2_OK) << co2_last_error_message();
  co2_request_free(request);
  return value;
}

TEST(CommSplit, GroupsByColorAndRanksByKey) {
  constexpr int kWorld = 6;
  run_ranks(kWorld, [](int rank, co2_comm_t parent) {
    // Three colors of two; the key reverses the parent order inside each color.
    const int color = rank % 3;
    co2_comm_t sub = nullptr;
    CO2_ASSERT_OK(co2_comm_split(parent, color, -rank, nullptr, &sub));
    ASSERT_NE(sub, nullptr);
    int32_t sub_rank = -1, sub_size = -1;
    CO2_ASSERT_OK(co2_comm_rank(sub, &sub_rank));
    CO2_ASSERT_OK(co2_comm_size(sub, &sub_size));
    EXPECT_EQ(sub_size, 2);
    EXPECT_EQ(sub_rank, rank < 3 ? 1 : 0);  // the larger parent rank has the smaller key
    // Only the members of this color are summed: color c holds parent ranks c and c + 3.
    EXPECT_EQ(sum_over(sub, rank), 2 * color + 3);
    co2_comm_destroy(sub);
    EXPECT_EQ(sum_over(parent, 1), 6);  // the parent still works
  });
}

TEST(CommSplit, NoneJoinsNoGroupAndEqualKeysKeepParentOrder) {
  run_ranks(4, [](int rank, co2_comm_t parent) {
    const int color = rank == 2 ? CO2_SPLIT_NONE : 7;
    co2_comm_t sub = reinterpret_cast<co2_comm_t>(0x1);
    CO2_ASSERT_OK(co2_comm_split(parent, color, 0, nullptr, &sub));
    if (color == CO2_SPLIT_NONE) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    int32_t sub_rank = -1, sub_size = -1;
    CO2_ASSERT_OK(co2_comm_rank(sub, &sub_rank));
    CO2_ASSERT_OK(co2_comm_size(sub, &sub_size));
    EXPECT_EQ(sub_size, 3);
    EXPECT_EQ(sub_rank, rank < 2 ? rank : rank - 1);
    EXPECT_EQ(sum_over(sub, 1 << rank), 1 + 2 + 8);
    co2_comm_destroy(sub);
  });
}

// Two splits of one parent, as a hierarchy needs: the ranks of a "node" and the ranks with one
// local rank across nodes. Both live at the same time.
TEST(CommSplit, NodesAndLanesOfATwoByTwoGroup) {
  run_ranks(4, [](int rank, co2_comm_t parent) {
    const int node = rank / 2, local = rank % 2;
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_ASSERT_OK(co2_comm_split(parent, node, local, nullptr, &intra));
    CO2_ASSERT_OK(co2_comm_split(parent, local, node, nullptr, &inter));
    int32_t r = -1;
    CO2_EXPECT_OK(co2_comm_rank(intra, &r));
    EXPECT_EQ(r, local);
    CO2_EXPECT_OK(co2_comm_rank(inter, &r));
    EXPECT_EQ(r, node);
    EXPECT_EQ(sum_over(intra, rank), node == 0 ? 0 + 1 : 2 + 3);
    EXPECT_EQ(sum_over(inter, rank), local == 0 ? 0 + 2 : 1 + 3);
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
  });
}

// Rank and size of a communicator, as {rank, size}.
std::pair<int32_t, int32_t> place(co2_comm_t comm) {
  int32_t rank = -1, size = -1;
  EXPECT_EQ(co2_comm_rank(comm, &rank), CO2_OK);
  EXPECT_EQ(co2_comm_size(comm, &size), CO2_OK);
  return {rank, size};
}

co2_comm_config_t with_node(int32_t node_id) {
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.node_id = node_id;
  return config;
}

// Node ids need be neither small nor in rank order: nodes are numbered by their lowest rank.
TEST(CommSplitNodes, NodesAreNumberedByTheirLowestRank) {
  run_ranks(4, [](int rank, co2_comm_t parent) {
    const int32_t ids[] = {50, 50, 7, 7};
    const co2_comm_config_t config = with_node(ids[rank]);
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_ASSERT_OK(co2_comm_split_nodes(parent, &config, &intra, &inter));
    const int node = rank / 2, local = rank % 2;
    EXPECT_EQ(place(intra), std::make_pair(int32_t(local), int32_t(2)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(node), int32_t(2)));
    EXPECT_EQ(sum_over(intra, 1 << rank), node == 0 ? 1 + 2 : 4 + 8);   // only the node's ranks
    EXPECT_EQ(sum_over(inter, 1 << rank), local == 0 ? 1 + 4 : 2 + 8);  // only this local index
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
    EXPECT_EQ(sum_over(parent, 1), 4);  // the parent still works
  });
}

// Ranks of a node need not be contiguous (mpirun --map-by node): they are ranked by parent rank.
TEST(CommSplitNodes, InterleavedNodes) {
  run_ranks(6, [](int rank, co2_comm_t parent) {
    const co2_comm_config_t config = with_node(rank % 2);
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_ASSERT_OK(co2_comm_split_nodes(parent, &config, &intra, &inter));
    EXPECT_EQ(place(intra), std::make_pair(int32_t(rank / 2), int32_t(3)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(rank % 2), int32_t(2)));
    EXPECT_EQ(sum_over(intra, rank), rank % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5);
    EXPECT_EQ(sum_over(inter, rank), 2 * (rank / 2) * 2 + 1);  // ranks 2k and 2k + 1
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
  });
}

// The node id the parent was created with is the default, and co2_comm_split passes it on.
TEST(CommSplitNodes, TheParentsNodeIdIsTheDefault) {
  const std::string group = co2test::unique_group_name();
  co2test::run_threads(4, [&](int rank) {
    co2_comm_config_t config = with_node(rank < 2 ? 1 : 0);
    config.transport = CO2_TRANSPORT_LOCAL;
    config.rank = rank;
    config.world_size = 4;
    config.group_name = group.c_str();
    config.timeout_ms = 60000;
    co2_comm_t parent = nullptr, child = nullptr, intra = nullptr, inter = nullptr;
    CO2_ASSERT_OK(co2_comm_create(&config, &parent));
    CO2_ASSERT_OK(co2_comm_split(parent, 0, -rank, nullptr, &child));  // reversed ranks, same nodes
    CO2_ASSERT_OK(co2_comm_split_nodes(child, nullptr, &intra, &inter));
    // Child rank 3 - rank: node of the lowest child rank (parent rank 3, id 0) comes first.
    const int child_rank = 3 - rank;
    EXPECT_EQ(place(intra), std::make_pair(int32_t(child_rank % 2), int32_t(2)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(child_rank / 2), int32_t(2)));
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
    // A config's node_id overrides the parent's: all on one node.
    const co2_comm_config_t one_node = with_node(3);
    CO2_ASSERT_OK(co2_comm_split_nodes(parent, &one_node, &intra, &inter));
    EXPECT_EQ(place(intra), std::make_pair(int32_t(rank), int32_t(4)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(0), int32_t(1)));
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
    co2_comm_destroy(child);
    co2_comm_destroy(parent);
  });
}

// A caller built against a header without node_id passes a smaller size: whatever lies after
// it is not read, and the node is AUTO (here, with no launcher: this host, so one node).
TEST(CommSplitNodes, AnOlderHeadersConfigMeansAuto) {
  run_ranks(4, [](int rank, co2_comm_t parent) {
    co2_comm_config_t config = with_node(rank % 2);  // would make two nodes if it were read
    config.size = offsetof(co2_comm_config_t, node_id);
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_ASSERT_OK(co2_comm_split_nodes(parent, &config, &intra, &inter));
    EXPECT_EQ(place(intra), std::make_pair(int32_t(rank), int32_t(4)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(0), int32_t(1)));
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
  });
}

TEST(CommSplitNodes, UnequalNodesFailOnEveryRankNamingTheSizes) {
  run_ranks(4, [](int rank, co2_comm_t parent) {
    const co2_comm_config_t config = with_node(rank < 3 ? 0 : 1);
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(parent, &config, &intra, &inter));
    const std::string message = co2_last_error_message();
    EXPECT_NE(message.find("node 0 (node id 0 from co2_comm_config_t.node_id) has 3 ranks; "
                           "node 1 (node id 1 from co2_comm_config_t.node_id) has 1 rank"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("same number of ranks on every node"), std::string::npos) << message;
    EXPECT_EQ(intra, nullptr);
    EXPECT_EQ(inter, nullptr);
    EXPECT_EQ(sum_over(parent, 1), 4);  // nothing was left half-formed
  });
}

// Whether a launcher's variables are set (this test program itself run under srun, mpirun or
// torchrun): then AUTO resolves to the launcher's node id instead of the host name.
bool launched() {
  for (const char* name : {"RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_ID"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

TEST(CommSplitNodes, IdsOnSomeRanksAndHostNamesOnOthersAreRefused) {
  if (launched()) GTEST_SKIP() << "a launcher's node id stands in for the host name here";
  run_ranks(2, [](int rank, co2_comm_t parent) {
    const co2_comm_config_t config = with_node(rank == 0 ? 0 : CO2_NODE_ID_AUTO);
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(parent, &config, &intra, &inter));
    EXPECT_NE(std::string(co2_last_error_message()).find("rank 1 only its host name"), std::string::npos)
        << co2_last_error_message();
  });
}

TEST(CommSplitNodes, BadArgumentsAreRefusedBeforeAnyCollective) {
  run_ranks(1, [](int, co2_comm_t parent) {
    co2_comm_t intra = nullptr, inter = nullptr;
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(nullptr, nullptr, &intra, &inter));
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(parent, nullptr, nullptr, &inter));
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(parent, nullptr, &intra, nullptr));
    const co2_comm_config_t config = with_node(-2);
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split_nodes(parent, &config, &intra, &inter));
    EXPECT_NE(std::string(co2_last_error_message()).find("node_id"), std::string::npos);
    // A group of one is one node of one rank.
    CO2_ASSERT_OK(co2_comm_split_nodes(parent, nullptr, &intra, &inter));
    EXPECT_EQ(place(intra), std::make_pair(int32_t(0), int32_t(1)));
    EXPECT_EQ(place(inter), std::make_pair(int32_t(0), int32_t(1)));
    co2_comm_destroy(intra);
    co2_comm_destroy(inter);
  });
}

TEST(CommSplit, BadArgumentsAreRefusedBeforeAnyCollective) {
  run_ranks(1, [](int, co2_comm_t parent) {
    co2_comm_t sub = nullptr;
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split(parent, -2, 0, nullptr, &sub));
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split(nullptr, 0, 0, nullptr, &sub));
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split(parent, 0, 0, nullptr, nullptr));
    co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
    config.timeout_ms = 0;
    CO2_EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_split(parent, 0, 0, &config, &sub));
    config = CO2_COMM_CONFIG_INIT;
    config.transport = co2_transport_kind_t(42);
    CO2_EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_comm_split(parent, 0, 0, &config, &sub));
    // A group of one splits into a group of one.
    CO2_ASSERT_OK(co2_comm_split(parent, 0, 0, nullptr, &sub));
    ASSERT_NE(sub, nullptr);
    co2_comm_destroy(sub);
  });
}

}  // namespace

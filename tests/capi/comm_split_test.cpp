// co2_comm_split on the local transport (ranks are threads): groups by color, ranks by (key,
// parent rank), CO2_SPLIT_NONE joins none, the parent stays usable, bad arguments are refused.
// The same over real processes (UCX) is tests/capi/multiprocess/split_worker.cpp.
#include <gtest/gtest.h>

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

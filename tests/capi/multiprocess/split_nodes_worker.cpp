// One process of a 2 x 2 "cluster" under `co2run --nnodes 2 --nproc-per-node 2` (transport AUTO
// -> UCX): co2_comm_split_nodes with the node from the launcher (GROUP_RANK), then with an
// explicit node_id that overrides it, then with unequal nodes and with one rank's malformed
// GROUP_RANK (both refused on every rank). Checks
// ranks, sizes and an all-reduce over each new communicator. Exits 0 when everything matched,
// 1 otherwise (with the reason).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "co2/co2.h"
#include "worker_checks.hpp"

namespace {


int integer_variable(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::atoi(value) : -1;
}

// Splits `world` by node and checks that this rank is local index `local` of node `node`, that
// an all-reduce over the node sums `node_sum` and one over the local index `lane_sum`.
int check_split(co2_comm_t world, const co2_comm_config_t* config, int64_t rank, int node, int local,
                int64_t node_sum, int64_t lane_sum, const char* what) {
  co2_comm_t intra = nullptr, inter = nullptr;
  CHECK_OK(co2_comm_split_nodes(world, config, &intra, &inter));
  int32_t r = -1, n = -1;
  CHECK_OK(co2_comm_rank(intra, &r));
  CHECK_OK(co2_comm_size(intra, &n));
  expect(r == local && n == 2, what, r, local);
  CHECK_OK(co2_comm_rank(inter, &r));
  CHECK_OK(co2_comm_size(inter, &n));
  expect(r == node && n == 2, what, r, node);
  int64_t in_node = rank, in_lane = rank;
  if (sum_over(intra, &in_node) || sum_over(inter, &in_lane)) return 1;
  expect(in_node == node_sum, what, long(in_node), long(node_sum));
  expect(in_lane == lane_sum, what, long(in_lane), long(lane_sum));
  co2_comm_destroy(intra);
  co2_comm_destroy(inter);
  return 0;
}

}  // namespace

int main() {
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = 60000;
  co2_comm_t world = nullptr;
  CHECK_OK(co2_comm_create(&config, &world));
  int32_t rank = -1, size = -1;
  CHECK_OK(co2_comm_rank(world, &rank));
  CHECK_OK(co2_comm_size(world, &size));
  const int group_rank = integer_variable("GROUP_RANK"), local_rank = integer_variable("LOCAL_RANK");
  if (size != 4 || group_rank != rank / 2 || local_rank != rank % 2) {
    std::fprintf(stderr, "run me under co2run --nnodes 2 --nproc-per-node 2 (size %d, GROUP_RANK %d, LOCAL_RANK %d)\n",
                 int(size), group_rank, local_rank);
    return 1;
  }

  // The launcher's nodes: {0, 1} and {2, 3}.
  if (check_split(world, nullptr, rank, group_rank, local_rank, group_rank == 0 ? 0 + 1 : 2 + 3,
                  local_rank == 0 ? 0 + 2 : 1 + 3, "launcher's nodes"))
    return 1;

  // An explicit node_id wins over GROUP_RANK: nodes {0, 2} and {1, 3}.
  co2_comm_config_t explicit_nodes = CO2_COMM_CONFIG_INIT;
  explicit_nodes.node_id = rank % 2;
  if (check_split(world, &explicit_nodes, rank, rank % 2, rank / 2, rank % 2 == 0 ? 0 + 2 : 1 + 3,
                  rank / 2 == 0 ? 0 + 1 : 2 + 3, "explicit node_id"))
    return 1;

  // Nodes of 3 and 1 ranks: every rank fails, naming the sizes, and the world still works.
  co2_comm_config_t unequal = CO2_COMM_CONFIG_INIT;
  unequal.node_id = rank == 3 ? 1 : 0;
  co2_comm_t intra = nullptr, inter = nullptr;
  const co2_status_t status = co2_comm_split_nodes(world, &unequal, &intra, &inter);
  std::string message = co2_last_error_message();
  expect(status == CO2_ERR_INVALID_ARGUMENT, "unequal nodes: status", long(status), long(CO2_ERR_INVALID_ARGUMENT));
  if (message.find("has 3 ranks") == std::string::npos || message.find("has 1 rank") == std::string::npos) {
    std::fprintf(stderr, "unequal nodes: the message does not name the sizes: %s\n", message.c_str());
    ++failures;
  }
  // A rank that cannot tell its node (a malformed GROUP_RANK on rank 3 alone): every rank fails
  // with its reason at once, instead of the others waiting out the timeout.
  if (rank == 3) setenv("GROUP_RANK", "x", 1);
  const co2_status_t broken = co2_comm_split_nodes(world, nullptr, &intra, &inter);
  message = co2_last_error_message();
  expect(broken == CO2_ERR_INVALID_ARGUMENT, "malformed GROUP_RANK: status", long(broken),
         long(CO2_ERR_INVALID_ARGUMENT));
  if (message.find("rank 3 cannot tell its node: environment variable GROUP_RANK='x'") == std::string::npos) {
    std::fprintf(stderr, "malformed GROUP_RANK: the message does not say which rank and why: %s\n", message.c_str());
    ++failures;
  }

  int64_t in_world = 1;
  if (sum_over(world, &in_world)) return 1;
  expect(in_world == 4, "sum over the world", long(in_world), 4);

  co2_comm_destroy(world);
  if (failures == 0) std::printf("rank %d: split_nodes ok\n", int(rank));
  return failures == 0 ? 0 : 1;
}

// One process of a 2 x 2 "cluster" under co2run (transport AUTO -> UCX): forms the group from the
// launcher's environment, splits it into nodes (color = node, key = local rank) and lanes
// (color = local rank, key = node) with co2_comm_split, and checks ranks, sizes and an
// all-reduce over each. Exits 0 when everything matched, 1 otherwise (with the reason).
#include <cstdio>
#include <cstdlib>

#include "co2/co2.h"
#include "worker_checks.hpp"

int main() {
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = 60000;
  co2_comm_t world = nullptr, node_comm = nullptr, lane_comm = nullptr;
  CHECK_OK(co2_comm_create(&config, &world));
  int32_t rank = -1, size = -1;
  CHECK_OK(co2_comm_rank(world, &rank));
  CHECK_OK(co2_comm_size(world, &size));
  if (size != 4) {
    std::fprintf(stderr, "run me with 4 ranks (got %d)\n", size);
    return 1;
  }
  const int node = rank / 2, local = rank % 2;
  CHECK_OK(co2_comm_split(world, node, local, nullptr, &node_comm));
  CHECK_OK(co2_comm_split(world, local, node, nullptr, &lane_comm));
  int32_t r = -1, n = -1;
  CHECK_OK(co2_comm_rank(node_comm, &r));
  CHECK_OK(co2_comm_size(node_comm, &n));
  expect(r == local && n == 2, "node rank", r, local);
  CHECK_OK(co2_comm_rank(lane_comm, &r));
  CHECK_OK(co2_comm_size(lane_comm, &n));
  expect(r == node && n == 2, "lane rank", r, node);
  int64_t in_node = rank, in_lane = rank, in_world = 1;
  if (sum_over(node_comm, &in_node) || sum_over(lane_comm, &in_lane) || sum_over(world, &in_world)) return 1;
  expect(in_node == (node == 0 ? 1 : 5), "sum over the node", long(in_node), node == 0 ? 1 : 5);
  expect(in_lane == (local == 0 ? 2 : 4), "sum over the lane", long(in_lane), local == 0 ? 2 : 4);
  expect(in_world == 4, "sum over the world", long(in_world), 4);
  co2_comm_destroy(node_comm);
  co2_comm_destroy(lane_comm);
  co2_comm_destroy(world);
  if (failures == 0) std::printf("rank %d: split ok\n", int(rank));
  return failures == 0 ? 0 : 1;
}

// One process of a 2 x 2 cluster under `co2run --nnodes 2 --nproc-per-node 2` (transport AUTO
// -> UCX, the node from GROUP_RANK): hierarchical co2 with every step's gradients averaged inside
// the node. Checks that all four ranks end with the same anchor, bit for bit; that it equals, to
// fp32 rounding, flat co2 over two ranks whose gradients are their node's average (run here, in
// threads on the local transport); that the outer state is sharded over the node's two ranks;
// and that ranks of a node that skip the intra-node average fail loudly on every rank.
// Exits 0 when everything matched, 1 otherwise (with the reason).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#include "worker_checks.hpp"

namespace {

const size_t kCounts[] = {1003, 17, 9};  // the last one a BUFFER
const bool kTrained[] = {true, true, false};
constexpr int kTau = 3, kSteps = 16;

float gradient(size_t t, size_t i, int step, int who) {
  return std::sin(0.013f * float(i) + 0.31f * float(step) + 0.7f * float(who) + float(t));
}

co2_engine_config_t config_of(int hierarchy, int eager) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.tau = kTau;
  c.outer_lr = 0.7;
  c.outer_momentum = 0.6;
  c.nesterov = 1;
  c.eager = eager;
  c.anchor_check_interval = 2;
  c.hierarchy = hierarchy;
  return c;
}

// Trains one rank. average_in_node: PARAMETER gradients through co2_engine_reduce_gradients;
// who(step): whose gradients this rank takes (the node's average is the flat reference's).
// Returns the status of the first failing call; *anchor gets the anchor consensus.
co2_status_t train(co2_comm_t comm, const co2_engine_config_t& config, bool average_in_node,
                   int rank, int node, bool reference, std::vector<float>* anchor, uint64_t* state_bytes) {
  co2_engine_t engine = nullptr;
  co2_status_t s = co2_engine_create(comm, &config, &engine);
  std::vector<std::vector<float>> p(3);
  for (size_t t = 0; t < 3 && s == CO2_OK; ++t) {
    p[t].resize(kCounts[t]);
    for (size_t i = 0; i < kCounts[t]; ++i) p[t][i] = 0.01f * float(i % 89) - 0.4f + 0.1f * float(t);
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    const char* names[] = {"w", "b", "stats"};
    tensor.name = names[t];
    tensor.data = p[t].data();
    tensor.count = kCounts[t];
    tensor.role = kTrained[t] ? CO2_ROLE_PARAMETER : CO2_ROLE_BUFFER;
    s = co2_engine_register_tensor(engine, &tensor);
  }
  if (s == CO2_OK) s = co2_engine_commit(engine);
  for (int step = 0; step < kSteps && s == CO2_OK; ++step) {
    std::vector<std::vector<float>> g(3);
    std::vector<void*> trained;
    for (size_t t = 0; t < 3; ++t) {
      g[t].resize(kCounts[t]);
      for (size_t i = 0; i < kCounts[t]; ++i) {
        if (!kTrained[t]) g[t][i] = gradient(t, i, step, node);  // a node's buffers move together
        else if (reference) g[t][i] = (gradient(t, i, step, 2 * node) + gradient(t, i, step, 2 * node + 1)) * 0.5f;
        else g[t][i] = gradient(t, i, step, rank);
        g[t][i] += 0.5f * p[t][i];  // the trajectory depends on where each round starts
      }
      if (kTrained[t]) trained.push_back(g[t].data());
    }
    if (average_in_node) s = co2_engine_reduce_gradients(engine, trained.data(), trained.size(), nullptr);
    for (size_t t = 0; t < 3 && s == CO2_OK; ++t)
      for (size_t i = 0; i < kCounts[t]; ++i) p[t][i] -= (kTrained[t] ? 0.05f : 0.02f) * g[t][i];
    if (s == CO2_OK) s = co2_engine_step(engine, nullptr, nullptr);
  }
  if (s == CO2_OK) s = co2_engine_finalize(engine);
  size_t n = 0;
  if (s == CO2_OK) s = co2_engine_num_elements(engine, &n);
  if (s == CO2_OK && anchor) {
    anchor->resize(n);
    s = co2_engine_consensus(engine, CO2_CONSENSUS_ANCHOR, anchor->data(), n);
  }
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  if (s == CO2_OK && state_bytes) {
    s = co2_engine_get_stats(engine, &stats);
    *state_bytes = stats.outer_state_bytes;
  }
  co2_engine_destroy(engine);
  return s;
}

int64_t as_int(uint64_t v) {
  int64_t out;
  std::memcpy(&out, &v, sizeof out);
  return out;
}

}  // namespace

int main() {
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = 60000;
  co2_comm_t world = nullptr;
  CHECK_OK(co2_comm_create(&config, &world));
  int32_t rank = -1;
  CHECK_OK(co2_comm_rank(world, &rank));
  const char* group = std::getenv("GROUP_RANK");
  const int node = group ? std::atoi(group) : -1;
  if (node != rank / 2) {
    std::fprintf(stderr, "rank %d: expected node %d from co2run, got GROUP_RANK=%s\n", rank, rank / 2, group ? group : "(unset)");
    return 1;
  }

  // The delayed update, then the eager policy (a node's ranks share one offset, sharded).
  uint64_t hash = 0;
  for (int eager : {0, 1}) {
    // 1. Hierarchical co2 over UCX processes.
    std::vector<float> anchor;
    uint64_t state_bytes = 0;
    CHECK_OK(train(world, config_of(CO2_HIERARCHY_NODES, eager), true, rank, node, false, &anchor, &state_bytes));

    // 2. The same anchor on every rank, bit for bit (a hash, min and max over the ranks).
    hash = 1469598103934665603ull;
    for (float v : anchor) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      hash = (hash ^ bits) * 1099511628211ull;
    }
    int64_t lo = as_int(hash), hi = as_int(hash);
    if (reduce_over(world, &lo, CO2_REDUCE_MIN) || reduce_over(world, &hi, CO2_REDUCE_MAX)) return 1;
    if (lo != hi) {
      std::fprintf(stderr, "rank %d: the ranks' anchors differ\n", rank);
      ++failures;
    }

    // 3. Flat co2 over two ranks (threads, local transport) with the nodes' average gradients.
    std::vector<std::vector<float>> reference(2);
    std::vector<co2_status_t> statuses(2, CO2_OK);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        co2_comm_config_t local = CO2_COMM_CONFIG_INIT;
        local.transport = CO2_TRANSPORT_LOCAL;
        local.rank = r;
        local.world_size = 2;
        const std::string name = "hierarchical-reference-" + std::to_string(rank) + "-" + std::to_string(eager);
        local.group_name = name.c_str();
        co2_comm_t comm = nullptr;
        statuses[size_t(r)] = co2_comm_create(&local, &comm);
        if (statuses[size_t(r)] == CO2_OK)
          statuses[size_t(r)] = train(comm, config_of(CO2_HIERARCHY_FLAT, eager), false, r, r, true, &reference[size_t(r)], nullptr);
        co2_comm_destroy(comm);
      });
    for (auto& t : threads) t.join();
    for (co2_status_t s : statuses) CHECK_OK(s);
    for (size_t i = 0; i < anchor.size(); ++i)
      if (std::fabs(anchor[i] - reference[0][i]) > 2e-5f * (1.0f + std::fabs(reference[0][i]))) {
        std::fprintf(stderr, "rank %d (eager %d): anchor element %zu is %.9g, flat co2 over the nodes gives %.9g\n", rank, eager, i,
                     double(anchor[i]), double(reference[0][i]));
        ++failures;
        break;
      }

    // 4. Sharded over the node's two ranks: one model copy plus three half-size shards; eager
    // adds the round start's buffer and the offset and its momentum as shards (replicated: 3, 5).
    const double copies = double(state_bytes) / double(anchor.size() * sizeof(float));
    const double bound = eager ? 2.0 + 5.0 / 2 : 1.0 + 3.0 / 2;
    if (copies > bound + 0.01) {
      std::fprintf(stderr, "rank %d: outer state %.3f model copies, expected <= %.2f\n", rank, copies, bound);
      ++failures;
    }
  }

  // 5. Without the intra-node average the ranks of a node train different models: every rank
  // fails at the first check with a message that names the cause.
  const co2_status_t diverged = train(world, config_of(CO2_HIERARCHY_NODES, 0), false, rank, node, false, nullptr, nullptr);
  const std::string message = co2_last_error_message();
  if (diverged == CO2_OK || (diverged == CO2_ERR_ANCHOR_MISMATCH && message.find("averaged inside the node") == std::string::npos)) {
    std::fprintf(stderr, "rank %d: a node whose ranks diverged gave %s: %s\n", rank, co2_status_string(diverged),
                 message.c_str());
    ++failures;
  }
  co2_comm_destroy(world);
  if (failures == 0) std::printf("rank %d: hierarchical co2 matched (anchor hash %016llx)\n", rank, (unsigned long long)hash);
  return failures ? 1 : 0;
}

// Issue 12, item 2: collectives of the same shape must not pair across ranks when their
// purposes differ. The audit's case: one rank alone calls co2_engine_consensus(LOCAL_AVERAGE)
// while the other runs a boundary, whose all-reduce of deltas has the same (op, count, dtype).
// Both ranks must fail with CO2_ERR_COLLECTIVE_MISMATCH, promptly, naming both collectives.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "rank_threads.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// The mismatch is found at the first descriptor exchange: far sooner than this. The
// communicators' own no-progress timeout (60 s) is the fallback that must not be reached.
constexpr auto kPrompt = std::chrono::seconds(10);
constexpr size_t kCount = 256;

// An engine over one tensor "w" (params), committed (collective); null after a failure.
co2_engine_t committed_engine(co2_comm_t comm, std::vector<float>& params, const co2_engine_config_t& config) {
  co2_engine_t engine = nullptr;
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "w";
  tensor.data = params.data();
  tensor.count = params.size();
  const co2_status_t status = [&] {
    co2_status_t s = co2_engine_create(comm, &config, &engine);
    if (s == CO2_OK) s = co2_engine_register_tensor(engine, &tensor);
    if (s == CO2_OK) s = co2_engine_commit(engine);
    return s;
  }();
  EXPECT_EQ(status, CO2_OK) << co2_last_error_message();
  if (status == CO2_OK) return engine;
  co2_engine_destroy(engine);
  return nullptr;
}

// Runs the audit's case on two ranks whose communicators `make(rank, &comm)` creates.
void expect_local_average_against_boundary_is_a_mismatch(
    const std::function<co2_status_t(int, co2_comm_t*)>& make) {
  std::vector<co2_status_t> statuses(2, CO2_OK);
  std::vector<std::string> messages(2);
  std::vector<double> seconds(2, 0.0);
  co2test::run_threads(2, [&](int rank) {
    co2_comm_t comm = nullptr;
    const co2_status_t created = make(rank, &comm);
    if (created == CO2_ERR_UNSUPPORTED) {
      statuses[size_t(rank)] = created;
      return;
    }
    CO2_ASSERT_OK(created);
    std::vector<float> params(kCount, float(rank + 1));
    co2_engine_config_t config = CO2_ENGINE_CONFIG_INIT;
    config.algorithm = CO2_ALGO_CO2;
    config.tau = 1;  // every step is a boundary
    co2_engine_t engine = committed_engine(comm, params, config);
    if (!engine) return;
    for (float& p : params) p += float(rank + 1);  // some local training

    const auto start = Clock::now();
    co2_status_t status;
    if (rank == 0) {
      std::vector<float> average(kCount);
      status = co2_engine_consensus(engine, CO2_CONSENSUS_LOCAL_AVERAGE, average.data(), kCount);
    } else {
      // The boundary submits the round's all-reduce; synchronize waits for it.
      status = co2_engine_step(engine, nullptr, nullptr);
      if (status == CO2_OK) status = co2_engine_synchronize(engine);
    }
    statuses[size_t(rank)] = status;
    messages[size_t(rank)] = co2_last_error_message();
    seconds[size_t(rank)] = std::chrono::duration<double>(Clock::now() - start).count();
    co2_engine_destroy(engine);
    co2_comm_destroy(comm);
  });
  if (statuses[0] == CO2_ERR_UNSUPPORTED || statuses[1] == CO2_ERR_UNSUPPORTED)
    GTEST_SKIP() << "transport not built";
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(statuses[size_t(rank)], CO2_ERR_COLLECTIVE_MISMATCH)
        << "rank " << rank << ": " << messages[size_t(rank)];
    EXPECT_NE(messages[size_t(rank)].find("consensus"), std::string::npos) << messages[size_t(rank)];
    EXPECT_NE(messages[size_t(rank)].find("outer-average"), std::string::npos) << messages[size_t(rank)];
    EXPECT_LT(seconds[size_t(rank)], std::chrono::duration<double>(kPrompt).count()) << "rank " << rank;
  }
}

TEST(CollectiveIdentity, LocalAverageOnOneRankDuringTheOthersBoundaryIsAMismatchOnBoth) {
  const std::string group = co2test::unique_group_name();
  expect_local_average_against_boundary_is_a_mismatch([&](int rank, co2_comm_t* comm) {
    return co2test::create_comm(group, rank, 2, comm);
  });
}

// The same over UCX (ranks are threads of this process that meet through an id's store).
TEST(CollectiveIdentity, OverUcxTooTheMismatchFailsBothRanks) {
  setenv("UCX_TLS", "tcp", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  co2_unique_id_t id;
  const co2_status_t made = co2_get_unique_id(&id);
  ASSERT_EQ(made, CO2_OK) << co2_last_error_message();
  expect_local_average_against_boundary_is_a_mismatch([&](int rank, co2_comm_t* comm) {
    co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
    config.transport = CO2_TRANSPORT_UCX;
    config.timeout_ms = 60000;
    return co2_comm_create_with_id(&config, &id, rank, 2, comm);
  });
}

// A raw all-reduce on the communicator is not an engine's collective either.
TEST(CollectiveIdentity, RawAllReduceDuringTheOthersLocalAverageIsAMismatch) {
  std::vector<co2_status_t> statuses(2, CO2_OK);
  co2test::run_ranks(2, [&](int rank, co2_comm_t comm) {
    std::vector<float> params(kCount, 1.0f);
    co2_engine_t engine = committed_engine(comm, params, co2_engine_config_t CO2_ENGINE_CONFIG_INIT);
    if (!engine) return;
    std::vector<float> buffer(kCount, 1.0f);
    if (rank == 0) {
      statuses[0] = co2_engine_consensus(engine, CO2_CONSENSUS_LOCAL_AVERAGE, buffer.data(), kCount);
    } else {
      co2_request_t request = nullptr;
      statuses[1] = co2_allreduce(comm, buffer.data(), kCount, CO2_DTYPE_FP32, CO2_REDUCE_AVG, nullptr, &request);
      if (statuses[1] == CO2_OK) {
        statuses[1] = co2_request_wait(request, 30000);
        co2_request_free(request);
      }
    }
    co2_engine_destroy(engine);
  });
  EXPECT_EQ(statuses[0], CO2_ERR_COLLECTIVE_MISMATCH);
  EXPECT_EQ(statuses[1], CO2_ERR_COLLECTIVE_MISMATCH);
}

}  // namespace

// One rank of the metrics endpoint test (metrics_test.py), launched by co2run with
// CO2_METRICS_PORT set: trains a co2 engine for ROUNDS rounds of TAU steps (rank 1 puts a NaN
// into its parameters in round 2, so every rank counts one non-finite round; an anchor check
// every 2 rounds), then stops twice so that the test can scrape a known state:
//   1. after training: writes OUT_DIR/stats.trained.<rank>.json, then waits for OUT_DIR/go;
//   2. after finalize: writes OUT_DIR/stats.finalized.<rank>.json, then waits for OUT_DIR/done.
// Each JSON holds co2_engine_get_stats at that point. A wait that sees no file within
// kWaitLimit fails the worker (exit 3) rather than hang.
//   metrics_worker OUT_DIR ROUNDS TAU COUNT
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>

#include "co2/co2.h"

namespace {

constexpr auto kWaitLimit = std::chrono::seconds(120);
constexpr auto kPollInterval = std::chrono::milliseconds(10);

int failed(co2_status_t status, const char* call) {
  std::fprintf(stderr, "%s -> %d (%s): %s\n", call, int(status), co2_status_string(status), co2_last_error_message());
  return 1;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool wait_for_file(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kWaitLimit;
  while (!exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr, "metrics_worker: %s did not appear within %lld s\n", path.c_str(),
                   (long long)kWaitLimit.count());
      return false;
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

// Written under a temporary name and renamed, so that the test never reads half a file.
bool write_stats(co2_engine_t engine, const std::string& path, int rank) {
  co2_engine_stats_t st;
  if (co2_engine_stats_init(&st) != CO2_OK || co2_engine_get_stats(engine, &st) != CO2_OK) return false;
  const std::string partial = path + ".partial";
  std::FILE* out = std::fopen(partial.c_str(), "w");
  if (!out) return false;
  std::fprintf(out,
               "{\"rank\": %d, \"steps\": %llu, \"rounds\": %llu, \"outer_updates\": %llu, "
               "\"boundary_wait_ns\": %llu, \"collective_ns\": %llu, \"bytes_reduced\": %llu, "
               "\"wire_bytes_total\": %llu, \"nonfinite_rounds\": %llu, \"nonfinite_local\": %llu, "
               "\"anchor_checks\": %llu, \"hidden_fraction\": %.17g, \"last_round_ns\": %llu, "
               "\"advised_tau\": %u, \"world_size\": %d, \"outer_state_bytes\": %llu}\n",
               rank, (unsigned long long)st.steps, (unsigned long long)st.rounds, (unsigned long long)st.outer_updates,
               (unsigned long long)st.boundary_wait_ns, (unsigned long long)st.collective_ns,
               (unsigned long long)st.bytes_reduced, (unsigned long long)st.wire_bytes_total,
               (unsigned long long)st.nonfinite_rounds, (unsigned long long)st.nonfinite_local,
               (unsigned long long)st.anchor_checks, st.hidden_fraction, (unsigned long long)st.last_round_ns,
               st.advised_tau, int(st.world_size), (unsigned long long)st.outer_state_bytes);
  const bool written = std::fclose(out) == 0;
  return written && std::rename(partial.c_str(), path.c_str()) == 0;
}

}  // namespace

#define TRY(call)                                          \
  do {                                                     \
    const co2_status_t status_ = (call);                   \
    if (status_ != CO2_OK) return failed(status_, #call);  \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s OUT_DIR ROUNDS TAU COUNT\n", argv[0]);
    return 2;
  }
  const std::string out_dir = argv[1];
  const long rounds = std::atol(argv[2]);
  const uint32_t tau = uint32_t(std::atol(argv[3]));
  const size_t count = size_t(std::atol(argv[4]));
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = 60000;
  co2_comm_t comm = nullptr;
  TRY(co2_comm_create(&config, &comm));
  int32_t rank = 0;
  TRY(co2_comm_rank(comm, &rank));
  co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
  engine_config.tau = tau;
  engine_config.anchor_check_interval = 2;
  co2_engine_t engine = nullptr;
  TRY(co2_engine_create(comm, &engine_config, &engine));
  std::vector<float> weights(count, 0.5f);
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "weights";
  tensor.data = weights.data();
  tensor.count = weights.size();
  TRY(co2_engine_register_tensor(engine, &tensor));
  TRY(co2_engine_commit(engine));
  const long nan_step = 2 * long(tau) - 1;  // the last step of round 2: its delta is not finite
  long nonfinite_boundaries = 0;
  for (long step = 0; step < rounds * long(tau); ++step) {
    for (float& w : weights) w *= 0.999f;
    if (rank == 1 && step == nan_step) weights[0] = std::nanf("");
    const co2_status_t status = co2_engine_step(engine, nullptr, nullptr);
    if (status == CO2_ERR_NONFINITE) {
      ++nonfinite_boundaries;  // the average of round 2 arrives at the next boundary
      continue;
    }
    TRY(status);
  }
  if (nonfinite_boundaries != 1) {
    std::fprintf(stderr, "metrics_worker: %ld boundaries reported NONFINITE, want 1\n", nonfinite_boundaries);
    return 1;
  }
  if (!write_stats(engine, out_dir + "/stats.trained." + std::to_string(rank) + ".json", rank)) return 1;
  if (!wait_for_file(out_dir + "/go")) return 3;
  TRY(co2_engine_finalize(engine));
  if (!write_stats(engine, out_dir + "/stats.finalized." + std::to_string(rank) + ".json", rank)) return 1;
  if (!wait_for_file(out_dir + "/done")) return 3;
  TRY(co2_engine_destroy(engine));
  TRY(co2_comm_destroy(comm));
  return 0;
}

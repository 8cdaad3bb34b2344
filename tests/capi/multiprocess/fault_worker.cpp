// One rank of a fault test: forms the group from the launcher environment (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, CO2_AUTH_TOKEN set by the driver), commits a CO2 engine, writes
// READY_DIR/ready.<rank>, then trains until a call fails. It then destroys the engine and the
// communicator and exits with the failing status as its exit code (0: it never failed), after
// printing "status S after_error_ms D" where D is how long destroy took.
//   fault_worker READY_DIR TIMEOUT_MS MAX_STEPS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"

namespace {

int finish(co2_status_t status, const char* call, co2_engine_t engine, co2_comm_t comm) {
  std::fprintf(stderr, "%s -> %d (%s): %s\n", call, int(status), co2_status_string(status), co2_last_error_message());
  const auto start = std::chrono::steady_clock::now();
  co2_engine_destroy(engine);
  co2_comm_destroy(comm);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  std::printf("status %d after_error_ms %lld\n", int(status), (long long)ms.count());
  std::fflush(stdout);
  return int(status);
}

}  // namespace

#define TRY(call)                                                       \
  do {                                                                  \
    const co2_status_t status_ = (call);                                \
    if (status_ != CO2_OK) return finish(status_, #call, engine, comm); \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s READY_DIR TIMEOUT_MS MAX_STEPS\n", argv[0]);
    return 2;
  }
  const std::string ready_dir = argv[1];
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = uint32_t(std::atoi(argv[2]));
  const long max_steps = std::atol(argv[3]);
  co2_comm_t comm = nullptr;
  co2_engine_t engine = nullptr;
  TRY(co2_comm_create(&config, &comm));
  co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
  engine_config.tau = 2;
  TRY(co2_engine_create(comm, &engine_config, &engine));
  std::vector<float> weights(1 << 20, 0.5f);
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "weights";
  tensor.data = weights.data();
  tensor.count = weights.size();
  TRY(co2_engine_register_tensor(engine, &tensor));
  TRY(co2_engine_commit(engine));
  int32_t rank = 0;
  TRY(co2_comm_rank(comm, &rank));
  std::ofstream(ready_dir + "/ready." + std::to_string(rank)) << "ready\n";
  for (long step = 0; step < max_steps; ++step) {
    for (float& w : weights) w *= 0.999f;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    TRY(co2_engine_step(engine, nullptr, nullptr));
  }
  TRY(co2_engine_finalize(engine));
  return finish(CO2_OK, "training", engine, comm);
}

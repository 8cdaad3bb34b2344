// One rank of the observability tests (observe_test.py), launched by co2run: trains a co2 engine
// whose step sleeps SLEEP_MS + rank * RANK_SLEEP_MS (ranks of different speeds), finalizes,
// writes its statistics to OUT_DIR/stats.<rank>.json and destroys the engine (which writes the
// CO2_TRACE file once more).
//   observe_worker OUT_DIR STEPS TAU COUNT SLEEP_MS RANK_SLEEP_MS
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"

namespace {

int failed(co2_status_t status, const char* call) {
  std::fprintf(stderr, "%s -> %d (%s): %s\n", call, int(status), co2_status_string(status), co2_last_error_message());
  return 1;
}

}  // namespace

#define TRY(call)                                          \
  do {                                                     \
    const co2_status_t status_ = (call);                   \
    if (status_ != CO2_OK) return failed(status_, #call);  \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s OUT_DIR STEPS TAU COUNT SLEEP_MS RANK_SLEEP_MS\n", argv[0]);
    return 2;
  }
  const std::string out_dir = argv[1];
  const long steps = std::atol(argv[2]);
  const uint32_t tau = uint32_t(std::atol(argv[3]));
  const size_t count = size_t(std::atol(argv[4]));
  const long sleep_ms = std::atol(argv[5]), rank_sleep_ms = std::atol(argv[6]);
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = 60000;
  co2_comm_t comm = nullptr;
  TRY(co2_comm_create(&config, &comm));
  int32_t rank = 0;
  TRY(co2_comm_rank(comm, &rank));
  co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
  engine_config.tau = tau;
  co2_engine_t engine = nullptr;
  TRY(co2_engine_create(comm, &engine_config, &engine));
  std::vector<float> weights(count, 0.5f);
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "weights";
  tensor.data = weights.data();
  tensor.count = weights.size();
  TRY(co2_engine_register_tensor(engine, &tensor));
  TRY(co2_engine_commit(engine));
  const auto sleep = std::chrono::milliseconds(sleep_ms + rank * rank_sleep_ms);
  for (long step = 0; step < steps; ++step) {
    for (float& w : weights) w *= 0.999f;
    if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
    TRY(co2_engine_step(engine, nullptr, nullptr));
  }
  TRY(co2_engine_finalize(engine));
  co2_engine_stats_t st;
  TRY(co2_engine_stats_init(&st));
  TRY(co2_engine_get_stats(engine, &st));
  const std::string path = out_dir + "/stats." + std::to_string(rank) + ".json";
  std::FILE* out = std::fopen(path.c_str(), "w");
  if (!out) return 1;
  std::fprintf(out,
               "{\"rank\": %d, \"steps\": %llu, \"rounds\": %llu, \"advised_tau\": %u, \"step_time_ns\": %llu, "
               "\"allreduce_time_ns\": %llu, \"rank_step_time_ns\": %llu, \"rank_allreduce_time_ns\": %llu, "
               "\"hidden_fraction\": %.17g, \"last_hidden_fraction\": %.17g}\n",
               rank, (unsigned long long)st.steps, (unsigned long long)st.rounds, st.advised_tau,
               (unsigned long long)st.step_time_ns, (unsigned long long)st.allreduce_time_ns,
               (unsigned long long)st.rank_step_time_ns, (unsigned long long)st.rank_allreduce_time_ns,
               st.hidden_fraction, st.last_hidden_fraction);
  std::fclose(out);
  TRY(co2_engine_destroy(engine));
  TRY(co2_comm_destroy(comm));
  return 0;
}

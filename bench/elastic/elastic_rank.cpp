// One rank of bench/elastic/leave.py and join.py: an elastic group (elastic_min_ranks 1) trains
// STATE_MIB of fp32 parameters with a fixed step time; after every engine call it prints one line
//   t <CLOCK_REALTIME ns> steps <engine steps> [changed <new rank> <new size>]
// so the driver can say, against the wall time it killed or stopped a rank (or started a joiner),
// when each member got CO2_MEMBERSHIP_CHANGED and when its first step after that returned. Before
// the steps: "created <ns>" when co2_comm_create returned (a joiner: it was admitted),
// "committing <ns>" when it calls co2_engine_commit, then "committed <ns> steps <steps>
// state_bytes <outer state bytes>" when the commit returned (a joiner: it holds the group's
// state). The parameters are allocated and filled before the group is joined, as a framework
// builds its model first: that is not the join's work. SIGUSR1 asks it to leave (co2_engine_leave, as a process
// told to go would); when its step returns CO2_LEFT it prints "t <ns> steps <steps> left" and exits 0.
//   elastic_rank STATE_MIB TAU STEP_MS TIMEOUT_MS STEPS
#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "co2/co2.h"

namespace {

long long now_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

volatile sig_atomic_t leave_asked = 0;

void ask_to_leave(int) { leave_asked = 1; }

int fail(co2_status_t status, const char* call) {
  std::fprintf(stderr, "%s -> %d: %s\n", call, int(status), co2_last_error_message());
  return int(status);
}

}  // namespace

#define TRY(call)                                       \
  do {                                                  \
    const co2_status_t status_ = (call);                \
    if (status_ != CO2_OK) return fail(status_, #call); \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s STATE_MIB TAU STEP_MS TIMEOUT_MS STEPS [SHARD]\n", argv[0]);
    return 2;
  }
  const size_t count = size_t(std::atof(argv[1]) * (1 << 20) / sizeof(float));
  const uint32_t tau = uint32_t(std::atoi(argv[2]));
  const auto step_time = std::chrono::microseconds(long(std::atof(argv[3]) * 1000));
  const uint64_t steps = uint64_t(std::atol(argv[5]));
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = uint32_t(std::atoi(argv[4]));
  config.elastic_min_ranks = 1;
  co2_comm_t comm = nullptr;
  co2_engine_t engine = nullptr;
  std::vector<float> weights(count, 1.0f);
  TRY(co2_comm_create(&config, &comm));
  std::printf("created %lld\n", now_ns());
  co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
  engine_config.tau = tau;
  engine_config.shard_outer_state = argc == 7 && std::atoi(argv[6]) != 0;
  TRY(co2_engine_create(comm, &engine_config, &engine));
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "weights";
  tensor.data = weights.data();
  tensor.count = weights.size();
  TRY(co2_engine_register_tensor(engine, &tensor));
  std::printf("committing %lld\n", now_ns());
  TRY(co2_engine_commit(engine));
  const long long committed = now_ns();
  int32_t rank = 0, size = 0;
  TRY(co2_comm_rank(comm, &rank));
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  TRY(co2_engine_get_stats(engine, &stats));
  std::printf("committed %lld steps %llu state_bytes %llu\n", committed, (unsigned long long)stats.steps,
              (unsigned long long)stats.outer_state_bytes);
  std::fflush(stdout);
  ::signal(SIGUSR1, ask_to_leave);
  bool leaving = false;
  for (;;) {
    TRY(co2_engine_get_stats(engine, &stats));
    if (stats.steps >= steps) break;
    if (leave_asked && !leaving) {
      TRY(co2_engine_leave(engine));
      leaving = true;
    }
    const auto until = std::chrono::steady_clock::now() + step_time;
    weights[size_t(stats.steps) % count] += 1e-3f * float(rank + 1);  // a rank-dependent delta
    std::this_thread::sleep_until(until);
    const co2_status_t status = co2_engine_step(engine, nullptr, nullptr);
    const long long at = now_ns();
    TRY(co2_engine_get_stats(engine, &stats));
    if (status == CO2_LEFT) {
      std::printf("t %lld steps %llu left\n", at, (unsigned long long)stats.steps);
      std::fflush(stdout);
      co2_engine_destroy(engine);
      co2_comm_destroy(comm);
      return 0;
    }
    if (status == CO2_MEMBERSHIP_CHANGED) {
      TRY(co2_comm_rank(comm, &rank));
      TRY(co2_comm_size(comm, &size));
      std::printf("t %lld steps %llu changed %d %d\n", at, (unsigned long long)stats.steps, rank, size);
    } else {
      TRY(status);
      std::printf("t %lld steps %llu\n", at, (unsigned long long)stats.steps);
    }
    std::fflush(stdout);
  }
  TRY(co2_engine_finalize(engine));
  co2_engine_destroy(engine);
  co2_comm_destroy(comm);
  return 0;
}

// One rank of an elastic group (tests/capi/multiprocess/elastic_test.py): forms the group from the
// launcher environment with elastic_min_ranks = MIN_RANKS, trains a deterministic model until the
// engine's step count reaches STEPS, and goes on through CO2_MEMBERSHIP_CHANGED (re-reading its
// rank and size, as a framework re-shards its data). Then it finalizes and prints
//   done rank R size S steps N changes C hash H
// where H hashes the parameters after finalize (the anchor, equal on every member). Any other
// failure prints "status S" and exits with S.
//   elastic_worker READY_DIR TIMEOUT_MS STEPS MIN_RANKS
// ELASTIC_DIE_AT=k: this process kills itself (SIGKILL) when the engine reaches step k (with
// ELASTIC_DIE_RANK=r set: only the process started as rank r, for launchers that share one
// environment); ELASTIC_DIE_AFTER=k instead: it dies k steps after its commit (a restarted
// process that joined then dies again k steps later: churn under co2run --max-restarts);
// ELASTIC_STOP_AT=k: it stops itself (SIGSTOP) there instead, for the test to continue later.
// ELASTIC_PAUSE_AT=k with ELASTIC_PAUSE_MS=ms: before step k (and before a stop there) the
// training thread sleeps that long, a step that computes longer than the timeout: no collective
// is in flight once those of the round before completed, the membership's threads run on.
// After each membership change it writes READY_DIR/changed.<first rank>; with ELASTIC_HOLD=path it
// waits for that file to exist before it finalizes (the test holds the group together meanwhile).
// ELASTIC_SAVE=prefix: right after the first change every survivor saves the engine to
// prefix.<new rank>; ELASTIC_LOAD=prefix: after commit each rank loads prefix.<rank> and trains
// on from the loaded step count (a fresh group started from the survivors' agreed state).
// ELASTIC_UNTIL_SIZE=k: train past STEPS until the group has k ranks again (a joiner came; at
// most 60 s), so that every rank, a joiner too, finalizes at the same step; ELASTIC_UNTIL_CHANGES=k
// likewise until this rank saw k membership changes.
// ELASTIC_OUTER_MOMENTUM=beta: the engine's outer momentum (default: automatic, 0 at these sizes).
// ELASTIC_SHARD=1: the outer state sharded over the ranks (shard_outer_state).
// ELASTIC_TRANSPORT=nccl: the group runs over NCCL (built as elastic_worker_cuda, on the GPU of
// LOCAL_RANK: scripts/gpu-check.sh); otherwise the launcher's default (UCX).
// ELASTIC_LEAVE_AT=k: at step k this process asks to leave (co2_engine_leave; with
// ELASTIC_DIE_RANK=r only rank r) and trains on until its step returns CO2_LEFT; then it prints
//   left rank R size S steps N hash H
// and exits 0. After each membership change every rank prints
//   changed rank R size S steps N hash H
// (H: the parameters then, the agreed anchor).
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"
#ifdef ELASTIC_CUDA_TENSORS
// Built as elastic_worker_on_host_executor: linked with co2_on_host_executor, whose CUDA runtime
// (runtime/backends/device/host_executor/) keeps "device" memory on the host, so that the device
// backend's elastic paths run between real processes without a GPU; and, in CUDA builds, as
// elastic_worker_cuda against the real runtime.
#include <cuda_runtime.h>
#endif

namespace {

uint64_t fnv1a(const void* data, size_t bytes) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

long env_long(const char* name, long fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::atol(text) : fallback;
}

int write_file(void* user, const void* data, size_t length) {
  return std::fwrite(data, 1, length, static_cast<std::FILE*>(user)) == length ? 0 : 1;
}

int read_file(void* user, void* data, size_t length) {
  return std::fread(data, 1, length, static_cast<std::FILE*>(user)) == length ? 0 : 1;
}

// "<what> rank R size S steps N hash H", H over the parameters.
// The tensor the engine trains: `weights` itself, or (ELASTIC_CUDA_TENSORS) a CUDA copy of it
// that the worker downloads before it reads the weights and uploads after it changed them.
struct Tensor {
  std::vector<float>& host;
  void* device = nullptr;
  void* data() {
#ifdef ELASTIC_CUDA_TENSORS
    if (!device && cudaMalloc(&device, host.size() * sizeof(float)) != cudaSuccess) std::abort();
    upload();
    return device;
#else
    return host.data();
#endif
  }
  void download() {
#ifdef ELASTIC_CUDA_TENSORS
    if (cudaMemcpy(host.data(), device, host.size() * sizeof(float), cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
#endif
  }
  void upload() {
#ifdef ELASTIC_CUDA_TENSORS
    if (cudaMemcpy(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) std::abort();
#endif
  }
#ifdef ELASTIC_CUDA_TENSORS
  static constexpr co2_device_kind_t kind = CO2_DEVICE_CUDA;
#else
  static constexpr co2_device_kind_t kind = CO2_DEVICE_HOST;
#endif
};

void print_state(const char* what, co2_engine_t engine, int rank, int size, const std::vector<float>& weights) {
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  co2_engine_get_stats(engine, &stats);
  std::printf("%s rank %d size %d steps %llu hash %016llx\n", what, rank, size, (unsigned long long)stats.steps,
              (unsigned long long)fnv1a(weights.data(), weights.size() * sizeof(float)));
  std::fflush(stdout);
}

// A crash prints its stack (the test shows the output), then dies of the same signal.
void print_stack_and_die(int signal) {
  void* frames[64];
  const int count = backtrace(frames, 64);
  backtrace_symbols_fd(frames, count, 2);
  ::signal(signal, SIG_DFL);
  raise(signal);
}

int fail(co2_status_t status, const char* call) {
  std::fprintf(stderr, "%s -> %d (%s): %s\n", call, int(status), co2_status_string(status), co2_last_error_message());
  std::printf("status %d\n", int(status));
  std::fflush(stdout);
  return int(status);
}

}  // namespace

#define TRY(call)                                  \
  do {                                             \
    const co2_status_t status_ = (call);           \
    if (status_ != CO2_OK) return fail(status_, #call); \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s READY_DIR TIMEOUT_MS STEPS MIN_RANKS\n", argv[0]);
    return 2;
  }
  const std::string ready_dir = argv[1];
  ::signal(SIGSEGV, print_stack_and_die);
  ::signal(SIGABRT, print_stack_and_die);
  const uint64_t steps = uint64_t(std::atol(argv[3]));
  const long die_rank = env_long("ELASTIC_DIE_RANK", -1);
  const long die_at = die_rank < 0 || die_rank == env_long("RANK", -1) ? env_long("ELASTIC_DIE_AT", -1) : -1;
  const long stop_at = env_long("ELASTIC_STOP_AT", -1);
  const long pause_at = env_long("ELASTIC_PAUSE_AT", -1);
  const long pause_ms = env_long("ELASTIC_PAUSE_MS", 0);
  bool paused = false;  // once: a change may take the step count back to pause_at
  const long leave_at = die_rank < 0 || die_rank == env_long("RANK", -1) ? env_long("ELASTIC_LEAVE_AT", -1) : -1;
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.timeout_ms = uint32_t(std::atoi(argv[2]));
  config.elastic_min_ranks = std::atoi(argv[4]);
  if (const char* transport = std::getenv("ELASTIC_TRANSPORT"); transport && std::string(transport) == "nccl") {
    config.transport = CO2_TRANSPORT_NCCL;
#ifdef ELASTIC_CUDA_TENSORS
    if (cudaSetDevice(int(env_long("LOCAL_RANK", 0))) != cudaSuccess) std::abort();  // the tensors' device too
#endif
  }
  co2_comm_t comm = nullptr;
  co2_engine_t engine = nullptr;
  // Destroyed on every return, failures included: a process that exits with its communicator
  // alive leaves UCX's async thread running while libucs's destructors run (a race under TSan).
  struct Handles {
    co2_comm_t& comm;
    co2_engine_t& engine;
    ~Handles() {
      if (engine != nullptr) co2_engine_destroy(engine);
      if (comm != nullptr) co2_comm_destroy(comm);
    }
  } handles{comm, engine};
  TRY(co2_comm_create(&config, &comm));
  co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
  engine_config.tau = 3;
  // The automatic beta is 0 at these sizes: no outer momentum to hand over unless one is set.
  if (const char* beta = std::getenv("ELASTIC_OUTER_MOMENTUM")) engine_config.outer_momentum = std::atof(beta);
  engine_config.shard_outer_state = env_long("ELASTIC_SHARD", 0) != 0;
  TRY(co2_engine_create(comm, &engine_config, &engine));
  std::vector<float> weights(4096, 1.0f);
  Tensor trained{weights};
  co2_tensor_t tensor = CO2_TENSOR_INIT;
  tensor.name = "weights";
  tensor.data = trained.data();
  tensor.count = weights.size();
  tensor.device = Tensor::kind;
  TRY(co2_engine_register_tensor(engine, &tensor));
  TRY(co2_engine_commit(engine));
  int32_t rank = 0, size = 0;
  TRY(co2_comm_rank(comm, &rank));
  TRY(co2_comm_size(comm, &size));
  const int first_rank = rank;
  const char* save_prefix = std::getenv("ELASTIC_SAVE");
  if (const char* load_prefix = std::getenv("ELASTIC_LOAD")) {
    std::FILE* in = std::fopen((std::string(load_prefix) + "." + std::to_string(rank)).c_str(), "rb");
    if (in == nullptr) return fail(CO2_ERR_INVALID_ARGUMENT, "fopen(ELASTIC_LOAD)");
    const co2_status_t loaded = co2_engine_load(engine, read_file, in);
    std::fclose(in);
    TRY(loaded);
  }
  std::ofstream(ready_dir + "/ready." + std::to_string(rank)) << "ready\n";
  const char* hold = std::getenv("ELASTIC_HOLD");
  const int until_size = int(env_long("ELASTIC_UNTIL_SIZE", 0));
  const long until_changes = env_long("ELASTIC_UNTIL_CHANGES", 0);
  int changes = 0;
  const auto started = std::chrono::steady_clock::now();
  const auto waiting_for_changes = [&] {
    return (size < until_size || changes < until_changes) &&
           std::chrono::steady_clock::now() - started < std::chrono::seconds(60);
  };

  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  TRY(co2_engine_get_stats(engine, &stats));
  const long die_after = env_long("ELASTIC_DIE_AFTER", -1);
  const long die_at_step =
      die_after >= 0 && (die_rank < 0 || die_rank == env_long("RANK", -1)) ? long(stats.steps) + die_after : die_at;
  // finalize may meet a failure too; then the group trains on to STEPS and finalizes again.
  for (bool finalized = false; !finalized;) {
    TRY(co2_engine_get_stats(engine, &stats));
    co2_status_t status = CO2_OK;
    if (stats.steps < steps || waiting_for_changes()) {
      if (long(stats.steps) == die_at_step) raise(SIGKILL);
      if (long(stats.steps) == pause_at && !paused) {
        paused = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
      }
      if (long(stats.steps) == stop_at) raise(SIGSTOP);
      if (long(stats.steps) == leave_at) {
        TRY(co2_engine_leave(engine));
        // The others would not run it: refused until the group let this rank go.
        if (co2_engine_finalize(engine) != CO2_ERR_INVALID_STATE)
          return fail(CO2_ERR_INTERNAL, "finalize with a leave pending was not refused");
      }
      // Each rank pulls towards its own target: the average depends on who is in the group.
      trained.download();
      for (size_t i = 0; i < weights.size(); ++i)
        weights[i] -= 0.05f * (weights[i] - float((rank + 1) * int(i % 7)));
      trained.upload();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      status = co2_engine_step(engine, nullptr, nullptr);
    } else {
      // Only while the test lets it: bounded, so a test that forgets cannot hang the worker.
      for (int waited = 0; hold && *hold && !std::ifstream(hold) && waited < 120000; waited += 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      status = co2_engine_finalize(engine);
      finalized = status == CO2_OK;
    }
    trained.download();  // what the step or finalize made of the parameters
    if (status == CO2_LEFT) {
      std::fprintf(stderr, "left: %s\n", co2_last_error_message());
      print_state("left", engine, rank, size, weights);
      return 0;
    }
    if (status == CO2_MEMBERSHIP_CHANGED) {
      ++changes;
      std::fprintf(stderr, "membership changed: %s\n", co2_last_error_message());
      std::ofstream(ready_dir + "/changed." + std::to_string(first_rank)) << changes << "\n";
      TRY(co2_comm_rank(comm, &rank));
      TRY(co2_comm_size(comm, &size));
      print_state("changed", engine, rank, size, weights);
      if (save_prefix && changes == 1) {
        std::FILE* out = std::fopen((std::string(save_prefix) + "." + std::to_string(rank)).c_str(), "wb");
        if (out == nullptr) return fail(CO2_ERR_INVALID_ARGUMENT, "fopen(ELASTIC_SAVE)");
        const co2_status_t saved = co2_engine_save(engine, write_file, out);
        std::fclose(out);
        TRY(saved);
      }
      continue;
    }
    TRY(status);
  }
  TRY(co2_engine_get_stats(engine, &stats));
  std::printf("done rank %d size %d steps %llu changes %d hash %016llx\n", rank, size,
              (unsigned long long)stats.steps, changes,
              (unsigned long long)fnv1a(weights.data(), weights.size() * sizeof(float)));
  std::fflush(stdout);
  return 0;
}

// Outer state memory per rank, replicated against sharded (shard_outer_state = 1; issue 16),
// through the public C API. For each world size W, W ranks run as threads of this process over
// the local transport, each training a model of N fp32 parameters with co2 (outer momentum 0.9):
// commit, a few boundaries, then the engine's own count (co2_engine_stats_t.outer_state_bytes,
// the largest over the ranks) and, as a cross-check, the process's resident-set growth per rank
// (/proc/self/statm around the engines' life, divided by W; the parameters themselves are
// allocated before the first reading, so the growth is the engines' and the transport's).
// Four modes per W: replicated and sharded, each with the default policy (eager on host tensors:
// replicated keeps 2 more full copies, the offset and its momentum; sharded keeps each rank's round
// start and momentum full-size) and delayed (eager = 0), so that each compares with the same
// update policy.
//   outer_state [--params N] [--worlds 2,4,8] [--tau T] [--steps S]
// A configuration the engine refuses (sharding not implemented yet for it) prints its status and
// message in place of its row; the run goes on.
#include <co2/co2.h>

#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// A rank that stops answering fails the others' collectives after this long instead of hanging.
constexpr uint32_t kNoProgressTimeoutMs = 120000;
constexpr double kOuterMomentum = 0.9;
// What each local step subtracts from every parameter: the rounds carry a non-zero delta, so the
// outer update writes (and the kernel backs) the whole momentum.
constexpr float kStepDelta = 1e-3f;

struct Options {
  size_t params = size_t(16) << 20;
  std::vector<int> worlds{2, 4, 8};
  uint32_t tau = 2;
  int steps = 6;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "outer_state: %s\nusage: outer_state [--params N] [--worlds W1,W2,...] [--tau T] [--steps S]\n"
               "  defaults: --params 16777216 --worlds 2,4,8 --tau 2 --steps 6\n",
               why);
  std::exit(2);
}

unsigned long long parse_positive(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v == 0 || text[0] == '-')
    usage((std::string(flag) + " takes a positive integer, got '" + text + "'").c_str());
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) usage((flag + " needs a value").c_str());
    const char* value = argv[++i];
    if (flag == "--params") {
      o.params = size_t(parse_positive("--params", value));
    } else if (flag == "--tau") {
      const unsigned long long tau = parse_positive("--tau", value);
      if (tau > UINT32_MAX) usage("--tau is too large");
      o.tau = uint32_t(tau);
    } else if (flag == "--steps") {
      const unsigned long long steps = parse_positive("--steps", value);
      if (steps > 1000000) usage("--steps is at most 1000000");
      o.steps = int(steps);
    } else if (flag == "--worlds") {
      o.worlds.clear();
      std::string list = value;
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string item = list.substr(start, comma - start);
        const unsigned long long w = parse_positive("--worlds", item.c_str());
        if (w > 256) usage("--worlds: at most 256 ranks as threads");
        o.worlds.push_back(int(w));
        start = comma + 1;
      }
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  return o;
}

// Resident set of this process in bytes (the second field of /proc/self/statm, in pages).
long long resident_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return -1;
  long long pages_total = 0, pages_resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &pages_total, &pages_resident);
  std::fclose(f);
  if (read != 2) return -1;
  return pages_resident * static_cast<long long>(sysconf(_SC_PAGESIZE));
}

// The ranks stop here with their engines alive until the main thread has read the resident set.
class Gate {
 public:
  explicit Gate(int ranks) : ranks_(ranks) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  void wait_for_all() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ == ranks_; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  const int ranks_;
  int arrived_ = 0;
  bool released_ = false;
};

struct RankResult {
  co2_status_t status = CO2_OK;
  std::string where;
  std::string message;
  uint64_t outer_state_bytes = 0;
};

enum class Mode { ReplicatedDefault, ReplicatedDelayed, Sharded, ShardedDelayed };

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::ReplicatedDefault: return "replicated";
    case Mode::ReplicatedDelayed: return "repl.delayed";
    case Mode::Sharded: return "sharded";
    case Mode::ShardedDelayed: return "shard.delayed";
  }
  return "?";
}

void run_rank(const Options& o, int world, Mode mode, const std::string& group, int rank,
              std::vector<float>& params, RankResult& r, Gate& gate) {
  co2_comm_t comm = nullptr;
  co2_engine_t engine = nullptr;
  // The first failure is the one reported; co2_last_error_message is this thread's.
  auto ok = [&](co2_status_t s, const char* where) {
    if (s == CO2_OK) return true;
    if (r.status == CO2_OK) {
      r.status = s;
      r.where = where;
      r.message = co2_last_error_message();
    }
    return false;
  };

  co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
  cc.transport = CO2_TRANSPORT_LOCAL;
  cc.rank = rank;
  cc.world_size = world;
  cc.group_name = group.c_str();
  cc.timeout_ms = kNoProgressTimeoutMs;
  bool good = ok(co2_comm_create(&cc, &comm), "co2_comm_create");
  if (good) {
    co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
    ec.algorithm = CO2_ALGO_CO2;
    ec.tau = o.tau;
    ec.outer_momentum = kOuterMomentum;
    ec.shard_outer_state = mode == Mode::Sharded || mode == Mode::ShardedDelayed ? 1 : 0;
    // The default (CO2_EAGER_AUTO) is eager on host tensors.
    if (mode == Mode::ReplicatedDelayed || mode == Mode::ShardedDelayed) ec.eager = 0;
    good = ok(co2_engine_create(comm, &ec, &engine), "co2_engine_create");
  }
  if (good) {
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = params.data();
    t.count = params.size();
    t.dtype = CO2_DTYPE_FP32;
    t.device = CO2_DEVICE_HOST;
    t.role = CO2_ROLE_PARAMETER;
    good = ok(co2_engine_register_tensor(engine, &t), "co2_engine_register_tensor");
  }
  if (good) good = ok(co2_engine_commit(engine), "co2_engine_commit");
  for (int s = 0; good && s < o.steps; ++s) {
    for (float& p : params) p -= kStepDelta;
    int boundary = 0;
    good = ok(co2_engine_step(engine, nullptr, &boundary), "co2_engine_step");
  }
  if (good) {
    co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
    good = ok(co2_engine_get_stats(engine, &stats), "co2_engine_get_stats");
    r.outer_state_bytes = stats.outer_state_bytes;
  }
  // A rank that failed aborts its communicator: the others' pending collectives fail at once
  // instead of waiting out the timeout for it.
  if (!good && comm != nullptr) co2_comm_abort(comm);
  gate.arrive_and_wait();
  if (good) good = ok(co2_engine_finalize(engine), "co2_engine_finalize");
  if (!good && comm != nullptr) co2_comm_abort(comm);
  co2_engine_destroy(engine);
  co2_comm_destroy(comm);
}

void run_world(const Options& o, int world, Mode which) {
  const char* mode = mode_name(which);
  const double model_bytes = 4.0 * double(o.params);
  const double mib = 1024.0 * 1024.0;
  std::vector<std::vector<float>> params(size_t(world), std::vector<float>(o.params, 0.5f));
  const long long before = resident_bytes();

  std::vector<RankResult> results(static_cast<size_t>(world));
  Gate gate(world);
  const std::string group = "bench-outer-state-" + std::to_string(world) + "-" + mode + "-" + std::to_string(getpid());
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < world; ++rank)
    ranks.emplace_back(run_rank, std::cref(o), world, which, std::cref(group), rank,
                       std::ref(params[size_t(rank)]), std::ref(results[size_t(rank)]), std::ref(gate));
  gate.wait_for_all();
  const long long after = resident_bytes();
  gate.release();
  for (auto& t : ranks) t.join();

  // The root cause is the first rank that failed on its own, not one that saw a peer's abort.
  const RankResult* failed = nullptr;
  for (const RankResult& r : results)
    if (r.status != CO2_OK && (failed == nullptr || (failed->status == CO2_ERR_ABORTED && r.status != CO2_ERR_ABORTED)))
      failed = &r;
  if (failed != nullptr) {
    std::printf("%3d  %s: %s [status %d at %s]\n", world, mode, failed->message.c_str(), int(failed->status),
                failed->where.c_str());
    std::fflush(stdout);
    return;
  }
  uint64_t state = 0;
  for (const RankResult& r : results) state = std::max(state, r.outer_state_bytes);
  const double growth = (before < 0 || after < 0) ? -1.0 : double(after - before) / world;
  std::printf("%3d  %-12s  %15.1f  %11.2f  %19.1f  %10.2f\n", world, mode, double(state) / mib,
              double(state) / model_bytes, growth / mib, growth / model_bytes);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
#ifdef __GLIBC__
  // A fixed mmap threshold: glibc otherwise raises it after the first large free, later runs'
  // buffers then come from memory earlier runs freed but kept, and the RSS growth undercounts.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
  std::printf("# outer state per rank: co2, outer momentum %.1f, tau %u, %d steps, N = %zu fp32 parameters"
              " (one model copy = %.1f MiB); local transport, ranks as threads\n",
              kOuterMomentum, o.tau, o.steps, o.params, 4.0 * double(o.params) / (1024.0 * 1024.0));
  std::printf("# outer_state: co2_engine_stats_t.outer_state_bytes (largest over the ranks); RSS: growth of"
              " this process's resident set per rank\n");
  std::printf("  W  mode          outer_state MiB  model copies  RSS growth/rank MiB  RSS copies\n");
  for (int world : o.worlds) {
    run_world(o, world, Mode::ReplicatedDefault);
    run_world(o, world, Mode::ReplicatedDelayed);
    run_world(o, world, Mode::Sharded);
    run_world(o, world, Mode::ShardedDelayed);
  }
  return 0;
}

// All-reduce bandwidth of co2's communicator over the UCX transport, between processes on this
// host. The program starts the ranks itself (it re-executes itself once per rank); they meet
// through a file store in a temporary directory. Rank 0 prints one line per size:
//   algorithm bandwidth = bytes / time,  bus bandwidth = 2 (W-1)/W * bytes / time
// (NCCL's definitions), for f32 sum all-reduces waited on one at a time.
//
//   UCX_TLS=tcp UCX_NET_DEVICES=lo build/bench/allreduce_bandwidth --ranks 4
//   options: --ranks W (2)  --min BYTES (1M)  --max BYTES (256M)  --chunk BYTES (communicator
//            default)  --seconds S per size (1.0)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/comm.hpp"
#include "runtime/store/store.hpp"
#include "transports/ucx/transport.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Settings {
  int ranks = 2;
  size_t min_bytes = size_t(1) << 20;
  size_t max_bytes = size_t(256) << 20;
  size_t chunk_bytes = 0;  // 0: the communicator's default
  double seconds = 1.0;
};

size_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  switch (*end) {
    case 'K': case 'k': value *= 1024; break;
    case 'M': case 'm': value *= 1024 * 1024; break;
    case 'G': case 'g': value *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return size_t(value);
}

void all_wait(co2::Communicator& comm, std::vector<float>& data, size_t count) {
  comm.allreduce(data.data(), count, co2::DataType::F32, co2::ReduceOp::Sum)
      ->wait_for(std::chrono::milliseconds(-1));
}

int run_rank(const Settings& settings, const fs::path& dir, int rank) {
  auto store = co2::store::open_file_store((dir / "store").string());
  co2::CommOptions options;
  if (settings.chunk_bytes) options.chunk_bytes = settings.chunk_bytes;
  co2::Communicator comm(co2::transport::ucx::connect(*store, "bench/", rank, settings.ranks,
                                                      std::chrono::milliseconds(60000)),
                         options);
  std::vector<float> data(settings.max_bytes / sizeof(float), 1.0f);
  std::vector<float> token(1, 0.0f);
  const double bus_factor = 2.0 * (settings.ranks - 1) / settings.ranks;
  if (rank == 0) {
    std::printf("# co2 allreduce (f32 sum) over UCX, %d processes, chunk %zu bytes\n",
                settings.ranks, options.chunk_bytes);
    std::printf("%12s %6s %12s %12s %12s\n", "bytes", "iters", "time_us", "algbw_GB/s",
                "busbw_GB/s");
  }
  for (size_t bytes = settings.min_bytes; bytes <= settings.max_bytes; bytes *= 2) {
    const size_t count = bytes / sizeof(float);
    all_wait(comm, data, count);  // warm-up
    // Iterations: rank 0 measures one more all-reduce and everyone uses its estimate.
    const auto probe_start = Clock::now();
    all_wait(comm, data, count);
    token[0] = rank == 0 ? float(std::chrono::duration<double>(Clock::now() - probe_start).count())
                         : 0.0f;
    comm.broadcast(token.data(), 1, co2::DataType::F32, 0)->wait_for(std::chrono::milliseconds(-1));
    const int iterations =
        std::clamp(int(settings.seconds / std::max(1e-6, double(token[0]))), 3, 1000);
    all_wait(comm, token, 1);  // start together
    const auto start = Clock::now();
    for (int i = 0; i < iterations; ++i) all_wait(comm, data, count);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iterations;
    if (rank == 0) {
      const double algbw = double(bytes) / seconds / 1e9;
      std::printf("%12zu %6d %12.1f %12.3f %12.3f\n", bytes, iterations, seconds * 1e6, algbw,
                  algbw * bus_factor);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  int rank = -1;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (arg == "--ranks") settings.ranks = std::atoi(value().c_str());
    else if (arg == "--min") settings.min_bytes = parse_bytes(value());
    else if (arg == "--max") settings.max_bytes = parse_bytes(value());
    else if (arg == "--chunk") settings.chunk_bytes = parse_bytes(value());
    else if (arg == "--seconds") settings.seconds = std::atof(value().c_str());
    else if (arg == "--rank") rank = std::atoi(value().c_str());
    else if (arg == "--dir") dir = value();
    else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of %s)\n", arg.c_str(),
                   __FILE__);
      return 64;
    }
  }
  if (settings.ranks < 1 || settings.min_bytes < 4 || settings.min_bytes > settings.max_bytes) {
    std::fprintf(stderr, "need --ranks >= 1 and 4 <= --min <= --max\n");
    return 64;
  }
  try {
    if (rank >= 0) return run_rank(settings, dir, rank);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    return 1;
  }

  // The launcher: one process per rank, then wait for all of them.
  std::string pattern = (fs::temp_directory_path() / "co2-bench-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  std::vector<pid_t> children;
  for (int r = 0; r < settings.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<std::string> args = {"/proc/self/exe", "--rank", std::to_string(r), "--dir",
                                       pattern};
      for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
      std::vector<char*> child_argv;
      for (auto& arg : args) child_argv.push_back(arg.data());
      child_argv.push_back(nullptr);
      ::execv(child_argv[0], child_argv.data());
      ::_exit(127);
    }
    children.push_back(pid);
  }
  int failures = 0;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failures;
      for (pid_t other : children) ::kill(other, SIGTERM);  // do not leave the others waiting
    }
  }
  std::error_code ignored;
  fs::remove_all(pattern, ignored);
  return failures == 0 ? 0 : 1;
}

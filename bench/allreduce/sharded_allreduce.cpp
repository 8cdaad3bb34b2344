// What the sharded outer state's communication costs beside the replicated one's: per model size,
// the time of one all-reduce against reduce_scatter followed by allgather_shards (runtime/comm/comm.hpp)
// of the same buffer. `local` / `ucx`: W ranks are threads of this process, each with its own
// communicator and progress thread (UCX: UCX_TLS as set, memory rendezvous). `launched`: this
// process is one rank of a group a launcher formed (co2run; transport AUTO, i.e. UCX), W unused.
//   sharded_allreduce local|ucx W [MIN_MIB MAX_MIB [fp32|bf16|int8|fp4]]
//   co2run --nproc-per-node W sharded_allreduce launched 0 [MIN_MIB MAX_MIB [fp32|bf16|int8|fp4]]
// Columns: fp32 bytes of the buffer, seconds per all-reduce, seconds per reduce-scatter, per
// shard all-gather, their sum, and sum / all-reduce. The two are timed alternately in one loop
// (so that both see the same machine load) until MIN_SECONDS and MIN_ITERS are reached; the
// median of each is printed (launched: the largest median over the ranks).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/group/group.hpp"
#include "transports/local/transport.hpp"
#ifdef CO2_HAVE_UCX
#include "rendezvous/store.hpp"
#include "transports/ucx/transport.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using co2::Communicator;
using co2::Request;
constexpr double kMinSeconds = 2.0;
constexpr int kMinIters = 5;
constexpr std::chrono::milliseconds kFormTimeout{60000};

std::vector<std::shared_ptr<Communicator>> form(const std::string& kind, int size) {
  if (kind == "launched") return {co2::form_group(co2::GroupRequest{})};
  std::vector<std::unique_ptr<co2::transport::PointToPoint>> transports(static_cast<size_t>(size));
#ifdef CO2_HAVE_UCX
  auto store = co2::store::make_memory_store();
#endif
  std::vector<std::thread> joiners;
  for (int rank = 0; rank < size; ++rank)
    joiners.emplace_back([&, rank] {
#ifdef CO2_HAVE_UCX
      if (kind == "ucx") {
        transports[size_t(rank)] = co2::transport::ucx::connect(*store, "bench/", rank, size, kFormTimeout);
        return;
      }
#endif
      transports[size_t(rank)] = co2::transport::local::join("sharded-bench", rank, size, kFormTimeout, {});
    });
  for (auto& joiner : joiners) joiner.join();
  std::vector<std::shared_ptr<Communicator>> group;
  for (auto& transport : transports)
    group.push_back(std::make_unique<Communicator>(std::move(transport), co2::CommOptions{}));
  return group;
}

// Seconds from the first rank's submission to the last rank's completion.
double timed(size_t ranks, const std::function<std::shared_ptr<Request>(size_t)>& issue) {
  const auto start = Clock::now();
  std::vector<std::shared_ptr<Request>> requests;
  for (size_t rank = 0; rank < ranks; ++rank) requests.push_back(issue(rank));
  for (auto& request : requests) request->wait_for(std::chrono::milliseconds(-1));
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const auto is = [&](const char* kind) { return argc >= 3 && std::strcmp(argv[1], kind) == 0; };
  if (!is("local") && !is("ucx") && !is("launched")) {
    std::fprintf(stderr, "usage: %s local|ucx|launched W [MIN_MIB MAX_MIB [fp32|bf16|int8|fp4]]\n", argv[0]);
    return 2;
  }
  const std::string kind = argv[1];
  const bool launched = kind == "launched";
  const int size = launched ? 1 : std::atoi(argv[2]);
  const size_t min_mib = argc > 4 ? size_t(std::atol(argv[3])) : 4;
  const size_t max_mib = argc > 4 ? size_t(std::atol(argv[4])) : 64;
  co2::WireFormat format = co2::WireFormat::F32;
  if (argc > 5) {
    const std::string name = argv[5];
    format = name == "bf16"   ? co2::WireFormat::BF16
             : name == "int8" ? co2::WireFormat::Int8
             : name == "fp4"  ? co2::WireFormat::Fp4
                              : co2::WireFormat::F32;
  }
  if (size < 1 || min_mib < 1 || max_mib < min_mib) {
    std::fprintf(stderr, "W must be >= 1 and 1 <= MIN_MIB <= MAX_MIB\n");
    return 2;
  }
  try {
    auto group = form(kind, size);
    const size_t ranks = group.size();
    Communicator& first = *group[0];
    const bool printing = first.rank() == 0;
    // Launched: every rank must run the same iterations, and report the slowest rank's time.
    const auto agree = [&](void* value, co2::DataType dtype) {
      if (launched) first.allreduce(value, 1, dtype, co2::ReduceOp::Max)->wait_for(std::chrono::milliseconds(-1));
    };
    if (printing) {
      std::printf("# sharded_allreduce %s W %d wire %s\n", kind.c_str(), launched ? first.size() : size,
                  co2::wire_format_name(format));
      std::printf("# bytes allreduce_s reduce_scatter_s allgather_shards_s sharded_s sharded/allreduce\n");
    }
    for (size_t mib = min_mib; mib <= max_mib; mib *= 4) {
      const size_t count = (mib << 20) / sizeof(float);
      std::vector<std::vector<float>> buffers(ranks), residuals(ranks);
      for (size_t rank = 0; rank < ranks; ++rank) {
        buffers[rank].assign(count, float(rank + 1) * 1e-3f);
        if (format != co2::WireFormat::F32) residuals[rank].assign(count, 0.0f);
      }
      const auto wire = [&](size_t rank) {
        return co2::WireCompression{format, format == co2::WireFormat::F32 ? nullptr : residuals[rank].data(), {}};
      };
      const auto allreduce = [&](size_t rank) {
        return group[rank]->allreduce_then(buffers[rank].data(), count, co2::DataType::F32, co2::ReduceOp::Avg,
                                           {}, {}, wire(rank));
      };
      const auto scatter = [&](size_t rank) {
        return group[rank]->reduce_scatter(buffers[rank].data(), count, co2::DataType::F32, co2::ReduceOp::Avg,
                                           {}, wire(rank));
      };
      const auto gather = [&](size_t rank) {
        return group[rank]->allgather_shards(buffers[rank].data(), count, co2::DataType::F32);
      };
      timed(ranks, allreduce);  // warm-up: connections, staging, page faults
      timed(ranks, scatter);
      timed(ranks, gather);
      std::vector<double> reduced, scattered, gathered, sharded;
      const auto start = Clock::now();
      for (int32_t done = 0; !done;) {
        reduced.push_back(timed(ranks, allreduce));
        scattered.push_back(timed(ranks, scatter));
        gathered.push_back(timed(ranks, gather));
        sharded.push_back(scattered.back() + gathered.back());
        done = printing && int(reduced.size()) >= kMinIters &&
               std::chrono::duration<double>(Clock::now() - start).count() >= kMinSeconds;
        agree(&done, co2::DataType::I32);
      }
      double medians[4] = {median(reduced), median(scattered), median(gathered), median(sharded)};
      for (double& value : medians) agree(&value, co2::DataType::F64);
      if (printing)
        std::printf("%zu %.6f %.6f %.6f %.6f %.3f\n", mib << 20, medians[0], medians[1], medians[2], medians[3],
                    medians[3] / medians[0]);
      std::fflush(stdout);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "sharded_allreduce: %s\n", error.what());
    return 1;
  }
  return 0;
}

// Runs every algorithm and every raw collective on deterministic inputs and writes each rank's
// results to files, so that a driver can compare the transports byte for byte.
//
//   algorithm_worker OUTDIR                 one rank, under a launcher (co2run): transport AUTO
//   algorithm_worker --threads W OUTDIR     W ranks as threads of this process: transport LOCAL
//
// Files: OUTDIR/<case>.rank<R>.bin. Exit status 0 when every call succeeded, 1 otherwise (the
// failing call, its status and message on stderr).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../synthetic.hpp"

namespace {

using co2test::Layout;
using co2test::Storage;

void check(co2_status_t status, const char* what) {
  if (status != CO2_OK)
    throw std::runtime_error(std::string(what) + " -> " + std::to_string(status) + " (" +
                             co2_status_string(status) + "): " + co2_last_error_message());
}
#define CHECK(call) check((call), #call)

struct Output {
  std::string directory;
  int rank;
  void write(const std::string& name, const void* data, size_t bytes) const {
    std::ofstream out(directory + "/" + name + ".rank" + std::to_string(rank) + ".bin", std::ios::binary);
    out.write(static_cast<const char*>(data), std::streamsize(bytes));
    if (!out) throw std::runtime_error("cannot write " + name);
  }
};

struct AlgorithmCase {
  std::string name;
  co2_algorithm_t algorithm;
  Storage storage;
  co2_penalty_t penalty;
  co2_clip_t clip;
  int nesterov;
  double outer_momentum;
  co2_wire_format_t wire_format = CO2_WIRE_FP32;
  int error_feedback = CO2_DEFAULT_ERROR_FEEDBACK;
  int shard_outer_state = 0;
};

const std::vector<AlgorithmCase>& algorithm_cases() {
  static const std::vector<AlgorithmCase> cases = {
      {"co2_plain", CO2_ALGO_CO2, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
      {"co2_gap_norm_nesterov", CO2_ALGO_CO2, Storage::AllocFlat, CO2_PENALTY_GAP, CO2_CLIP_NORM, 1, 0.5},
      {"co2_constant_value", CO2_ALGO_CO2, Storage::AdoptFlat, CO2_PENALTY_CONSTANT, CO2_CLIP_VALUE, 0, 0.9},
      {"diloco_nesterov", CO2_ALGO_DILOCO, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 1, 0.9},
      {"localsgd", CO2_ALGO_LOCALSGD, Storage::AllocFlat, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
      {"sync", CO2_ALGO_SYNC, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
      // Compressed outer all-reduce: the anchors stay bit-identical across ranks and transports.
      {"co2_bf16_ef", CO2_ALGO_CO2, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.5,
       CO2_WIRE_BF16, 1},
      {"co2_int8_ef_gap_norm", CO2_ALGO_CO2, Storage::AllocFlat, CO2_PENALTY_GAP, CO2_CLIP_NORM, 1, 0.5,
       CO2_WIRE_INT8, 1},
      {"diloco_int8_no_ef", CO2_ALGO_DILOCO, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.9,
       CO2_WIRE_INT8, 0},
      {"co2_fp4_ef", CO2_ALGO_CO2, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.5,
       CO2_WIRE_FP4, 1},
      // Sharded outer state: reduce-scatter, shard update, all-gather, chained on the progress
      // thread; the gathered anchor bit-identical across ranks and transports.
      {"co2_sharded_constant_value", CO2_ALGO_CO2, Storage::AdoptFlat, CO2_PENALTY_CONSTANT, CO2_CLIP_VALUE, 1, 0.9,
       CO2_WIRE_FP32, 1, 1},
      {"co2_sharded_bf16_ef", CO2_ALGO_CO2, Storage::Registered, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0,
       CO2_WIRE_BF16, 1, 1},
      {"co2_sharded_gap_norm", CO2_ALGO_CO2, Storage::AllocFlat, CO2_PENALTY_GAP, CO2_CLIP_NORM, 1, 0.5,
       CO2_WIRE_FP32, 1, 1},
  };
  return cases;
}

constexpr int kTau = 3;
// Small chunks, so that the collectives above are split into many pipelined pieces.
constexpr uint64_t kChunkBytes = 64 * 1024;
constexpr int kRounds = 5;

// One algorithm on the mixed layout (sizes that divide nothing, every role) plus a tensor larger
// than several collective chunks; writes the final parameters and the anchor consensus.
void run_algorithm(co2_comm_t comm, int rank, int world, const AlgorithmCase& c, const Output& out) {
  Layout layout = co2test::layout_mixed(c.storage);
  layout.tensors.push_back({"large", 300007, CO2_ROLE_PARAMETER});
  const co2test::Data data = co2test::make_data(layout, world, 42);
  co2test::LocalModel model(layout, data, rank);
  co2_engine_config_t config = CO2_ENGINE_CONFIG_INIT;
  config.algorithm = c.algorithm;
  config.tau = kTau;
  config.penalty = c.penalty;
  config.penalty_constant = 2.0;
  config.clip = c.clip;
  config.clip_threshold = 0.05;
  config.nesterov = c.nesterov;
  config.outer_momentum = c.outer_momentum;
  config.outer_lr = c.algorithm == CO2_ALGO_DILOCO ? 0.7 : 1.0;
  config.wire_format = c.wire_format;
  config.error_feedback = c.error_feedback;
  config.shard_outer_state = c.shard_outer_state;
  co2test::EngineGuard engine;
  CHECK(co2_engine_create(comm, &config, &engine.engine));
  CHECK(model.register_with(engine.engine));
  CHECK(co2_engine_commit(engine.engine));
  std::vector<std::vector<float>> grads;
  for (uint64_t k = 0; k < uint64_t(kTau * kRounds + 1); ++k) {
    if (c.algorithm == CO2_ALGO_SYNC) {
      // SGD on the synthetic objective with the averaged gradient of p - target (trained
      // tensors only), so that every rank applies the same step.
      std::vector<void*> pointers;
      grads.clear();
      for (size_t t = 0; t < model.num_tensors(); ++t) {
        if (model.role(t) != CO2_ROLE_PARAMETER) continue;
        std::vector<float> g(model.count(t));
        for (size_t i = 0; i < g.size(); ++i) g[i] = model.tensor(t)[i] - data.target[rank][t][i];
        grads.push_back(std::move(g));
      }
      for (auto& g : grads) pointers.push_back(g.data());
      CHECK(co2_engine_reduce_gradients(engine.engine, pointers.data(), pointers.size(), nullptr));
      const float lr = co2test::inner_lr(k);
      size_t next = 0;
      for (size_t t = 0; t < model.num_tensors(); ++t) {
        if (model.role(t) != CO2_ROLE_PARAMETER) continue;
        const std::vector<float>& g = grads[next++];
        for (size_t i = 0; i < g.size(); ++i) model.tensor(t)[i] -= lr * g[i];
      }
    } else {
      model.inner_step(k);
    }
    CHECK(co2_engine_step(engine.engine, nullptr, nullptr));
  }
  // co2 and diloco keep an anchor; localsgd and sync do not: their consensus is the average.
  const bool has_anchor = c.algorithm == CO2_ALGO_CO2 || c.algorithm == CO2_ALGO_DILOCO;
  std::vector<float> consensus(layout.state_elements());
  CHECK(co2_engine_consensus(engine.engine, has_anchor ? CO2_CONSENSUS_ANCHOR : CO2_CONSENSUS_LOCAL_AVERAGE,
                             consensus.data(), consensus.size()));
  out.write(c.name + ".consensus", consensus.data(), consensus.size() * sizeof(float));
  CHECK(co2_engine_finalize(engine.engine));
  const std::vector<float> params = model.gather_state();
  out.write(c.name + ".final", params.data(), params.size() * sizeof(float));
}

template <typename T>
std::vector<T> collective_input(int rank, size_t count, int salt) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) {
    const float u = co2test::uniform_float(co2test::splitmix64(uint64_t(salt) * 977 + uint64_t(rank)) + i, -100.f, 100.f);
    v[i] = T(u);
  }
  return v;
}

void wait_and_free(co2_request_t request) {
  CHECK(co2_request_wait(request, -1));
  CHECK(co2_request_free(request));
}

template <typename T>
void run_collectives_of(co2_comm_t comm, int rank, co2_dtype_t dtype, const char* type_name, const Output& out) {
  const size_t sizes[] = {1, 1000, 700001};  // one element, below one chunk, several chunks
  const co2_reduce_op_t ops[] = {CO2_REDUCE_SUM, CO2_REDUCE_AVG, CO2_REDUCE_MIN, CO2_REDUCE_MAX};
  const char* op_names[] = {"sum", "avg", "min", "max"};
  int salt = 0;
  for (size_t count : sizes) {
    for (int o = 0; o < 4; ++o) {
      std::vector<T> buffer = collective_input<T>(rank, count, ++salt);
      co2_request_t request;
      CHECK(co2_allreduce(comm, buffer.data(), count, dtype, ops[o], nullptr, &request));
      wait_and_free(request);
      out.write(std::string("allreduce_") + type_name + "_" + op_names[o] + "_" + std::to_string(count),
                buffer.data(), count * sizeof(T));
    }
    std::vector<T> buffer = collective_input<T>(rank, count, ++salt);
    co2_request_t request;
    CHECK(co2_broadcast(comm, buffer.data(), count, dtype, int32_t(count % 2), nullptr, &request));
    wait_and_free(request);
    out.write(std::string("broadcast_") + type_name + "_" + std::to_string(count), buffer.data(), count * sizeof(T));
  }
}

void run_rank(co2_comm_t comm, const std::string& directory) {
  int32_t rank = 0, world = 0;
  CHECK(co2_comm_rank(comm, &rank));
  CHECK(co2_comm_size(comm, &world));
  const Output out{directory, rank};
  run_collectives_of<float>(comm, rank, CO2_DTYPE_FP32, "f32", out);
  run_collectives_of<double>(comm, rank, CO2_DTYPE_FP64, "f64", out);
  run_collectives_of<int32_t>(comm, rank, CO2_DTYPE_INT32, "i32", out);
  run_collectives_of<int64_t>(comm, rank, CO2_DTYPE_INT64, "i64", out);
  for (const auto& c : algorithm_cases()) run_algorithm(comm, rank, world, c, out);
}

int run_guarded(const std::function<void()>& body, const std::string& who) {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--threads") == 0) {
    const int world = std::atoi(argv[2]);
    const std::string directory = argv[3];
    std::vector<std::thread> threads;
    std::vector<int> failed(world, 0);
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        failed[r] = run_guarded([&] {
          co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
          config.transport = CO2_TRANSPORT_LOCAL;
          config.rank = r;
          config.world_size = world;
          config.group_name = "algorithm_worker";
          config.timeout_ms = 60000;
          config.chunk_bytes = kChunkBytes;
          co2_comm_t comm;
          CHECK(co2_comm_create(&config, &comm));
          try {
            run_rank(comm, directory);
          } catch (...) {
            co2_comm_abort(comm);
            co2_comm_destroy(comm);
            throw;
          }
          CHECK(co2_comm_destroy(comm));
        }, "thread rank " + std::to_string(r));
      });
    }
    for (auto& t : threads) t.join();
    for (int f : failed)
      if (f) return 1;
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTDIR  (under a launcher) | %s --threads W OUTDIR\n", argv[0], argv[0]);
    return 2;
  }
  const std::string directory = argv[1];
  return run_guarded([&] {
    co2_comm_config_t config = CO2_COMM_CONFIG_INIT;  // AUTO; rank and world from the launcher
    config.timeout_ms = 60000;
    config.chunk_bytes = kChunkBytes;
    co2_comm_t comm;
    CHECK(co2_comm_create(&config, &comm));
    run_rank(comm, directory);
    CHECK(co2_comm_destroy(comm));
  }, "process");
}

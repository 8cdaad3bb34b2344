// The synthetic training problem of the device tests: the same tensors, gradients, policies and
// checkpoints for the GPU tests (gpu_test.cpp) and the host executor's (host_executor_test.cpp),
// which build it against the real CUDA runtime and against runtime/backends/device/host_executor/.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/outer/param_types.hpp"
#include "tests/capi/rank_threads.hpp"

namespace co2test::device_training {

struct TensorShape {
  const char* name;
  size_t count;
  co2_tensor_role_t role;
};
// Sizes that are not multiples of the chunk (4096) or of anything else; a BUFFER segment too.
const TensorShape kShapes[] = {{"w", 2 * 4096 + 3, CO2_ROLE_PARAMETER},
                               {"b", 37, CO2_ROLE_PARAMETER},
                               {"stats", 11, CO2_ROLE_BUFFER}};

inline float inner_gradient(size_t tensor, size_t i, int step, int rank) {
  return std::sin(0.001f * float(i) + 0.1f * float(step) + 0.7f * float(rank) + float(tensor));
}

struct Result {
  std::vector<std::vector<float>> params;  // rank 0's tensors after finalize
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
};

// A checkpoint taken after `save_after` steps (a boundary, so that the parameters equal the
// anchor and the average is in flight), or a run that starts from one at step `resume_at`.
struct Checkpointing {
  int save_after = -1;
  std::vector<std::vector<char>>* saved = nullptr;            // per rank
  const std::vector<std::vector<char>>* restore = nullptr;    // per rank
  int resume_at = 0;
};

inline int append_bytes(void* user, const void* data, size_t length) {
  auto* blob = static_cast<std::vector<char>*>(user);
  blob->insert(blob->end(), static_cast<const char*>(data), static_cast<const char*>(data) + length);
  return 0;
}

struct Reader {
  const std::vector<char>* blob;
  size_t offset = 0;
};
inline int read_bytes(void* user, void* data, size_t length) {
  auto* r = static_cast<Reader*>(user);
  if (r->offset + length > r->blob->size()) return 1;
  std::memcpy(data, r->blob->data() + r->offset, length);
  r->offset += length;
  return 0;
}

// The parameters as stored: fp32 in `host` itself, or 16-bit words in `stored`.
struct Precision {
  co2_dtype_t dtype = CO2_DTYPE_FP32;
  bool sixteen_bit() const { return dtype != CO2_DTYPE_FP32; }
  size_t element_bytes() const { return sixteen_bit() ? 2 : 4; }
  float widen(uint16_t bits) const {
    return dtype == CO2_DTYPE_BF16 ? co2::widen(co2::Bf16{bits}) : co2::widen(co2::Fp16{bits});
  }
  uint16_t narrow(float x) const {
    return dtype == CO2_DTYPE_BF16 ? co2::narrow<co2::Bf16>(x).bits : co2::narrow<co2::Fp16>(x).bits;
  }
};

// Hierarchical co2's nodes, faked in one process: rank r is on node r / ranks_per_node (its
// communicator's node_id), and each step's gradients are averaged inside the node
// (co2_engine_reduce_gradients), so that a node's ranks train one model. 0: flat.
struct Nodes {
  int ranks_per_node = 0;
};

// One rank: registers kShapes (host or device, of `precision`), runs `steps` inner steps (SGD on a
// synthetic gradient, applied on the host in fp32, stored rounded and uploaded for device
// tensors), finalizes.
inline void train_rank(co2_comm_t comm, int rank, bool device, const co2_engine_config_t& config, int steps,
                Result* out, const Checkpointing& checkpointing = {}, Precision precision = {}, Nodes nodes = {}) {
  co2_engine_t engine = nullptr;
  CO2_ASSERT_OK(co2_engine_create(comm, &config, &engine));
  std::vector<std::vector<float>> host;
  std::vector<std::vector<uint16_t>> stored(std::size(kShapes));
  std::vector<void*> dev;
  auto storage_of = [&](size_t t) -> void* {
    return precision.sixteen_bit() ? static_cast<void*>(stored[t].data()) : static_cast<void*>(host[t].data());
  };
  for (size_t t = 0; t < std::size(kShapes); ++t) {
    host.emplace_back(kShapes[t].count);
    for (size_t i = 0; i < host[t].size(); ++i) host[t][i] = 0.01f * float(i % 97) - 0.3f + 0.05f * float(rank);
    if (precision.sixteen_bit())
      for (float x : host[t]) stored[t].push_back(precision.narrow(x));
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = kShapes[t].name;
    tensor.count = kShapes[t].count;
    tensor.role = kShapes[t].role;
    tensor.dtype = precision.dtype;
    const size_t bytes = tensor.count * precision.element_bytes();
    if (device) {
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, storage_of(t), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      dev.push_back(d);
      tensor.data = d;
      tensor.device = CO2_DEVICE_CUDA;
    } else {
      tensor.data = storage_of(t);
    }
    CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
  }
  CO2_ASSERT_OK(co2_engine_commit(engine));
  auto download = [&] {
    for (size_t t = 0; t < host.size(); ++t) {
      if (device) {
        ASSERT_EQ(cudaMemcpy(storage_of(t), dev[t], host[t].size() * precision.element_bytes(), cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
      if (precision.sixteen_bit())
        for (size_t i = 0; i < host[t].size(); ++i) host[t][i] = precision.widen(stored[t][i]);
    }
  };
  if (checkpointing.restore) {
    Reader reader{&(*checkpointing.restore)[size_t(rank)]};
    CO2_ASSERT_OK(co2_engine_load(engine, read_bytes, &reader));
    ASSERT_EQ(reader.offset, reader.blob->size());
    download();
  }
  auto upload = [&] {
    for (size_t t = 0; t < host.size(); ++t) {
      if (precision.sixteen_bit())
        for (size_t i = 0; i < host[t].size(); ++i) stored[t][i] = precision.narrow(host[t][i]);
      if (device) {
        ASSERT_EQ(cudaMemcpy(dev[t], storage_of(t), host[t].size() * precision.element_bytes(), cudaMemcpyHostToDevice),
                  cudaSuccess);
      }
    }
  };
  for (int step = checkpointing.resume_at; step < steps; ++step) {
    if (step == checkpointing.save_after) {
      auto& blob = (*checkpointing.saved)[size_t(rank)];
      blob.clear();
      CO2_ASSERT_OK(co2_engine_save(engine, append_bytes, &blob));
      size_t size = 0;
      CO2_ASSERT_OK(co2_engine_state_size(engine, &size));
      EXPECT_EQ(size, blob.size());
    }
    download();
    std::vector<std::vector<float>> grads(host.size());
    for (size_t t = 0; t < host.size(); ++t) {
      grads[t].resize(host[t].size());
      for (size_t i = 0; i < host[t].size(); ++i) grads[t][i] = inner_gradient(t, i, step, rank);
    }
    if (config.algorithm == CO2_ALGO_SYNC || nodes.ranks_per_node > 0) {
      std::vector<float*> dgrads;
      std::vector<void*> pointers;
      for (size_t t = 0; t < host.size(); ++t) {
        if (kShapes[t].role != CO2_ROLE_PARAMETER) continue;
        if (device) {
          float* d = nullptr;
          ASSERT_EQ(cudaMalloc(&d, grads[t].size() * sizeof(float)), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(d, grads[t].data(), grads[t].size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
          dgrads.push_back(d);
          pointers.push_back(d);
        } else {
          pointers.push_back(grads[t].data());
        }
      }
      CO2_ASSERT_OK(co2_engine_reduce_gradients(engine, pointers.data(), pointers.size(), nullptr));
      for (size_t t = 0, k = 0; device && t < host.size(); ++t) {
        if (kShapes[t].role != CO2_ROLE_PARAMETER) continue;
        ASSERT_EQ(cudaMemcpy(grads[t].data(), dgrads[k], grads[t].size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(dgrads[k++]);
      }
    }
    for (size_t t = 0; t < host.size(); ++t)
      for (size_t i = 0; i < host[t].size(); ++i) host[t][i] -= 0.05f * grads[t][i];
    upload();
    CO2_ASSERT_OK(co2_engine_step(engine, nullptr, nullptr));
  }
  CO2_ASSERT_OK(co2_engine_finalize(engine));
  download();
  if (rank == 0) {
    out->params = host;
    CO2_ASSERT_OK(co2_engine_get_stats(engine, &out->stats));
  }
  CO2_ASSERT_OK(co2_engine_destroy(engine));
  for (void* d : dev) cudaFree(d);
}

inline Result run(bool device, int world, const co2_engine_config_t& config, int steps, const Checkpointing& checkpointing = {},
                  Precision precision = {}, Nodes nodes = {}) {
  Result result;
  co2test::CommOptions options;
  options.ranks_per_node = nodes.ranks_per_node;
  co2test::run_ranks(
      world,
      [&](int rank, co2_comm_t comm) {
        cudaSetDevice(0);
        train_rank(comm, rank, device, config, steps, &result, checkpointing, precision, nodes);
      },
      options);
  return result;
}

struct Policy {
  const char* name;
  co2_algorithm_t algorithm;
  co2_penalty_t penalty;
  co2_clip_t clip;
  int nesterov;
  double beta;
};
const Policy kPolicies[] = {
    {"co2 plain", CO2_ALGO_CO2, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
    {"co2 constant+value clip", CO2_ALGO_CO2, CO2_PENALTY_CONSTANT, CO2_CLIP_VALUE, 0, 0.5},
    {"co2 gap+norm clip", CO2_ALGO_CO2, CO2_PENALTY_GAP, CO2_CLIP_NORM, 0, 0.3},
    {"co2 nesterov+gap", CO2_ALGO_CO2, CO2_PENALTY_GAP, CO2_CLIP_NONE, 1, 0.9},
    {"diloco nesterov", CO2_ALGO_DILOCO, CO2_PENALTY_NONE, CO2_CLIP_NONE, 1, 0.9},
    {"diloco gap+norm clip", CO2_ALGO_DILOCO, CO2_PENALTY_GAP, CO2_CLIP_NORM, 0, 0.2},
    {"localsgd", CO2_ALGO_LOCALSGD, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
    {"sync", CO2_ALGO_SYNC, CO2_PENALTY_NONE, CO2_CLIP_NONE, 0, 0.0},
};

inline co2_engine_config_t config_of(const Policy& p) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.algorithm = p.algorithm;
  c.tau = 3;
  c.outer_lr = 0.8;
  c.outer_momentum = p.beta;
  c.nesterov = p.nesterov;
  c.penalty = p.penalty;
  c.penalty_constant = 2.0;
  c.clip = p.clip;
  c.clip_threshold = p.clip == CO2_CLIP_VALUE ? 0.01 : 0.05;  // low enough that clipping happens
  c.anchor_check_interval = 2;
  return c;
}

}  // namespace co2test::device_training

// Every feature of the device path against the host backend. Built twice: on the host executor
// (runtime/backends/device/host_executor/: device_backend.cpp, its kernels' element math and its staging
// run on the CPU, so every build checks the CUDA path without a GPU), and, in CUDA builds, with
// CO2_FEATURES_ON_GPU against the real runtime and kernels (scripts/gpu-check.sh; exit 77 without
// a usable device). The tests of the order of operations need the executor's record.
//
// Equality is bit for bit where no norm is involved: the host executor runs the kernels'
// CO2_HOST_DEVICE element functions (kernel_math.hpp), and the averages arrive through the same
// communicator in the same order. The gap penalty and norm clipping depend on a sum of squares
// that the host pass folds in fp32 lanes of 128 elements and the kernels in fp64 per chunk: the
// penalties and scales then agree to about 1e-7 relative, and the parameters to the GPU test's
// tolerance (2e-5 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/runtime/backends/device/device_training.hpp"
#include "transports/collective.hpp"
#include "tests/runtime/comm/collective_group_fake.hpp"
#ifdef CO2_FEATURES_ON_GPU
#include <cstdio>

#include "runtime/backends/device/selection.hpp"
#else
#include "runtime/backends/device/host_executor/executor_log.hpp"
#endif

namespace {

using namespace co2test::device_training;

bool uses_norms(const co2_engine_config_t& c) { return c.penalty == CO2_PENALTY_GAP || c.clip == CO2_CLIP_NORM; }

void expect_equal(const Result& device, const Result& host, bool bitwise, const std::string& what) {
  ASSERT_EQ(device.params.size(), host.params.size()) << what;
  for (size_t t = 0; t < host.params.size(); ++t)
    for (size_t i = 0; i < host.params[t].size(); ++i) {
      const float d = device.params[t][i], h = host.params[t][i];
      if (bitwise)
        ASSERT_EQ(std::memcmp(&d, &h, sizeof(float)), 0)
            << what << ": tensor " << kShapes[t].name << " element " << i << ": device " << d << " host " << h;
      else
        ASSERT_NEAR(d, h, 2e-5f * (1.0f + std::fabs(h))) << what << ": tensor " << kShapes[t].name << " element " << i;
    }
  EXPECT_EQ(device.stats.rounds, host.stats.rounds) << what;
  EXPECT_EQ(device.stats.outer_updates, host.stats.outer_updates) << what;
  const double relative = bitwise ? 0.0 : 1e-6;
  EXPECT_NEAR(device.stats.last_penalty_min, host.stats.last_penalty_min, relative * host.stats.last_penalty_min) << what;
  EXPECT_NEAR(device.stats.last_clip_scale_min, host.stats.last_clip_scale_min, relative * host.stats.last_clip_scale_min)
      << what;
  EXPECT_NEAR(device.stats.last_clip_fraction, host.stats.last_clip_fraction, bitwise ? 0.0 : 1e-3) << what;
}

// co2 runs under both outer policies, delayed (eager 0) and eager (1); the others have one.
std::vector<co2_engine_config_t> configs_of(const Policy& p) {
  co2_engine_config_t c = config_of(p);
  c.eager = 0;
  if (p.algorithm != CO2_ALGO_CO2) return {c};
  co2_engine_config_t eager = c;
  eager.eager = 1;
  return {c, eager};
}

std::string name_of(const Policy& p, const co2_engine_config_t& c, int world) {
  return std::string(p.name) + (c.eager == 1 ? " eager" : "") + " W=" + std::to_string(world);
}

co2_engine_config_t delayed_config_of(const Policy& p) { return configs_of(p)[0]; }

TEST(DeviceFeatures, DevicePathEqualsHostForEveryAlgorithmAndPolicy) {
  for (const Policy& p : kPolicies)
    for (const co2_engine_config_t& c : configs_of(p))
      for (int world : {1, 2})
        expect_equal(run(true, world, c, 14), run(false, world, c, 14), !uses_norms(c), name_of(p, c, world));
}

// Applying the average on arrival at a fixed step (delayed and eager, every policy; the agreed
// step depends on timing, which two runs do not share): the kernels' pass that keeps the
// parameters' progress equals the host's.
TEST(DeviceFeatures, ApplyOnArrivalEqualsHost) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2) continue;
    for (co2_engine_config_t c : configs_of(p))
      for (int world : {1, 2}) {
        c.apply_step = 1 + int(c.tau > 2);
        const Result device = run(true, world, c, 14), host = run(false, world, c, 14);
        expect_equal(device, host, !uses_norms(c), name_of(p, c, world) + " apply_step " + std::to_string(c.apply_step));
        EXPECT_EQ(device.stats.arrival_updates, host.stats.arrival_updates);
        EXPECT_GT(device.stats.arrival_updates, 0u) << name_of(p, c, world);
      }
  }
}

// Saved at a boundary with the average in flight (the blob carries the step it is applied at),
// the device engine resumes bit for bit, as the host does. (This harness resumes at boundaries
// only; tests/capi/checkpoint_test.cpp saves mid-round, before and after the step, on the host.)
TEST(DeviceFeatures, ApplyOnArrivalCheckpointsResumeBitForBit) {
  co2_engine_config_t c = configs_of(kPolicies[1])[1];  // eager
  c.tau = 4;
  c.apply_step = 2;
  for (int save_after : {8})
    for (bool device : {true, false}) {
      std::vector<std::vector<char>> blobs(2);
      Checkpointing save;
      save.save_after = save_after;
      save.saved = &blobs;
      const Result straight = run(device, 2, c, 18, save);
      Checkpointing resume;
      resume.restore = &blobs;
      resume.resume_at = save_after;
      expect_equal(run(device, 2, c, 18, resume), straight, true,
                   std::string(device ? "device" : "host") + " saved after step " + std::to_string(save_after));
    }
}

// CO2_EAGER_AUTO, the default, is the eager policy on CUDA tensors as on host tensors.
TEST(DeviceFeatures, EagerAutoIsEagerOnTheDevice) {
  co2_engine_config_t automatic = config_of(kPolicies[1]);
  ASSERT_EQ(automatic.eager, CO2_EAGER_AUTO);
  co2_engine_config_t eager = automatic;
  eager.eager = 1;
  const Result by_auto = run(true, 2, automatic, 14);
  expect_equal(by_auto, run(true, 2, eager, 14), true, "auto against eager");
  co2_engine_config_t delayed = automatic;
  delayed.eager = 0;
  EXPECT_NE(run(true, 2, delayed, 14).params, by_auto.params) << "the policies must differ for this test to mean anything";
}

// Saved at a boundary with the co2 average in flight, an engine resumes bit for bit: the
// average, the anchor, the momentum and the gap history travel through the checkpoint. Only the
// algorithms with an anchor: localsgd and sync keep no copy of the parameters, which the
// framework checkpoints itself.
TEST(DeviceFeatures, CheckpointsResumeBitForBitOnDeviceAsOnHost) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2 && p.algorithm != CO2_ALGO_DILOCO) continue;
    for (const co2_engine_config_t& c : configs_of(p))  // tau 3
      for (bool device : {true, false})
        for (int world : {1, 2}) {
          std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
          Checkpointing save;
          save.save_after = 9;
          save.saved = &blobs;
          const Result straight = run(device, world, c, 15, save);
          Checkpointing resume;
          resume.restore = &blobs;
          resume.resume_at = 9;
          const Result resumed = run(device, world, c, 15, resume);
          expect_equal(resumed, straight, true, name_of(p, c, world) + (device ? " device" : " host") + " resumed");
        }
  }
}

// A checkpoint carries its policy: an eager blob loaded into an engine committed with eager = 0
// resumes eager (offsets and their momentum restored), on the device as on the host.
TEST(DeviceFeatures, EagerCheckpointResumesEagerInAnEngineCommittedDelayed) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2) continue;
    const co2_engine_config_t eager = configs_of(p)[1], delayed = configs_of(p)[0];
    for (bool device : {true, false}) {
      std::vector<std::vector<char>> blobs(2);
      Checkpointing save;
      save.save_after = 9;
      save.saved = &blobs;
      const Result straight = run(device, 2, eager, 15, save);
      Checkpointing resume;
      resume.restore = &blobs;
      resume.resume_at = 9;
      expect_equal(run(device, 2, delayed, 15, resume), straight, true,
                   name_of(p, eager, 2) + (device ? " device" : " host") + " loaded into a delayed engine");
    }
  }
}

// Compressed outer all-reduces: the device stages its deltas through host memory and the host's
// wire code encodes them, with error feedback, so the results equal the host backend's.
TEST(DeviceFeatures, WireFormatsWithErrorFeedbackEqualHost) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2 && p.algorithm != CO2_ALGO_DILOCO) continue;
    for (co2_engine_config_t c : configs_of(p))
      for (co2_wire_format_t wire : {CO2_WIRE_BF16, CO2_WIRE_INT8, CO2_WIRE_FP4})
        for (int feedback : {0, 1}) {
          c.wire_format = wire;
          c.error_feedback = feedback;
          const char* format = wire == CO2_WIRE_BF16 ? " bf16" : wire == CO2_WIRE_INT8 ? " int8" : " fp4";
          const std::string what = name_of(p, c, 2) + format + " wire" +
                                   (feedback ? " with error feedback" : "");
          expect_equal(run(true, 2, c, 14), run(false, 2, c, 14), !uses_norms(c), what);
        }
  }
}

// A checkpoint carries the error feedback's residual of a CUDA engine as of a host one.
TEST(DeviceFeatures, WireCheckpointsResumeBitForBit) {
  for (co2_engine_config_t c : configs_of(kPolicies[1])) {
    c.wire_format = CO2_WIRE_INT8;
    c.error_feedback = 1;
    std::vector<std::vector<char>> blobs(2);
    Checkpointing save;
    save.save_after = 9;
    save.saved = &blobs;
    const Result straight = run(true, 2, c, 15, save);
    Checkpointing resume;
    resume.restore = &blobs;
    resume.resume_at = 9;
    expect_equal(run(true, 2, c, 15, resume), straight, true, name_of(kPolicies[1], c, 2) + " int8 resumed");
  }
}

// bf16 and fp16 parameters with the fp32 outer state: read widened, deltas from the start as the
// parameters held it, written rounded, in the fused pass and in checkpoints, as on the host.
// localsgd (no anchor) averages the widened parameters in fp32 and rounds once, as the host
// does; its resume is the caller's (no anchor to restore the parameters from). sync's 16-bit
// gradients: SixteenBitGradientsAverageAsOnHost (this harness's gradients are fp32).
TEST(DeviceFeatures, SixteenBitParametersEqualHost) {
  for (co2_dtype_t dtype : {CO2_DTYPE_BF16, CO2_DTYPE_FP16})
    for (const Policy& p : kPolicies) {
      if (p.algorithm == CO2_ALGO_SYNC) continue;
      for (const co2_engine_config_t& c : configs_of(p))
        for (int world : {1, 2}) {
          const std::string what = name_of(p, c, world) + (dtype == CO2_DTYPE_BF16 ? " bf16" : " fp16");
          Precision precision;
          precision.dtype = dtype;
          expect_equal(run(true, world, c, 14, {}, precision), run(false, world, c, 14, {}, precision), !uses_norms(c),
                       what);
          if (p.algorithm == CO2_ALGO_LOCALSGD) continue;
          std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
          Checkpointing save;
          save.save_after = 9;
          save.saved = &blobs;
          const Result straight = run(true, world, c, 15, save, precision);
          Checkpointing resume;
          resume.restore = &blobs;
          resume.resume_at = 9;
          expect_equal(run(true, world, c, 15, resume, precision), straight, true, what + " resumed");
        }
    }
}

// co2_engine_reduce_gradients takes gradients in their parameter's dtype: 16-bit ones are widened,
// averaged in fp32 and rounded back, on the device as on the host (each rank's gradient differs);
// under co2 (a gradient buffer of its own) and sync (the comm buffer).
TEST(DeviceFeatures, SixteenBitGradientsAverageAsOnHost) {
  constexpr size_t kCount = 1000;
  for (co2_algorithm_t algorithm : {CO2_ALGO_CO2, CO2_ALGO_SYNC})
  for (co2_dtype_t dtype : {CO2_DTYPE_BF16, CO2_DTYPE_FP16}) {
    Precision precision;
    precision.dtype = dtype;
    std::vector<uint16_t> averaged[2];  // [device] on rank 0
    for (bool device : {false, true})
      co2test::run_ranks(2, [&](int rank, co2_comm_t comm) {
        cudaSetDevice(0);
        co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
        c.algorithm = algorithm;
        co2_engine_t engine = nullptr;
        CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
        std::vector<uint16_t> params(kCount, precision.narrow(0.5f)), grads(kCount);
        for (size_t i = 0; i < kCount; ++i) grads[i] = precision.narrow(0.001f * float(i) * float(rank + 1) - 0.3f);
        void* d_params = params.data();
        void* d_grads = grads.data();
        if (device) {
          ASSERT_EQ(cudaMalloc(&d_params, kCount * 2), cudaSuccess);
          ASSERT_EQ(cudaMalloc(&d_grads, kCount * 2), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(d_params, params.data(), kCount * 2, cudaMemcpyHostToDevice), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(d_grads, grads.data(), kCount * 2, cudaMemcpyHostToDevice), cudaSuccess);
        }
        co2_tensor_t tensor = CO2_TENSOR_INIT;
        tensor.name = "w";
        tensor.count = kCount;
        tensor.data = d_params;
        tensor.dtype = dtype;
        tensor.device = device ? CO2_DEVICE_CUDA : CO2_DEVICE_HOST;
        CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
        CO2_ASSERT_OK(co2_engine_commit(engine));
        CO2_ASSERT_OK(co2_engine_reduce_gradients(engine, &d_grads, 1, nullptr));
        if (device) {
          ASSERT_EQ(cudaMemcpy(grads.data(), d_grads, kCount * 2, cudaMemcpyDeviceToHost), cudaSuccess);
          cudaFree(d_params);
          cudaFree(d_grads);
        }
        if (rank == 0) averaged[device] = grads;
        CO2_ASSERT_OK(co2_engine_destroy(engine));
      });
    ASSERT_EQ(averaged[1].size(), kCount);
    EXPECT_EQ(averaged[1], averaged[0]) << (dtype == CO2_DTYPE_BF16 ? "bf16" : "fp16");
    // The average of 0.001 i - 0.3 and 0.002 i - 0.3, not either rank's own gradient.
    EXPECT_NEAR(precision.widen(averaged[1][500]), 0.45f, 0.01f);
  }
}

// Eager policy: a rank whose parameters went NaN sends a non-finite delta; every rank skips that
// average (NONFINITE at the next boundary) and the poisoned rank restarts from the anchor without
// its offsets, on the device (a kernel) as on the host. Two ranks, rank 1 poisoned in round 2.
std::vector<std::vector<float>> eager_after_poison(bool device, std::vector<co2_status_t>* statuses) {
  std::vector<std::vector<float>> params(2);
  co2test::run_ranks(2, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = delayed_config_of(kPolicies[1]);
    c.eager = 1;
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
    const size_t n = 4096 + 5;
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = 0.001f * float(i % 31) + 0.1f * float(rank);
    void* d = nullptr;
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.count = n;
    if (device) {
      ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      tensor.data = d;
      tensor.device = CO2_DEVICE_CUDA;
    } else {
      tensor.data = host.data();
    }
    CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
    CO2_ASSERT_OK(co2_engine_commit(engine));
    auto transfer = [&](bool down) {
      if (!device) return;
      ASSERT_EQ(down ? cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost)
                     : cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    };
    for (int step = 0; step < 15; ++step) {  // tau 3
      transfer(true);
      for (size_t i = 0; i < n; ++i) host[i] -= 0.01f * std::sin(0.01f * float(i) + float(step + rank));
      if (rank == 1 && step == 4) host[7] = std::nanf("");
      transfer(false);
      const co2_status_t status = co2_engine_step(engine, nullptr, nullptr);
      if (rank == 0) statuses->push_back(status);
    }
    CO2_ASSERT_OK(co2_engine_finalize(engine));
    transfer(true);
    params[size_t(rank)] = host;
    CO2_ASSERT_OK(co2_engine_destroy(engine));
    if (d) cudaFree(d);
  });
  return params;
}

TEST(DeviceFeatures, EagerRankWithANonFiniteDeltaRestartsFromTheAnchorAsOnHost) {
  std::vector<co2_status_t> device_statuses, host_statuses;
  const auto device = eager_after_poison(true, &device_statuses);
  const auto host = eager_after_poison(false, &host_statuses);
  EXPECT_EQ(device_statuses, host_statuses);
  EXPECT_NE(std::find(host_statuses.begin(), host_statuses.end(), CO2_ERR_NONFINITE), host_statuses.end())
      << "the poisoned round must be skipped for this test to mean anything";
  for (size_t r = 0; r < 2; ++r) {
    ASSERT_EQ(device[r].size(), host[r].size());
    for (size_t i = 0; i < host[r].size(); ++i) {
      ASSERT_TRUE(std::isfinite(device[r][i])) << "rank " << r << " element " << i;
      ASSERT_EQ(std::memcmp(&device[r][i], &host[r][i], sizeof(float)), 0)
          << "rank " << r << " element " << i << ": device " << device[r][i] << " host " << host[r][i];
    }
  }
}

// --- An update whose result overflows (docs/algorithm.md, "Results, not only inputs") ----------
// a = 3e38 at one element, its averaged delta c = a - p = -1e33 (finite), alpha = 1e6 for that
// round only: a - alpha * s = 3e38 + 1e39 overflows. The boundary that would apply it (co2: the
// next one; diloco: its own) must return CO2_ERR_NONFINITE with the anchor bitwise unchanged, on
// the device as on the host; the rounds after it must equal the host's. The momentum and the gap
// history are checked through those rounds: a momentum that took the -1e33 moves a[7] by about
// 1e33 at the next update (its ulp is 2e31), and a gap history advanced by the refused update
// changes the next penalty (mean step norm over one update more).
struct OverflowStep {
  co2_status_t status = CO2_OK;
  std::vector<float> anchor;  // rank 0's, after the step
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
};

constexpr size_t kOverflowCount = 4096 + 5;  // two chunks, the second partial
constexpr size_t kHuge = 7;                  // the element whose update overflows
constexpr int kOverflowRound = 3;            // its deltas are averaged with alpha = 1e6

std::vector<OverflowStep> overflow_run(bool device, int world, const co2_engine_config_t& config) {
  std::vector<OverflowStep> steps;
  co2test::run_ranks(world, [&](int rank, co2_comm_t comm) {
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &config, &engine));
    std::vector<float> host(kOverflowCount);
    for (size_t i = 0; i < host.size(); ++i) host[i] = 0.001f * float(i % 31);
    host[kHuge] = 3e38f;
    void* d = nullptr;
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.count = host.size();
    if (device) {
      ASSERT_EQ(cudaMalloc(&d, host.size() * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      tensor.data = d;
      tensor.device = CO2_DEVICE_CUDA;
    } else {
      tensor.data = host.data();
    }
    CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
    CO2_ASSERT_OK(co2_engine_commit(engine));
    auto transfer = [&](cudaMemcpyKind kind) {
      if (!device) return;
      const size_t bytes = host.size() * sizeof(float);
      ASSERT_EQ(kind == cudaMemcpyDeviceToHost ? cudaMemcpy(host.data(), d, bytes, kind)
                                               : cudaMemcpy(d, host.data(), bytes, kind),
                cudaSuccess);
    };
    for (int step = 0; step < 9; ++step) {  // tau 1: every step is a boundary
      const double alpha = step == kOverflowRound ? 1e6 : config.outer_lr;
      CO2_ASSERT_OK(co2_engine_set_param(engine, CO2_PARAM_OUTER_LR, alpha));
      transfer(cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < host.size(); ++i) host[i] -= 0.01f * std::sin(0.01f * float(i) + float(step + rank));
      if (step == kOverflowRound) host[kHuge] += 1e33f;
      transfer(cudaMemcpyHostToDevice);
      OverflowStep out;
      out.status = co2_engine_step(engine, nullptr, nullptr);
      out.anchor.assign(host.size(), -7.0f);
      CO2_ASSERT_OK(co2_engine_consensus(engine, CO2_CONSENSUS_ANCHOR, out.anchor.data(), out.anchor.size()));
      CO2_ASSERT_OK(co2_engine_get_stats(engine, &out.stats));
      if (rank == 0) steps.push_back(out);
    }
    CO2_ASSERT_OK(co2_engine_destroy(engine));
    if (d) cudaFree(d);
  });
  return steps;
}

TEST(DeviceFeatures, AnUpdateWhoseResultOverflowsIsRefusedAsOnHost) {
  std::vector<co2_engine_config_t> configs;
  for (const Policy& p : {kPolicies[0], kPolicies[3], kPolicies[4]})  // no clipping: it would tame the step
    for (co2_engine_config_t c : configs_of(p)) {
      c.tau = 1;
      configs.push_back(c);
    }
  co2_engine_config_t diloco_plain = configs.back();
  diloco_plain.outer_momentum = 0.0;
  diloco_plain.nesterov = 0;
  configs.push_back(diloco_plain);
  for (const co2_engine_config_t& c : configs)
    for (int world : {1, 2}) {
      const std::string what = std::string(c.algorithm == CO2_ALGO_CO2 ? "co2" : "diloco") +
                               (c.eager == 1 ? " eager" : "") + " beta " + std::to_string(c.outer_momentum) +
                               (c.nesterov ? " nesterov" : "") + (c.penalty == CO2_PENALTY_GAP ? " gap" : "") +
                               " W=" + std::to_string(world);
      const auto device = overflow_run(true, world, c);
      const auto host = overflow_run(false, world, c);
      ASSERT_EQ(device.size(), host.size()) << what;
      const size_t refused = c.algorithm == CO2_ALGO_CO2 ? kOverflowRound + 1 : kOverflowRound;
      ASSERT_EQ(host[refused].status, CO2_ERR_NONFINITE) << what << ": the host must refuse the overflow";
      const bool bitwise = c.penalty != CO2_PENALTY_GAP;
      for (size_t step = 0; step < host.size(); ++step) {
        const std::string at = what + " step " + std::to_string(step);
        EXPECT_EQ(device[step].status, host[step].status) << at;
        EXPECT_EQ(device[step].stats.nonfinite_rounds, host[step].stats.nonfinite_rounds) << at;
        EXPECT_EQ(device[step].stats.nonfinite_local, host[step].stats.nonfinite_local) << at;
        EXPECT_EQ(device[step].stats.outer_updates, host[step].stats.outer_updates) << at;
        EXPECT_NEAR(device[step].stats.last_penalty_min, host[step].stats.last_penalty_min,
                    1e-6 * host[step].stats.last_penalty_min)
            << at;
        for (size_t i = 0; i < host[step].anchor.size(); ++i) {
          const float dv = device[step].anchor[i], hv = host[step].anchor[i];
          if (bitwise)
            ASSERT_EQ(std::memcmp(&dv, &hv, sizeof(float)), 0) << at << " element " << i << ": device " << dv
                                                                << " host " << hv;
          else
            ASSERT_NEAR(dv, hv, 2e-5f * (1.0f + std::fabs(hv))) << at << " element " << i;
        }
      }
      // The refused boundary left the anchor exactly as the boundary before it did.
      EXPECT_EQ(device[refused].status, CO2_ERR_NONFINITE) << what;
      EXPECT_EQ(device[refused].stats.nonfinite_rounds, device[refused - 1].stats.nonfinite_rounds + 1) << what;
      EXPECT_EQ(device[refused].stats.outer_updates, device[refused - 1].stats.outer_updates) << what;
      ASSERT_EQ(std::memcmp(device[refused].anchor.data(), device[refused - 1].anchor.data(),
                            device[refused].anchor.size() * sizeof(float)),
                0)
          << what << ": the refused update changed the anchor";
      for (const float v : device.back().anchor) ASSERT_TRUE(std::isfinite(v)) << what;
      EXPECT_GT(device.back().stats.outer_updates, device[refused].stats.outer_updates) << what << ": training goes on";
    }
}

// --- Sharded outer state and hierarchical co2 (runtime/backends/device/staged_sharded_backend.cpp).
// Over a point-to-point communicator the device runs the host's sharded chain over a pinned mirror
// of its parameters, so its anchors equal the host sharded engine's bit for bit, with the norms of
// the gap penalty and norm clipping too (the same code sums them in the same order). W = 2 and 3
// cut the 8195-element tensor at different places (shard boundaries inside a segment, shards
// holding parts of several segments, a BUFFER segment in the last shard).

co2_engine_config_t sharded(co2_engine_config_t c) {
  c.shard_outer_state = 1;
  return c;
}

co2_engine_config_t hierarchical(co2_engine_config_t c) {
  c.hierarchy = CO2_HIERARCHY_NODES;
  return c;
}

std::vector<co2_engine_config_t> co2_configs() {
  std::vector<co2_engine_config_t> all;
  for (const Policy& p : kPolicies)
    if (p.algorithm == CO2_ALGO_CO2)
      for (const co2_engine_config_t& c : configs_of(p)) all.push_back(c);
  return all;
}

std::string name_of(const co2_engine_config_t& c, int world) {
  for (const Policy& p : kPolicies)
    if (p.algorithm == c.algorithm && p.penalty == c.penalty && p.clip == c.clip && p.nesterov == c.nesterov)
      return name_of(p, c, world);
  return "co2 W=" + std::to_string(world);
}

void expect_same_state_size(const Result& device, const Result& host, const std::string& what) {
  EXPECT_EQ(device.stats.outer_state_bytes, host.stats.outer_state_bytes) << what << ": not the sharded state";
}

TEST(DeviceFeatures, ShardedOuterStateEqualsHostSharded) {
  for (const co2_engine_config_t& c : co2_configs())
    for (int world : {2, 3}) {
      const std::string what = name_of(c, world) + " sharded";
      const Result device = run(true, world, sharded(c), 14), host = run(false, world, sharded(c), 14);
      expect_equal(device, host, true, what);
      expect_same_state_size(device, host, what);
    }
}

// Applying the average on arrival (apply_step, delayed and eager, W = 2 and 3): the mid-round pass
// runs over the mirror as the boundary's do; hierarchical co2 too (2 nodes x 2 ranks).
TEST(DeviceFeatures, ShardedApplyOnArrivalEqualsHostSharded) {
  Nodes nodes;
  nodes.ranks_per_node = 2;
  for (co2_engine_config_t c : co2_configs()) {
    c.apply_step = 1 + int(c.tau > 2);
    for (int world : {2, 3}) {
      const std::string what = name_of(c, world) + " sharded, apply_step " + std::to_string(c.apply_step);
      const Result device = run(true, world, sharded(c), 14), host = run(false, world, sharded(c), 14);
      expect_equal(device, host, true, what);
      EXPECT_EQ(device.stats.arrival_updates, host.stats.arrival_updates) << what;
      EXPECT_GT(device.stats.arrival_updates, 0u) << what;
    }
    const std::string what = name_of(c, 4) + " hierarchical 2 x 2, apply_step " + std::to_string(c.apply_step);
    const Result device = run(true, 4, hierarchical(c), 14, {}, {}, nodes);
    const Result host = run(false, 4, hierarchical(c), 14, {}, {}, nodes);
    expect_equal(device, host, true, what);
    EXPECT_GT(device.stats.arrival_updates, 0u) << what;
  }
}

// The warm-up's blocking chain, 16-bit parameters, and a compressed wire with error feedback.
TEST(DeviceFeatures, ShardedWarmupSixteenBitAndWireFormatsEqualHostSharded) {
  for (const co2_engine_config_t& base : co2_configs()) {
    co2_engine_config_t warm = sharded(base);
    warm.warmup_sync_rounds = 2;
    expect_equal(run(true, 3, warm, 14), run(false, 3, warm, 14), true, name_of(base, 3) + " sharded, warm-up 2");
    Precision bf16;
    bf16.dtype = CO2_DTYPE_BF16;
    expect_equal(run(true, 2, sharded(base), 14, {}, bf16), run(false, 2, sharded(base), 14, {}, bf16), true,
                 name_of(base, 2) + " sharded, bf16");
    co2_engine_config_t wire = sharded(base);
    wire.wire_format = CO2_WIRE_INT8;
    wire.error_feedback = 1;
    expect_equal(run(true, 3, wire, 14), run(false, 3, wire, 14), true, name_of(base, 3) + " sharded, int8 wire");
  }
}

// Saved at a boundary with the chain in flight (every rank its own shard), resumed bit for bit.
TEST(DeviceFeatures, ShardedCheckpointsResumeBitForBit) {
  for (const co2_engine_config_t& c : co2_configs())
    for (int world : {2, 3}) {
      std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
      Checkpointing save;
      save.save_after = 9;
      save.saved = &blobs;
      const Result straight = run(true, world, sharded(c), 15, save);
      expect_equal(straight, run(false, world, sharded(c), 15), true, name_of(c, world) + " sharded, saving");
      Checkpointing resume;
      resume.restore = &blobs;
      resume.resume_at = 9;
      expect_equal(run(true, world, sharded(c), 15, resume), straight, true, name_of(c, world) + " sharded resumed");
    }
}

// consensus() of a sharded engine mid-round, on rank 0: the anchor (no collective) and the ranks'
// average, written into device memory for CUDA tensors.
std::vector<std::vector<float>> sharded_consensus(bool device) {
  std::vector<std::vector<float>> results(2);
  co2test::run_ranks(2, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = sharded(delayed_config_of(kPolicies[1]));
    c.eager = 1;
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
    const size_t n = 3 * 1000 + 7;
    std::vector<float> host(n);
    for (size_t i = 0; i < n; ++i) host[i] = 0.002f * float(i % 41) + 0.1f * float(rank);
    void* d = nullptr;
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.count = n;
    tensor.data = host.data();
    if (device) {
      ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      tensor.data = d;
      tensor.device = CO2_DEVICE_CUDA;
    }
    CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
    CO2_ASSERT_OK(co2_engine_commit(engine));
    for (int step = 0; step < 7; ++step) {  // tau 3: two boundaries, one step into the third round
      if (device) { ASSERT_EQ(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess); }
      for (size_t i = 0; i < n; ++i) host[i] -= 0.01f * std::sin(0.01f * float(i) + float(step + rank));
      if (device) { ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess); }
      CO2_ASSERT_OK(co2_engine_step(engine, nullptr, nullptr));
    }
    const co2_consensus_t kinds[] = {CO2_CONSENSUS_ANCHOR, CO2_CONSENSUS_LOCAL_AVERAGE};
    for (size_t k = 0; k < 2; ++k) {
      std::vector<float> out(n);
      float* target = out.data();
      if (device) { ASSERT_EQ(cudaMalloc(&target, n * sizeof(float)), cudaSuccess); }
      CO2_ASSERT_OK(co2_engine_consensus(engine, kinds[k], target, n));
      if (device) {
        ASSERT_EQ(cudaMemcpy(out.data(), target, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(target);
      }
      if (rank == 0) results[k] = out;
    }
    CO2_ASSERT_OK(co2_engine_destroy(engine));
    if (d) cudaFree(d);
  });
  return results;
}

TEST(DeviceFeatures, ShardedConsensusEqualsHostSharded) {
  const auto device = sharded_consensus(true), host = sharded_consensus(false);
  for (size_t k = 0; k < 2; ++k) {
    const char* what = k == 0 ? "anchor" : "local average";
    ASSERT_EQ(device[k].size(), host[k].size()) << what;
    for (size_t i = 0; i < host[k].size(); ++i)
      ASSERT_EQ(std::memcmp(&device[k][i], &host[k][i], sizeof(float)), 0)
          << what << " element " << i << ": device " << device[k][i] << " host " << host[k][i];
  }
  EXPECT_NE(device[0], device[1]) << "mid-round, the ranks' average is not the anchor";
}

// 2 nodes x 2 ranks (node_id = rank / 2), gradients averaged inside each node on the device
// (reduce_gradients stages them); the nodes' ranks carry the shards across the nodes.
TEST(DeviceFeatures, HierarchicalCo2EqualsHost) {
  Nodes nodes;
  nodes.ranks_per_node = 2;
  for (const co2_engine_config_t& c : co2_configs()) {
    const std::string what = name_of(c, 4) + " hierarchical 2 x 2";
    const Result device = run(true, 4, hierarchical(c), 14, {}, {}, nodes);
    const Result host = run(false, 4, hierarchical(c), 14, {}, {}, nodes);
    expect_equal(device, host, true, what);
    expect_same_state_size(device, host, what);
    EXPECT_NE(device.params, run(true, 4, sharded(c), 14).params) << what << ": the nodes must matter";
  }
}

TEST(DeviceFeatures, HierarchicalCheckpointsResumeBitForBit) {
  Nodes nodes;
  nodes.ranks_per_node = 2;
  for (const co2_engine_config_t& c : co2_configs()) {
    std::vector<std::vector<char>> blobs(4);
    Checkpointing save;
    save.save_after = 9;
    save.saved = &blobs;
    const Result straight = run(true, 4, hierarchical(c), 15, save, {}, nodes);
    Checkpointing resume;
    resume.restore = &blobs;
    resume.resume_at = 9;
    expect_equal(run(true, 4, hierarchical(c), 15, resume, {}, nodes), straight, true,
                 name_of(c, 4) + " hierarchical resumed");
  }
}

// Without the intra-node average a node's ranks train different models: the node check (the
// parameters hashed where they are, on the device) fails the engine loudly, as on the host.
TEST(DeviceFeatures, HierarchicalRanksOfANodeThatTrainDifferentModelsFailLoudly) {
  std::vector<co2_status_t> failed(4, CO2_OK);
  std::vector<std::string> messages(4);
  co2test::CommOptions two_per_node;
  two_per_node.ranks_per_node = 2;
  co2test::run_ranks(4, [&](int rank, co2_comm_t comm) {
    co2_engine_config_t c = hierarchical(config_of(kPolicies[0]));
    c.anchor_check_interval = 1;
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
    const size_t n = 1000;
    std::vector<float> host(n, 0.5f);
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.count = n;
    tensor.data = d;
    tensor.device = CO2_DEVICE_CUDA;
    CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
    CO2_ASSERT_OK(co2_engine_commit(engine));
    for (int step = 0; step < 12 && failed[size_t(rank)] == CO2_OK; ++step) {
      ASSERT_EQ(cudaMemcpy(host.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) host[i] -= 0.01f * float(rank + 1);  // no two ranks alike
      ASSERT_EQ(cudaMemcpy(d, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      failed[size_t(rank)] = co2_engine_step(engine, nullptr, nullptr);
      if (failed[size_t(rank)] != CO2_OK) messages[size_t(rank)] = co2_last_error_message();
    }
    co2_engine_destroy(engine);
    cudaFree(d);
  }, two_per_node);
  bool named = false;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(failed[size_t(rank)], CO2_OK) << "rank " << rank << " trained on";
    if (failed[size_t(rank)] == CO2_ERR_ANCHOR_MISMATCH) {
      named = true;
      EXPECT_NE(messages[size_t(rank)].find("averaged inside the node"), std::string::npos) << messages[size_t(rank)];
    }
  }
  EXPECT_TRUE(named) << "no rank reported the node check";
}

#ifndef CO2_FEATURES_ON_GPU
// kShapes on CUDA for the C++ engine (the tests below build engines over a C++ communicator,
// which the C ABI cannot wrap around an in-process collective transport): `host` holds the
// values, `dev` their CUDA copies, registered with an engine by register_with.
struct DeviceTensors {
  std::vector<std::vector<float>> host;
  std::vector<void*> dev;

  DeviceTensors() = default;
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;
  ~DeviceTensors() {
    for (void* d : dev) cudaFree(d);
  }

  void register_with(co2::Engine& engine, int thread) {
    for (size_t t = 0; t < std::size(kShapes); ++t) {
      host.emplace_back(kShapes[t].count);
      for (size_t i = 0; i < host[t].size(); ++i) host[t][i] = 0.01f * float(i % 97) - 0.3f + 0.05f * float(thread);
      co2::TensorDesc tensor;
      tensor.name = kShapes[t].name;
      tensor.count = kShapes[t].count;
      tensor.role = kShapes[t].role;
      ASSERT_EQ(cudaMalloc(&tensor.data, tensor.count * sizeof(float)), cudaSuccess);
      dev.push_back(tensor.data);
      tensor.storage.device = int(co2::DeviceKind::Cuda);
      engine.register_tensor(tensor);
    }
    copy(/*to_device=*/true);
  }
  void copy(bool to_device) {
    for (size_t t = 0; t < host.size(); ++t) {
      const size_t bytes = host[t].size() * sizeof(float);
      ASSERT_EQ(to_device ? cudaMemcpy(dev[t], host[t].data(), bytes, cudaMemcpyHostToDevice)
                          : cudaMemcpy(host[t].data(), dev[t], bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
  }
  // One inner step of `thread` at `step` on the CUDA tensors.
  void train(int step, int thread) {
    copy(false);
    for (size_t t = 0; t < host.size(); ++t)
      for (size_t i = 0; i < host[t].size(); ++i) host[t][i] -= 0.05f * inner_gradient(t, i, step, thread);
    copy(true);
  }
};

// Sharded outer state over a collective-kind transport (NCCL): the chain's all-gather waits for its
// reduce-scatter's shard update (the communicator posts it, and everything after it, once that
// completed), so a sharded engine runs over NCCL too; on CUDA tensors staged through host memory.
// Threads over an in-process collective transport (tests/runtime/comm/collective_group_fake.hpp;
// a GPU runs the real one only with two of them; host tensors are refused over NCCL): every rank
// ends with the same parameters, close to the host's sharded engine over point-to-point (the
// reductions sum in another order), and not what the ranks started with. Rank 0's tensors.
std::vector<std::vector<std::vector<float>>> train_over_collective_group(int world, const co2::EngineConfig& config,
                                                                         int steps) {
  co2test::CollectiveGroupFake group(world, co2test::CollectiveGroupFake::Posting::WaitsUntilRun);
  std::vector<std::vector<std::vector<float>>> finals(static_cast<size_t>(world));
  co2test::run_threads(world, [&](int rank) {
    cudaSetDevice(0);
    co2::CommOptions options;
    options.timeout = std::chrono::seconds(30);
    auto comm = std::make_shared<co2::Communicator>(group.rank(rank), options);
    DeviceTensors tensors;
    try {
      co2::Engine engine(comm, config);
      tensors.register_with(engine, rank);
      engine.commit();
      for (int step = 0; step < steps; ++step) {
        tensors.train(step, rank);
        engine.step(nullptr);
      }
      engine.finalize();
      tensors.copy(false);
      finals[size_t(rank)] = tensors.host;
    } catch (const co2::Error& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  });
  return finals;
}

co2::EngineConfig engine_config_of(const co2_engine_config_t& c) {
  co2::EngineConfig config;
  config.tau = c.tau;
  config.outer_lr = c.outer_lr;
  config.outer_momentum = c.outer_momentum;
  config.nesterov = c.nesterov != 0;
  config.penalty = co2::Penalty(c.penalty);
  config.penalty_constant = c.penalty_constant;
  config.clip = co2::Clip(c.clip);
  config.clip_threshold = c.clip_threshold;
  config.anchor_check_interval = c.anchor_check_interval;
  config.eager = co2::Eager(c.eager);
  config.shard_outer_state = c.shard_outer_state != 0;
  config.wire_format = co2::WireFormat(c.wire_format);
  config.error_feedback = c.error_feedback != 0;
  return config;
}

// Sharded, and compressed (int8 with error feedback; replicated and sharded), at W = 2 and 3.
// Uncompressed, the host engine over point-to-point is the reference (the reductions sum in
// another order). Compressed, each rank's encoding is all-gathered, so the result is not the
// ring's bits: its distance from the fp32 run must be of the ring's order (at most twice it).
TEST(DeviceFeatures, ShardedAndCompressedOverACollectiveTransportMatchHost) {
  for (const co2_engine_config_t& base : co2_configs())
    for (int variant = 0; variant < 3; ++variant)
      for (int world : {2, 3}) {
        co2_engine_config_t c = base;
        c.shard_outer_state = variant != 1;
        if (variant > 0) {
          c.wire_format = CO2_WIRE_INT8;
          c.error_feedback = 1;
        }
        const std::string what = name_of(c, world) + (c.shard_outer_state ? " sharded" : "") +
                                 (variant > 0 ? " int8" : "") + " over a collective transport";
        const auto device = train_over_collective_group(world, engine_config_of(c), 14);
        ASSERT_EQ(device.size(), size_t(world));
        for (int rank = 1; rank < world; ++rank)
          EXPECT_EQ(device[size_t(rank)], device[0]) << what << ": rank " << rank << " against rank 0";
        co2_engine_config_t fp32 = c;
        fp32.wire_format = CO2_WIRE_FP32;
        const Result reference = run(false, world, fp32, 14);
        ASSERT_EQ(device[0].size(), reference.params.size()) << what;
        auto distance = [&](const std::vector<std::vector<float>>& params) {
          double largest = 0.0;
          for (size_t t = 0; t < params.size(); ++t)
            for (size_t i = 0; i < params[t].size(); ++i)
              largest = std::max(largest, double(std::fabs(params[t][i] - reference.params[t][i])));
          return largest;
        };
        const double ours = distance(device[0]);
        if (variant == 0) {
          EXPECT_LT(ours, 1e-4) << what << ": against the host engine over point-to-point";
        } else {
          const double ring = distance(run(false, world, c, 14).params);
          EXPECT_GT(ours, 0.0) << what << ": the wire compressed nothing";
          std::printf("%s: largest distance from the fp32 run %.3e, the ring's %.3e (%.2fx)\n", what.c_str(), ours,
                      ring, ours / ring);
          EXPECT_LE(ours, 2.0 * ring) << what << ": from fp32 " << ours << ", the ring's int8 " << ring;
        }
        EXPECT_GT(std::fabs(device[0][0][5] - (0.01f * 5.0f - 0.3f)), 1e-3f) << what << ": nothing trained";
      }
}
#endif

// Elastic membership on CUDA tensors (docs/capi.md, "Elastic membership"): the device backend
// stages its outer state out for the hand-over, commits again at the new size and stages the
// agreed state in. W = 3 threads; rank 2 leaves at step 5 (co2_engine_leave); once the members
// passed step 12 a fourth thread asks to join and is admitted at a boundary; everyone trains to
// step 27 and finalizes. The same membership on host tensors gives the same result.
struct MembershipRun {
  Result result;                  // rank 0's, after finalize
  std::vector<uint64_t> changes;  // the steps at which rank 0 saw MEMBERSHIP_CHANGED
  int32_t final_size = 0;
  co2_status_t leaver_status = CO2_OK;
  uint64_t joined_at = 0;         // the joiner's step count after its commit
};

// Whether `done()` became true within a minute (the membership runs' threads wait on each other).
template <typename Done>
bool wait_until(const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return done();
}

MembershipRun run_membership(bool device, const co2_engine_config_t& config) {
  const int members = 3, leaver = 2;
  const int leave_at = 5, join_after = 12, steps = 27;
  const std::string group = co2test::unique_group_name(device ? "device" : "host");
  co2test::CommOptions options;
  options.elastic_min_ranks = 1;
  std::atomic<int> members_waiting{0};  // at step join_after + 1: every member passed that boundary
  std::atomic<bool> joiner_asking{false};
  MembershipRun out;
  co2test::run_threads(members + 1, [&](int thread) {
    cudaSetDevice(0);
    const bool joiner = thread == members;
    co2_comm_t comm = nullptr;
    if (joiner) {
      ASSERT_TRUE(wait_until([&] { return members_waiting.load() == members - 1; }));
      joiner_asking = true;
    }
    ASSERT_EQ(co2test::create_comm(group, joiner ? 0 : thread, joiner ? 1 : members, &comm, options), CO2_OK)
        << co2_last_error_message();
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &config, &engine));
    std::vector<std::vector<float>> host;
    std::vector<void*> dev;
    for (size_t t = 0; t < std::size(kShapes); ++t) {
      host.emplace_back(kShapes[t].count);
      for (size_t i = 0; i < host[t].size(); ++i) host[t][i] = 0.01f * float(i % 97) - 0.3f + 0.05f * float(thread);
      co2_tensor_t tensor = CO2_TENSOR_INIT;
      tensor.name = kShapes[t].name;
      tensor.count = kShapes[t].count;
      tensor.role = kShapes[t].role;
      tensor.data = host[t].data();
      if (device) {
        ASSERT_EQ(cudaMalloc(&tensor.data, tensor.count * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(tensor.data, host[t].data(), tensor.count * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        dev.push_back(tensor.data);
        tensor.device = CO2_DEVICE_CUDA;
      }
      CO2_ASSERT_OK(co2_engine_register_tensor(engine, &tensor));
    }
    CO2_ASSERT_OK(co2_engine_commit(engine));
    const auto copy = [&](bool to_device) {
      for (size_t t = 0; device && t < host.size(); ++t) {
        const size_t bytes = host[t].size() * sizeof(float);
        ASSERT_EQ(to_device ? cudaMemcpy(dev[t], host[t].data(), bytes, cudaMemcpyHostToDevice)
                            : cudaMemcpy(host[t].data(), dev[t], bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
      }
    };
    const auto steps_now = [&] {
      co2_engine_stats_t st = CO2_ENGINE_STATS_INIT;
      co2_engine_get_stats(engine, &st);
      return st.steps;
    };
    if (joiner) out.joined_at = steps_now();
    bool left = false;
    for (uint64_t step = steps_now(); steps_now() < uint64_t(steps);) {
      if (thread == leaver && step == uint64_t(leave_at)) CO2_ASSERT_OK(co2_engine_leave(engine));
      copy(false);
      for (size_t t = 0; t < host.size(); ++t)
        for (size_t i = 0; i < host[t].size(); ++i) host[t][i] -= 0.05f * inner_gradient(t, i, int(step), thread);
      copy(true);
      const co2_status_t s = co2_engine_step(engine, nullptr, nullptr);
      if (s == CO2_LEFT) {
        if (thread == leaver) out.leaver_status = s;
        left = true;
        break;
      }
      ASSERT_TRUE(s == CO2_OK || s == CO2_MEMBERSHIP_CHANGED) << co2_last_error_message();
      if (s == CO2_MEMBERSHIP_CHANGED && thread == 0) out.changes.push_back(steps_now());
      step = steps_now();  // the group's count (a change leaves every rank at the same one)
      if (!joiner && step == uint64_t(join_after) + 1) {
        // The members (all past the boundary before, which co2 does not wait for) wait until the
        // joiner asked, so that the next boundary counts its request.
        ++members_waiting;
        ASSERT_TRUE(wait_until([&] { return joiner_asking.load(); }));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    if (!left) {
      CO2_ASSERT_OK(co2_engine_finalize(engine));
      copy(false);
      if (thread == 0) {
        out.result.params = host;
        CO2_ASSERT_OK(co2_engine_get_stats(engine, &out.result.stats));
        CO2_ASSERT_OK(co2_comm_size(comm, &out.final_size));
      }
    }
    co2_engine_destroy(engine);
    for (void* d : dev) cudaFree(d);
    co2_comm_destroy(comm);
  });
  return out;
}

// The same membership on CUDA and on host tensors. Where the join lands depends on when the
// joiner's request reaches the door, which the test only makes likely; a pair that saw different
// memberships is run again.
std::pair<MembershipRun, MembershipRun> run_membership_on_both(const co2_engine_config_t& c) {
  MembershipRun device, host;
  for (int attempt = 0; attempt < 3 && (attempt == 0 || device.changes != host.changes); ++attempt) {
    device = run_membership(true, c);
    host = run_membership(false, c);
    if (::testing::Test::HasFailure()) break;
  }
  return {std::move(device), std::move(host)};
}

TEST(DeviceFeatures, ElasticLeaveAndJoinEqualHost) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm == CO2_ALGO_SYNC) continue;  // its loop reduces gradients
    for (const co2_engine_config_t& c : configs_of(p)) {
      const std::string what = name_of(p, c, 3) + " with a leave and a join";
      const auto [device, host] = run_membership_on_both(c);
      if (HasFailure()) return;
      ASSERT_EQ(device.changes.size(), 2u) << what << ": a leave and a join";
      EXPECT_EQ(device.changes, host.changes) << what;
      EXPECT_EQ(device.leaver_status, CO2_LEFT) << what;
      EXPECT_EQ(device.joined_at, device.changes[1]) << what;
      EXPECT_EQ(device.final_size, 3) << what;
      expect_equal(device.result, host.result, !uses_norms(c), what);
    }
  }
}

// The same with the outer state sharded (staged through pinned host memory on CUDA tensors):
// each change assembles the shards and cuts them for the new size.
TEST(DeviceFeatures, ElasticLeaveAndJoinWithShardedStateEqualHost) {
  for (const Policy& p : {kPolicies[0], kPolicies[1]})  // co2: the sharded algorithm
    for (co2_engine_config_t c : configs_of(p)) {
      c.shard_outer_state = 1;
      const std::string what = name_of(p, c, 3) + " sharded, with a leave and a join";
      const auto [device, host] = run_membership_on_both(c);
      if (HasFailure()) return;
      ASSERT_EQ(device.changes.size(), 2u) << what << ": a leave and a join";
      EXPECT_EQ(device.changes, host.changes) << what;
      EXPECT_EQ(device.final_size, 3) << what;
      expect_equal(device.result, host.result, true, what);
    }
}

#ifndef CO2_FEATURES_ON_GPU
// Elastic membership over a collective-kind transport (the NCCL seam: every change forms a new
// communicator, runtime/group/group.cpp's group_connector): run_membership's leave and join, the
// threads over in-process collective transports (tests/runtime/comm/collective_group_fake.hpp),
// CUDA tensors on the host executor. The changes land at the host run's steps, and rank 0 ends
// where the host engine over the local transport ends (the reductions sum in another order).
MembershipRun run_membership_over_collective_group(const co2::EngineConfig& config) {
  const int members = 3, leaver = 2;
  const int leave_at = 5, join_after = 12, steps = 27;
  auto generations = std::make_shared<co2test::CollectiveGenerations>();
  generations->posting = co2test::CollectiveGroupFake::Posting::WaitsUntilRun;
  co2::CommOptions options;
  options.timeout = std::chrono::seconds(30);
  options.elastic_min_ranks = 1;
  std::atomic<int> members_waiting{0};
  MembershipRun out;
  co2test::run_threads(members + 1, [&](int thread) {
    cudaSetDevice(0);
    const bool joiner = thread == members;
    std::shared_ptr<co2::Communicator> comm;
    if (joiner) {
      // Admitted at generation 2 (the leave made generation 1) as rank 2 of 3.
      ASSERT_TRUE(wait_until([&] { return generations->join_requests.load() > 0; }));
      comm = std::make_shared<co2::Communicator>(generations->rank_of(2, members, members - 1), options);
      comm->set_membership(std::make_shared<co2test::CollectiveMembershipFake>(generations, members - 1, members, 2, 1));
      comm->set_joining(true);
    } else {
      comm = std::make_shared<co2::Communicator>(generations->rank_of(0, members, thread), options);
      comm->set_membership(std::make_shared<co2test::CollectiveMembershipFake>(generations, thread, members));
    }
    DeviceTensors tensors;
    try {
      co2::Engine engine(comm, config);
      tensors.register_with(engine, thread);
      engine.commit();
      if (joiner) out.joined_at = engine.stats().steps;
      bool left = false;
      for (uint64_t step = engine.stats().steps; engine.stats().steps < uint64_t(steps);) {
        if (thread == leaver && step == uint64_t(leave_at)) engine.leave();
        tensors.train(int(step), thread);
        try {
          engine.step(nullptr);
        } catch (const co2::Error& e) {
          if (e.status() == co2::Status::Left) {
            if (thread == leaver) out.leaver_status = CO2_LEFT;
            left = true;
            break;
          }
          ASSERT_EQ(e.status(), co2::Status::MembershipChanged) << e.what();
          if (thread == 0) out.changes.push_back(engine.stats().steps);
        }
        step = engine.stats().steps;
        // The last member past this boundary makes the join request, seen by every member at
        // the next one (as the host run's members wait for their joiner's request).
        if (!joiner && step == uint64_t(join_after) + 1 && ++members_waiting == members - 1)
          generations->join_requests = 1;
        if (!joiner && step == uint64_t(join_after) + 1) {
          ASSERT_TRUE(wait_until([&] { return generations->join_requests.load() > 0; }));
        }
      }
      if (!left) {
        engine.finalize();
        tensors.copy(false);
        if (thread == 0) {
          out.result.params = tensors.host;
          const co2::EngineStats stats = engine.stats();
          out.result.stats.rounds = stats.rounds;
          out.result.stats.outer_updates = stats.outer_updates;
          out.final_size = comm->size();
        }
      }
    } catch (const co2::Error& e) {
      ADD_FAILURE() << "thread " << thread << ": " << e.what();
    }
  });
  return out;
}

TEST(DeviceFeatures, ElasticLeaveAndJoinOverACollectiveTransportMatchHost) {
  for (const Policy& p : {kPolicies[0], kPolicies[1]})
    for (co2_engine_config_t c : configs_of(p))
      for (int sharded : {0, 1}) {
        c.shard_outer_state = sharded;
        const std::string what = name_of(p, c, 3) + (sharded ? " sharded" : "") +
                                 " with a leave and a join over a collective transport";
        const MembershipRun collective = run_membership_over_collective_group(engine_config_of(c));
        if (HasFailure()) return;
        ASSERT_EQ(collective.changes.size(), 2u) << what << ": a leave and a join";
        EXPECT_EQ(collective.leaver_status, CO2_LEFT) << what;
        EXPECT_EQ(collective.joined_at, collective.changes[1]) << what;
        EXPECT_EQ(collective.final_size, 3) << what;
        // The host run's join lands where its joiner's request reached the door: run it again
        // where that was another boundary.
        MembershipRun host;
        for (int attempt = 0; attempt < 3 && (attempt == 0 || host.changes != collective.changes); ++attempt)
          host = run_membership(false, c);
        ASSERT_EQ(host.changes, collective.changes) << what;
        double largest = 0.0;
        for (size_t t = 0; t < host.result.params.size(); ++t)
          for (size_t i = 0; i < host.result.params[t].size(); ++i)
            largest = std::max(largest, double(std::fabs(collective.result.params[t][i] - host.result.params[t][i])));
        EXPECT_LT(largest, 1e-4) << what << ": against the host engine over the local transport";
        EXPECT_EQ(collective.result.stats.rounds, host.result.stats.rounds) << what;
        double moved = 0.0;
        for (size_t i = 0; i < collective.result.params[0].size(); ++i)
          moved = std::max(moved, double(std::fabs(collective.result.params[0][i] - (0.01f * float(i % 97) - 0.3f))));
        EXPECT_GT(moved, 1e-3) << what << ": nothing trained";
      }
}
#endif

#ifndef CO2_FEATURES_ON_GPU
namespace executor = co2::device::host_executor;

size_t first_at_or_after(const std::vector<std::string>& ops, const std::string& op, size_t from) {
  return size_t(std::find(ops.begin() + std::ptrdiff_t(std::min(from, ops.size())), ops.end(), op) - ops.begin());
}

// A co2 boundary on one rank (nothing staged): the coefficients, then the fused pass, then its
// fold; a boundary that applies an average (each after the first applies the one the previous
// submitted, and finalize the last) runs the update-result probe between the coefficients and
// the pass, so that an overflowing result is refused before the pass, which then reuses the
// probe's coefficients. The kernels repeat in this order and never interleave.
TEST(DeviceFeatures, Co2BoundariesIssueCoefficientsProbePassFoldInOrder) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2) continue;
    executor::clear_recorded();
    run(true, 1, delayed_config_of(p), 12);  // tau 3: 4 boundaries, then finalize applies the last average
    std::vector<std::string> kernels;
    for (const std::string& op : executor::recorded())
      if (op == "kernel lambda" || op == "kernel update_probe" || op == "kernel pass" || op == "kernel fold")
        kernels.push_back(op);
    size_t passes = 0, probes = 0;
    for (size_t i = 0; i < kernels.size(); i += 3, ++passes) {
      EXPECT_EQ(kernels[i], "kernel lambda") << p.name << " at " << i;
      if (i + 1 < kernels.size() && kernels[i + 1] == "kernel update_probe") {
        ASSERT_GT(passes, 0u) << p.name << ": the first boundary has no average to probe";
        ++i;
        ++probes;
      }
      ASSERT_LE(i + 3, kernels.size()) << p.name << " at " << i;
      EXPECT_EQ(kernels[i + 1], "kernel pass") << p.name << " at " << i;
      EXPECT_EQ(kernels[i + 2], "kernel fold") << p.name << " at " << i;
    }
    EXPECT_EQ(passes, 5u) << p.name;
    EXPECT_EQ(probes, 4u) << p.name << ": every pass that applies an average is probed first";
  }
}

// Two ranks over a point-to-point communicator take the staged path: at each co2 boundary the
// arrived average is staged in (host to device) before the pass, and the deltas the pass writes
// are staged out (device to host) after it, as the host backend applies before it submits.
TEST(DeviceFeatures, StagedCo2BoundaryStagesInThenPassesThenStagesOut) {
  executor::clear_recorded();
  run(true, 2, delayed_config_of(kPolicies[0]), 12);
  const std::vector<std::string> ops = executor::recorded();
  size_t boundaries = 0;
  for (size_t at = first_at_or_after(ops, "kernel pass", 0); at < ops.size();
       at = first_at_or_after(ops, "kernel pass", at + 1)) {
    ++boundaries;
    EXPECT_LT(first_at_or_after(ops, "copy D2H", at), ops.size()) << "no delta staged out after pass " << boundaries;
  }
  EXPECT_GE(boundaries, 8u);  // 4 boundaries x 2 ranks
  // Before the first pass that applies an average, an average was staged in.
  EXPECT_LT(first_at_or_after(ops, "copy H2D", 0), first_at_or_after(ops, "kernel pass", 0));
}

#endif  // CO2_FEATURES_ON_GPU

// Tensors that are not device memory are refused with a message, not read as device memory.
TEST(DeviceFeatures, HostMemoryDeclaredCudaIsRefused) {
  co2test::run_ranks(1, [&](int, co2_comm_t comm) {
    co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
    std::vector<float> host(64);
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    tensor.name = "w";
    tensor.count = host.size();
    tensor.data = host.data();
    tensor.device = CO2_DEVICE_CUDA;
    EXPECT_EQ(co2_engine_register_tensor(engine, &tensor), CO2_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(co2_last_error_message()).find("not"), std::string::npos) << co2_last_error_message();
    CO2_ASSERT_OK(co2_engine_destroy(engine));
  });
}

}  // namespace

#ifdef CO2_FEATURES_ON_GPU
int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (co2::device::usable_device_count(int(e), count) == 0) {
    std::printf("no usable CUDA device (cudaGetDeviceCount: %d, %s): skipped\n", int(e), cudaGetErrorString(e));
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
#endif

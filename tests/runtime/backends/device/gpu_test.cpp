// GPU tests: the device path against the host path, stream ordering, NCCL at world size 1, two
// ranks on one GPU through the staged (GPU over host communicator) path. Exits 77 (skipped)
// where no CUDA device is usable (cudaGetDeviceCount fails with 35 without a driver).
//
// Ranks are threads with `local` communicators (tests/capi/rank_threads.hpp); the staged path
// there is the same code as over UCX (only the host transport differs).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "runtime/backends/device/kernels.hpp"
#include "runtime/backends/device/selection.hpp"
#include "tests/capi/rank_threads.hpp"
#include "tests/runtime/backends/device/device_training.hpp"

namespace {

using namespace co2test::device_training;

void expect_close(const Result& device, const Result& host, const char* what) {
  ASSERT_EQ(device.params.size(), host.params.size()) << what;
  for (size_t t = 0; t < host.params.size(); ++t)
    for (size_t i = 0; i < host.params[t].size(); ++i) {
      const float h = host.params[t][i], d = device.params[t][i];
      ASSERT_NEAR(d, h, 2e-5f * (1.0f + std::fabs(h))) << what << ": tensor " << kShapes[t].name << " element " << i;
    }
  EXPECT_EQ(device.stats.rounds, host.stats.rounds) << what;
  EXPECT_EQ(device.stats.outer_updates, host.stats.outer_updates) << what;
  EXPECT_NEAR(device.stats.last_penalty_min, host.stats.last_penalty_min, 1e-5) << what;
  EXPECT_NEAR(device.stats.last_clip_scale_min, host.stats.last_clip_scale_min, 1e-5) << what;
  EXPECT_NEAR(device.stats.last_clip_fraction, host.stats.last_clip_fraction, 1e-3) << what;
}

TEST(DevicePath, EqualsHostForEveryAlgorithmAndPolicyAtOneRank) {
  for (const Policy& p : kPolicies) {
    const auto c = config_of(p);
    expect_close(run(true, 1, c, 14), run(false, 1, c, 14), p.name);
  }
}

// Two ranks on one GPU: device tensors over a point-to-point communicator take the staged path.
TEST(DevicePath, TwoRanksOnOneGpuThroughTheStagedPathEqualHost) {
  for (const Policy& p : kPolicies) {
    const auto c = config_of(p);
    expect_close(run(true, 2, c, 14), run(false, 2, c, 14), p.name);
  }
}

// A CUDA engine saved at a boundary with its co2 average in flight resumes bit for bit: the
// average, the anchor, the momentum and the gap history travel through the checkpoint (format 5).
// Only the algorithms with an anchor: localsgd and sync keep no copy of the parameters, which the
// framework checkpoints itself (this harness does not, so their resumed runs would restart).
TEST(DevicePath, CheckpointsResumeBitForBit) {
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2 && p.algorithm != CO2_ALGO_DILOCO) continue;
    for (int world : {1, 2}) {
      const auto c = config_of(p);  // tau 3
      std::vector<std::vector<char>> blobs(static_cast<size_t>(world));
      Checkpointing save;
      save.save_after = 9;
      save.saved = &blobs;
      const Result straight = run(true, world, c, 15, save);
      Checkpointing resume;
      resume.restore = &blobs;
      resume.resume_at = 9;
      const Result resumed = run(true, world, c, 15, resume);
      ASSERT_EQ(resumed.params.size(), straight.params.size());
      for (size_t t = 0; t < straight.params.size(); ++t)
        EXPECT_EQ(std::memcmp(resumed.params[t].data(), straight.params[t].data(), straight.params[t].size() * sizeof(float)), 0)
            << p.name << " W=" << world << " tensor " << kShapes[t].name;
      EXPECT_EQ(resumed.stats.outer_updates, straight.stats.outer_updates) << p.name << " W=" << world;
    }
  }
}

// A non-boundary step returns while a long kernel still runs on the caller's stream: it did not
// synchronise the host with the device.
TEST(DevicePath, NonBoundaryStepDoesNotSynchronise) {
  co2test::run_ranks(1, [&](int, co2_comm_t comm) {
    cudaSetDevice(0);
    co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
    c.tau = 4;
    co2_engine_t engine = nullptr;
    CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
    void* flat = nullptr;
    CO2_ASSERT_OK(co2_engine_alloc_flat(engine, 1 << 20, CO2_DTYPE_FP32, CO2_DEVICE_CUDA, 0, &flat));
    co2_segment_t seg = CO2_SEGMENT_INIT;
    seg.name = "all";
    seg.count = 1 << 20;
    CO2_ASSERT_OK(co2_engine_add_segment(engine, &seg));
    CO2_ASSERT_OK(co2_engine_commit(engine));
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_EQ(co2::device::kernels::spin(2000000000ull, stream), 0);  // 2 s
    int boundary = -1;
    CO2_ASSERT_OK(co2_engine_step(engine, stream, &boundary));
    EXPECT_EQ(boundary, 0);
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "step waited for the caller's stream";
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    CO2_ASSERT_OK(co2_engine_destroy(engine));
    cudaStreamDestroy(stream);
  });
}

// NCCL at world size 1 (NCCL refuses two ranks on one GPU): equal to the host path, and a co2
// boundary only enqueues work (it returns while the caller's stream is still busy).
TEST(DevicePath, NcclWorldSizeOneEqualsHostAndBoundaryOnlyEnqueues) {
  cudaSetDevice(0);
  co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
  cc.transport = CO2_TRANSPORT_NCCL;
  cc.group_name = "gpu-test-nccl";
  cc.timeout_ms = 60000;
  co2_comm_t comm = nullptr;
  const co2_status_t s = co2_comm_create(&cc, &comm);
  if (s == CO2_ERR_UNSUPPORTED) GTEST_SKIP() << "this build has no NCCL: " << co2_last_error_message();
  CO2_ASSERT_OK(s);
  for (const Policy& p : kPolicies) {
    if (p.algorithm != CO2_ALGO_CO2) continue;
    Result device;
    train_rank(comm, 0, true, config_of(p), 14, &device);
    expect_close(device, run(false, 1, config_of(p), 14), p.name);
  }
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.tau = 1;  // every step is a boundary
  co2_engine_t engine = nullptr;
  CO2_ASSERT_OK(co2_engine_create(comm, &c, &engine));
  void* flat = nullptr;
  CO2_ASSERT_OK(co2_engine_alloc_flat(engine, 1 << 20, CO2_DTYPE_FP32, CO2_DEVICE_CUDA, 0, &flat));
  co2_segment_t seg = CO2_SEGMENT_INIT;
  seg.name = "all";
  seg.count = 1 << 20;
  CO2_ASSERT_OK(co2_engine_add_segment(engine, &seg));
  CO2_ASSERT_OK(co2_engine_commit(engine));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(co2::device::kernels::spin(1000000000ull, stream), 0);  // 1 s
    int boundary = -1;
    CO2_ASSERT_OK(co2_engine_step(engine, stream, &boundary));
    EXPECT_EQ(boundary, 1);
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "boundary " << i << " waited for the device";
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  CO2_ASSERT_OK(co2_engine_finalize(engine));
  CO2_ASSERT_OK(co2_engine_destroy(engine));
  cudaStreamDestroy(stream);
  CO2_ASSERT_OK(co2_comm_destroy(comm));
}

}  // namespace

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

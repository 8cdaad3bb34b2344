// The NCCL transport. `nccl_test gpu`: a group of one on a real GPU (collectives on device and host
// buffers, abort, a missing peer is a timeout); exits 77 without a GPU. `nccl_test no-gpu`: on a
// machine without a usable GPU, joining is a clear RendezvousError (exits 77 where a GPU exists).
#include "transports/nccl/transport.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rendezvous/store.hpp"

namespace {

using namespace std::chrono_literals;
using co2::DataType;
using co2::transport::Outcome;
using co2::ReduceOp;

Outcome wait(co2::transport::Collective& c, co2::transport::Handle h) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  Outcome o;
  while ((o = c.test(h)) == Outcome::Pending && std::chrono::steady_clock::now() < deadline) {
  }
  return o;
}

TEST(NcclNoGpu, JoiningIsAClearRendezvousError) {
  EXPECT_EQ(co2::transport::nccl::usable_devices(), 0);
  auto store = co2::store::make_memory_store();
  try {
    co2::transport::nccl::connect(*store, "g", 0, 1, -1, 1000ms);
    ADD_FAILURE() << "connect succeeded without a GPU";
  } catch (const co2::transport::RendezvousError& e) {
    EXPECT_NE(std::string(e.what()).find("usable CUDA device"), std::string::npos) << e.what();
  }
}

TEST(NcclGpu, GroupOfOneRunsCollectivesOnDeviceAndHostBuffers) {
  cudaSetDevice(0);
  auto store = co2::store::make_memory_store();
  auto nccl = co2::transport::nccl::connect(*store, "one", 0, 1, 0, 30000ms);
  ASSERT_EQ(nccl->size(), 1);
  ASSERT_NE(nccl->stream(), nullptr);
  std::vector<float> host = {1, 2, 3, 4};
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 16), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(wait(*nccl, nccl->post_allreduce(device, device, 4, DataType::F32, ReduceOp::Avg)), Outcome::Done);
  std::vector<float> back(4);
  ASSERT_EQ(cudaMemcpy(back.data(), device, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  // Host memory is staged through the device.
  std::vector<float> sum = host;
  EXPECT_EQ(wait(*nccl, nccl->post_allreduce(sum.data(), sum.data(), 4, DataType::F32, ReduceOp::Sum)), Outcome::Done);
  EXPECT_EQ(sum, host);
  int64_t mine = 42, all = 0;
  EXPECT_EQ(wait(*nccl, nccl->post_allgather(&mine, &all, 1, DataType::I64)), Outcome::Done);
  EXPECT_EQ(all, 42);
  EXPECT_EQ(wait(*nccl, nccl->post_broadcast(device, 4, DataType::F32, 0)), Outcome::Done);
  // The sharded pair: a group of one owns the whole buffer, which they leave as it is.
  EXPECT_EQ(wait(*nccl, nccl->post_reduce_scatter(device, 4, DataType::F32, ReduceOp::Avg)), Outcome::Done);
  EXPECT_EQ(wait(*nccl, nccl->post_allgather_shards(device, 4, DataType::F32)), Outcome::Done);
  ASSERT_EQ(cudaMemcpy(back.data(), device, 16, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  std::vector<float> staged = host;
  EXPECT_EQ(wait(*nccl, nccl->post_reduce_scatter(staged.data(), 4, DataType::F32, ReduceOp::Sum)), Outcome::Done);
  EXPECT_EQ(wait(*nccl, nccl->post_allgather_shards(staged.data(), 4, DataType::F32)), Outcome::Done);
  EXPECT_EQ(staged, host);
  nccl->abort("test");
  EXPECT_EQ(nccl->test(nccl->post_allreduce(device, device, 4, DataType::F32, ReduceOp::Sum)), Outcome::Aborted);
  EXPECT_NE(nccl->error_message().find("test"), std::string::npos);
  cudaFree(device);
}

TEST(NcclGpu, AMissingPeerIsATimeoutNotAHang) {
  cudaSetDevice(0);
  auto store = co2::store::make_memory_store();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(co2::transport::nccl::connect(*store, "two", 0, 2, 0, 2000ms), co2::transport::RendezvousError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 60s);
}

}  // namespace

int main(int argc, char** argv) {
  const bool want_gpu = argc > 1 && std::strcmp(argv[1], "gpu") == 0;
  const bool have_gpu = co2::transport::nccl::usable_devices() > 0;
  if (want_gpu != have_gpu) {
    std::printf("%s: skipped\n", have_gpu ? "a GPU is present (the no-GPU case is not testable here)"
                                          : "no usable CUDA device");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::GTEST_FLAG(filter) = want_gpu ? "NcclGpu.*" : "NcclNoGpu.*";
  return RUN_ALL_TESTS();
}

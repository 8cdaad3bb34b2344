// runtime/group: the transport decision, and groups formed in one process from ids over both
// transports (processes over UCX are tests/capi/multiprocess).
#include "runtime/group.hpp"
#include "transports/local/transport.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "runtime/status.hpp"

namespace co2 {
namespace {

store::LaunchEnvironment launched(int world_size) {
  store::LaunchEnvironment env;
  env.present = true;
  env.world_size = world_size;
  env.source = "torchrun/co2run";
  return env;
}

TEST(ChooseTransport, ExplicitConfigWinsOverTheEnvironment) {
  EXPECT_EQ(choose_transport(TransportKind::Local, "ucx", launched(4), 4, true).kind, TransportKind::Local);
  EXPECT_EQ(choose_transport(TransportKind::Ucx, "local", {}, 4, true).kind, TransportKind::Ucx);
}

TEST(ChooseTransport, EnvironmentOverridesAuto) {
  EXPECT_EQ(choose_transport(TransportKind::Auto, "ucx", {}, 4, true).kind, TransportKind::Ucx);
  EXPECT_EQ(choose_transport(TransportKind::Auto, "local", launched(4), 4, true).kind, TransportKind::Local);
  EXPECT_EQ(choose_transport(TransportKind::Auto, "auto", launched(4), 4, true).kind, TransportKind::Ucx);
}

TEST(ChooseTransport, BadEnvironmentValueIsAnInvalidArgument) {
  try {
    choose_transport(TransportKind::Auto, "tcp", {}, 2, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CO2_TRANSPORT=tcp"), std::string::npos) << e.what();
  }
}

TEST(ChooseTransport, AutoPicksUcxOnlyForSeveralLaunchedProcesses) {
  const auto multi = choose_transport(TransportKind::Auto, "", launched(4), 4, true);
  EXPECT_EQ(multi.kind, TransportKind::Ucx);
  EXPECT_NE(multi.reason.find("4 processes"), std::string::npos) << multi.reason;
  EXPECT_EQ(choose_transport(TransportKind::Auto, "", {}, 4, true).kind, TransportKind::Local);
  EXPECT_EQ(choose_transport(TransportKind::Auto, "", launched(1), 1, true).kind, TransportKind::Local);
  EXPECT_EQ(choose_transport(TransportKind::Auto, "", launched(4), 1, true).kind, TransportKind::Local);
}

TEST(ChooseTransport, MultiProcessLaunchWithoutUcxIsUnsupported) {
  try {
    choose_transport(TransportKind::Auto, "", launched(2), 2, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::Unsupported);
  }
}

// Forms a group of `world` threads from one id and checks an all-reduce across it.
void form_from_id(TransportKind kind, int world) {
  const std::string id = make_unique_id();
  ASSERT_EQ(id.rfind("co2-id-tcp:", 0), 0u) << id;
  std::vector<std::thread> ranks;
  std::vector<double> sums(world, -1.0);
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
     try {
      GroupRequest request;
      request.transport = kind;
      request.rank = r;
      request.world_size = world;
      request.rank_is_default = false;
      request.unique_id = id;
      request.options.timeout = std::chrono::milliseconds(30000);
      auto comm = form_group(request);
      double value = r + 1;
      comm->allreduce(&value, 1, DataType::F64, ReduceOp::Sum)->wait_for(std::chrono::milliseconds(30000));
      sums[r] = value;
     } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
     }
    });
  }
  for (auto& t : ranks) t.join();
  for (double s : sums) EXPECT_EQ(s, world * (world + 1) / 2.0);
}

TEST(FormGroup, FromAnIdOverTheLocalTransport) { form_from_id(TransportKind::Local, 3); }

TEST(FormGroup, FromAnIdOverUcx) {
  if (!ucx_built()) GTEST_SKIP() << "no UCX in this build";
  form_from_id(TransportKind::Ucx, 3);
}

TEST(FormGroup, MalformedIdIsRefusedForUcx) {
  if (!ucx_built()) GTEST_SKIP() << "no UCX in this build";
  GroupRequest request;
  request.transport = TransportKind::Ucx;
  request.unique_id = "co2-id-0123456789abcdef";
  request.world_size = 2;
  request.rank_is_default = false;
  try {
    form_group(request);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument);
  }
}

TEST(FormGroup, LocalWorldSizeAboveTheBoundIsAnInvalidArgument) {
  GroupRequest request;
  request.transport = TransportKind::Local;
  request.group_name = "too-large";
  request.rank = 0;
  request.world_size = transport::local::kMaxRanks + 1;
  request.rank_is_default = false;
  request.options.timeout = std::chrono::milliseconds(100);
  try {
    form_group(request);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::InvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(transport::local::kMaxRanks)), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace co2

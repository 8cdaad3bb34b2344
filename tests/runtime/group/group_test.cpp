// runtime/group: the transport decision, groups formed in one process from ids over both
// transports (processes over UCX are tests/capi/multiprocess), and the placing of ranks on nodes.
#include "runtime/group/group.hpp"
#include "transports/local/transport.hpp"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "runtime/base/status.hpp"

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
    // The cause and the way out: install UCX and build again, or threads of one process.
    EXPECT_NE(std::string(e.what()).find("built without UCX"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("libucx-dev"), std::string::npos) << e.what();
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

store::NodeName host(const std::string& name) {
  store::NodeName node;
  node.host = name;
  node.source = "host name (test)";
  return node;
}

store::NodeName id(int64_t value) {
  store::NodeName node;
  node.id = value;
  node.source = "GROUP_RANK";
  return node;
}

// The message of the InvalidArgument place_on_nodes throws ("" if none).
std::string refusal(const std::vector<store::NodeName>& names) {
  try {
    place_on_nodes(names, 0);
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::InvalidArgument);
    return error.what();
  }
  return "";
}

// Host names are compared as text; nodes are numbered by their lowest rank.
TEST(PlaceOnNodes, HostNamesInterleaved) {
  const std::vector<store::NodeName> names = {host("b"), host("a"), host("b"), host("a"), host("b"), host("a")};
  for (int me = 0; me < 6; ++me) {
    const NodePlace place = place_on_nodes(names, me);
    EXPECT_EQ(place.node, me % 2) << me;
    EXPECT_EQ(place.local, me / 2) << me;
    EXPECT_EQ(place.nodes, 2);
    EXPECT_EQ(place.per_node, 3);
  }
}

TEST(PlaceOnNodes, RefusalsNameTheCause) {
  std::string message = refusal({id(0), id(0), id(1)});
  EXPECT_NE(message.find("node 0 (node id 0 from GROUP_RANK) has 2 ranks; node 1 (node id 1 from GROUP_RANK) has 1 rank"),
            std::string::npos)
      << message;
  message = refusal({host("a"), host("a"), host("b")});
  EXPECT_NE(message.find("node 0 (host 'a') has 2 ranks"), std::string::npos) << message;
  message = refusal({id(3), host("a")});
  EXPECT_NE(message.find("rank 0 has node id 3 from GROUP_RANK, but rank 1 only its host name"), std::string::npos)
      << message;
  store::NodeName broken;
  broken.id = kNodeUnresolved;
  broken.source = "environment variable GROUP_RANK='x' is not an integer";
  message = refusal({id(0), broken});
  EXPECT_NE(message.find("rank 1 cannot tell its node: environment variable GROUP_RANK='x'"), std::string::npos)
      << message;
  // Many nodes: the first 16 are named, then a count.
  std::vector<store::NodeName> many;
  for (int node = 0; node < 20; ++node) many.push_back(id(node));
  many.push_back(id(0));
  message = refusal(many);
  EXPECT_NE(message.find("node 15 (node id 15"), std::string::npos) << message;
  EXPECT_EQ(message.find("node 16 ("), std::string::npos) << message;
  EXPECT_NE(message.find("(20 nodes)"), std::string::npos) << message;
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

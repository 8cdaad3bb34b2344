// The TCP store beyond conformance: authentication, hostile bytes on the wire, a server that
// goes away, peers that never arrive, and real processes as ranks.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <random>
#include <thread>

#include "runtime/group/group.hpp"
#include "rendezvous/launch_environment.hpp"
#include "rendezvous/tcp_store.hpp"
#include "rendezvous/wire_protocol.hpp"
#include "tests/subprocess.hpp"

#ifndef CO2_TCP_STORE_HELPER
#error "CO2_TCP_STORE_HELPER must name the helper program"
#endif

namespace co2::store {
namespace {

using namespace std::chrono_literals;
using transport::RendezvousError;

// Generous: a call that has not returned by then hangs.
constexpr auto kHangDeadline = 60s;

TcpStoreOptions options_for(uint16_t port, const std::string& token, std::chrono::milliseconds timeout = 30s) {
  TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.auth_token = token;
  options.timeout = timeout;
  return options;
}

// The message of the RendezvousError that `call` throws ("" if it throws none).
template <class Call>
std::string rendezvous_error(Call call) {
  try {
    call();
  } catch (const RendezvousError& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string hello(const std::string& token) {
  return wire::Writer().u8(uint8_t(wire::Op::Hello)).u32(wire::kMagic).u32(wire::kVersion).str(token).frame();
}

// A raw TCP connection, for bytes no client would send.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port, const char* ipv4 = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    ::inet_pton(AF_INET, ipv4, &address.sin_addr);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  ~RawConnection() { ::close(fd_); }

  bool connected() const { return connected_; }
  // Sends a hello and reads the answer: true when the server answered Ok.
  bool hello_accepted(const std::string& token) {
    send(hello(token));
    char answer[5];
    size_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + kHangDeadline;
    while (got < sizeof(answer) && std::chrono::steady_clock::now() < deadline) {
      pollfd polled{fd_, POLLIN, 0};
      if (::poll(&polled, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd_, answer + got, sizeof(answer) - got, 0);
      if (n <= 0) return false;
      got += size_t(n);
    }
    return got == sizeof(answer) && wire::read_u32(answer) == 1 && answer[4] == char(wire::Reply::Ok);
  }
  void send(const std::string& bytes) { (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

  // Reads until the server closes the connection; false if it is still open at the deadline.
  bool closed_by_server(std::string* received = nullptr) {
    const auto deadline = std::chrono::steady_clock::now() + kHangDeadline;
    char chunk[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd polled{fd_, POLLIN, 0};
      if (::poll(&polled, 1, int(left.count())) <= 0) continue;
      const ssize_t got = ::recv(fd_, chunk, sizeof(chunk), 0);
      if (got <= 0) return true;
      if (received) received->append(chunk, size_t(got));
    }
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string length_header(uint32_t length) {
  std::string header(4, '\0');
  for (int i = 0; i < 4; ++i) header[size_t(i)] = char((length >> (8 * i)) & 0xff);
  return header;
}

// A normal client can still do everything: the server survived.
void expect_server_works(uint16_t port, const std::string& token, const std::string& tag) {
  auto store = connect_tcp_store(options_for(port, token));
  store->set("alive/" + tag, tag);
  EXPECT_EQ(store->get("alive/" + tag, 1s), tag);
  EXPECT_EQ(store->add("alive/count", 1) > 0, true);
}

TEST(TcpStoreAuth, AWrongTokenIsRefusedWithAClearError) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "right-token");
  auto refused = std::async(std::launch::async, [&] {
    return rendezvous_error([&] { connect_tcp_store(options_for(server->port(), "wrong-token", 300s)); });
  });
  ASSERT_EQ(refused.wait_for(kHangDeadline), std::future_status::ready) << "a refusal must not be retried until the timeout";
  const std::string message = refused.get();
  EXPECT_TRUE(contains(message, "refused")) << message;
  EXPECT_TRUE(contains(message, "CO2_AUTH_TOKEN does not match")) << message;

  const std::string none = rendezvous_error([&] { connect_tcp_store(options_for(server->port(), "")); });
  EXPECT_TRUE(contains(none, "presented none")) << none;
  const std::string prefix = rendezvous_error([&] { connect_tcp_store(options_for(server->port(), "right")); });
  EXPECT_TRUE(contains(prefix, "does not match")) << prefix;

  expect_server_works(server->port(), "right-token", "after-refusals");
}

TEST(TcpStoreAuth, ARefusedClientReadsNothing) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "secret");
  connect_tcp_store(options_for(server->port(), "secret"))->set("private", "value");
  RawConnection stranger(server->port());
  ASSERT_TRUE(stranger.connected());
  stranger.send(hello("guess"));
  stranger.send(wire::Writer().u8(uint8_t(wire::Op::Get)).str("private").u64(0).frame());
  std::string received;
  ASSERT_TRUE(stranger.closed_by_server(&received));
  EXPECT_TRUE(contains(received, "authentication failed")) << received;
  EXPECT_FALSE(contains(received, "value")) << "the stranger read a value";
}

TEST(TcpStoreAuth, AServerWithoutTokenAcceptsAnyClient) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "");
  expect_server_works(server->port(), "", "no-token");
  expect_server_works(server->port(), "some-token", "with-token");
}

struct HostileBytes {
  const char* name;
  bool after_hello;  // sent after a valid hello
  std::string bytes;
};

std::vector<HostileBytes> hostile_messages() {
  using wire::Op;
  using wire::Writer;
  std::vector<HostileBytes> cases;
  cases.push_back({"oversized length before hello", false, length_header(0xffffffffu) + "xxxx"});
  cases.push_back({"hello over the hello limit", false, length_header(uint32_t(wire::kMaxHelloFrameBytes + 1))});
  cases.push_back({"zero length frame", false, length_header(0)});
  cases.push_back({"wrong magic", false, Writer().u8(uint8_t(Op::Hello)).u32(0xdeadbeef).u32(wire::kVersion).str("t").frame()});
  cases.push_back({"wrong version", false, Writer().u8(uint8_t(Op::Hello)).u32(wire::kMagic).u32(99).str("t").frame()});
  cases.push_back({"request before hello", false, Writer().u8(uint8_t(Op::Set)).str("k").str("v").frame()});
  cases.push_back({"token length past the frame", false,
                   Writer().u8(uint8_t(Op::Hello)).u32(wire::kMagic).u32(wire::kVersion).u32(1000).frame()});
  cases.push_back({"oversized frame after hello", true, length_header(uint32_t(wire::kMaxFrameBytes + 1))});
  cases.push_back({"unknown op", true, Writer().u8(77).str("k").frame()});
  cases.push_back({"second hello", true, hello("t")});
  cases.push_back({"key length past the frame", true, Writer().u8(uint8_t(Op::Set)).u32(500).frame()});
  cases.push_back({"value length past the frame", true, Writer().u8(uint8_t(Op::Set)).str("k").u32(0x7fffffff).frame()});
  cases.push_back({"trailing bytes", true, Writer().u8(uint8_t(Op::Set)).str("k").str("v").u8(0).frame()});
  cases.push_back({"get without its timeout", true, Writer().u8(uint8_t(Op::Get)).str("k").frame()});
  cases.push_back({"key over the key limit", true,
                   Writer().u8(uint8_t(Op::Set)).str(std::string(wire::kMaxKeyBytes + 1, 'k')).str("v").frame()});
  cases.push_back({"wait for too many keys", true, Writer().u8(uint8_t(Op::Wait)).u32(0xffffffffu).u64(0).frame()});
  cases.push_back({"add without delta", true, Writer().u8(uint8_t(Op::Add)).str("k").frame()});
  return cases;
}

TEST(TcpStoreHostileBytes, EachMalformedMessageClosesOnlyThatConnection) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "t");
  // A well-behaved client connected throughout must keep working.
  auto bystander = connect_tcp_store(options_for(server->port(), "t"));
  for (const auto& hostile : hostile_messages()) {
    SCOPED_TRACE(hostile.name);
    RawConnection raw(server->port());
    ASSERT_TRUE(raw.connected());
    if (hostile.after_hello) raw.send(hello("t"));
    raw.send(hostile.bytes);
    std::string answer;
    EXPECT_TRUE(raw.closed_by_server(&answer)) << "the server kept a connection that sent " << hostile.name;
    bystander->set(std::string("bystander/") + hostile.name, "ok");
    EXPECT_EQ(bystander->get(std::string("bystander/") + hostile.name, 1s), "ok");
    expect_server_works(server->port(), "t", hostile.name);
  }
}

TEST(TcpStoreHostileBytes, TruncatedFramesAndSilentClientsDoNotBlockOthers) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "t");
  // Half a hello, half a request, and a connection that says nothing, all left open.
  RawConnection half_hello(server->port()), half_request(server->port()), silent(server->port());
  const std::string full_hello = hello("t");
  half_hello.send(full_hello.substr(0, full_hello.size() / 2));
  half_request.send(hello("t"));
  const std::string request = wire::Writer().u8(uint8_t(wire::Op::Set)).str("key").str(std::string(1000, 'v')).frame();
  half_request.send(request.substr(0, 500));
  expect_server_works(server->port(), "t", "while-truncated-frames-wait");
  // Connections that close mid-frame are dropped cleanly.
  {
    RawConnection closes_mid_frame(server->port());
    closes_mid_frame.send(hello("t"));
    closes_mid_frame.send(request.substr(0, 10));
  }
  expect_server_works(server->port(), "t", "after-mid-frame-close");
}

TEST(TcpStoreHostileBytes, RandomBytesNeverTakeTheServerDown) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "t");
  std::mt19937 random(12345);
  for (int attempt = 0; attempt < 200; ++attempt) {
    RawConnection raw(server->port());
    ASSERT_TRUE(raw.connected());
    if (attempt % 2 == 1) raw.send(hello("t"));
    // A plausible small length (so that the server parses the payload), then random bytes.
    const uint32_t length = 1 + random() % 64;
    std::string bytes = length_header(length);
    for (uint32_t i = 0; i < length; ++i) bytes.push_back(char(random() & 0xff));
    raw.send(bytes);
  }
  expect_server_works(server->port(), "t", "after-random-bytes");
}

TEST(TcpStoreClientLimits, OversizedKeysAndValuesAreRefusedBeforeSending) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "");
  auto store = connect_tcp_store(options_for(server->port(), ""));
  const std::string long_key = rendezvous_error([&] { store->set(std::string(wire::kMaxKeyBytes + 1, 'k'), "v"); });
  EXPECT_TRUE(contains(long_key, "over the limit")) << long_key;
  const std::string big_value = rendezvous_error([&] { store->set("k", std::string(wire::kMaxValueBytes + 1, 'v')); });
  EXPECT_TRUE(contains(big_value, "over the limit")) << big_value;
  store->set("k", std::string(wire::kMaxValueBytes, 'v'));  // exactly at the limit is fine
  EXPECT_EQ(store->get("k", 1s).size(), wire::kMaxValueBytes);
}

TEST(TcpStoreTimeouts, APeerThatNeverArrivesIsATimeoutNotAHang) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "");
  auto store = connect_tcp_store(options_for(server->port(), ""));
  auto get = std::async(std::launch::async, [&] { return rendezvous_error([&] { store->get("rank/7", 300ms); }); });
  ASSERT_EQ(get.wait_for(kHangDeadline), std::future_status::ready);
  const std::string message = get.get();
  EXPECT_TRUE(contains(message, "'rank/7' was not set within 300 ms")) << message;
  // The connection that timed out is usable again.
  store->set("rank/7", "late");
  EXPECT_EQ(store->get("rank/7", 1s), "late");
}

TEST(TcpStoreTimeouts, NoServerAtAllIsATimeoutNotAHang) {
  uint16_t port;
  {  // a port that nobody listens on once this server is gone
    auto server = TcpStoreServer::start("127.0.0.1", 0, "");
    port = server->port();
  }
  auto connect = std::async(std::launch::async, [&] {
    return rendezvous_error([&] { connect_tcp_store(options_for(port, "", 500ms)); });
  });
  ASSERT_EQ(connect.wait_for(kHangDeadline), std::future_status::ready);
  const std::string message = connect.get();
  EXPECT_TRUE(contains(message, "no co2 store answered")) << message;
  EXPECT_TRUE(contains(message, "MASTER_PORT")) << message;
}

TEST(TcpStoreTimeouts, AClientMayStartBeforeTheServer) {
  uint16_t port;
  {
    auto probe = TcpStoreServer::start("127.0.0.1", 0, "");
    port = probe->port();
  }
  auto client = std::async(std::launch::async, [&] { return connect_tcp_store(options_for(port, "late", 60s)); });
  EXPECT_EQ(client.wait_for(200ms), std::future_status::timeout);  // still retrying
  auto server = TcpStoreServer::start("127.0.0.1", port, "late");
  ASSERT_EQ(client.wait_for(kHangDeadline), std::future_status::ready);
  auto store = client.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(TcpStoreServerGone, ABlockedGetFailsPromptlyWhenTheServerStops) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, "");
  auto store = connect_tcp_store(options_for(server->port(), ""));
  auto blocked = std::async(std::launch::async, [&] { return rendezvous_error([&] { store->get("never", 600s); }); });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  server.reset();
  ASSERT_EQ(blocked.wait_for(kHangDeadline), std::future_status::ready) << "get() outlived its server";
  const std::string message = blocked.get();
  EXPECT_TRUE(contains(message, "closed the connection")) << message;
  // Later calls fail at once too.
  const std::string later = rendezvous_error([&] { store->set("k", "v"); });
  EXPECT_FALSE(later.empty());
}

TEST(TcpStoreServerGone, ABlockedGetFailsPromptlyWhenTheServerProcessIsKilled) {
  co2::testing::Subprocess server({CO2_TCP_STORE_HELPER, "serve", "tok"});
  ASSERT_TRUE(server.started());
  ASSERT_TRUE(server.wait_for_stdout("\n", 1, kHangDeadline)) << server.describe();
  const uint16_t port = uint16_t(std::stoi(server.out()));
  auto store = connect_tcp_store(options_for(port, "tok"));
  store->set("k", "v");
  auto blocked = std::async(std::launch::async, [&] { return rendezvous_error([&] { store->get("never", 600s); }); });
  EXPECT_EQ(blocked.wait_for(100ms), std::future_status::timeout);
  ::kill(server.pid(), SIGKILL);
  ASSERT_EQ(blocked.wait_for(kHangDeadline), std::future_status::ready) << "get() outlived its server";
  const std::string message = blocked.get();
  EXPECT_TRUE(contains(message, "closed the connection")) << message;
  server.finish(kHangDeadline);
}

// A taken port is its own error type: rank 0's caller knows whose port it is and says what to do
// (tests/bindings/python/test_environment_errors.py checks that message).
TEST(TcpStoreServer, ListeningOnATakenPortSaysSo) {
  auto first = TcpStoreServer::start("127.0.0.1", 0, "");
  try {
    TcpStoreServer::start("127.0.0.1", first->port(), "");
    FAIL() << "a second server listens on a taken port";
  } catch (const co2::store::PortInUseError& e) {
    EXPECT_TRUE(contains(e.what(), "in use")) << e.what();
  }
}

TEST(TcpStoreServer, BindsEveryAddressByDefault) {
  auto server = TcpStoreServer::start("", 0, "");
  expect_server_works(server->port(), "", "any-address");  // reached over 127.0.0.1
  TcpStoreOptions options = options_for(server->port(), "");
  options.host = "localhost";
  connect_tcp_store(options)->set("by-name", "1");
}

// Raises this process's descriptor limit to `wanted` (or as far as the hard limit allows) and
// returns what it is now.
size_t raise_descriptor_limit(size_t wanted) {
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  if (limit.rlim_cur < wanted) {
    limit.rlim_cur = std::min<rlim_t>(wanted, limit.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &limit);
    ::getrlimit(RLIMIT_NOFILE, &limit);
  }
  return size_t(limit.rlim_cur);
}

TEST(TcpStoreFlood, SilentConnectionsCannotLockOutARank) {
  // More silent connections than the server's connection limit (the audit's 4,200), when this
  // process may hold that many descriptors; else as many as it may (still far past the cap on
  // connections waiting for their hello).
  constexpr size_t kWanted = kMaxStoreConnections + 200;
  const size_t allowed = raise_descriptor_limit(kWanted + 256);
  const size_t flood = std::min(kWanted, allowed > 256 ? allowed - 256 : 0);
  ASSERT_GT(flood, 2 * kMaxPendingHellos) << "RLIMIT_NOFILE is too small for this test";
  auto server = TcpStoreServer::start("127.0.0.1", 0, "");
  std::vector<std::unique_ptr<RawConnection>> silent;
  for (size_t i = 0; i < flood; ++i) {
    silent.push_back(std::make_unique<RawConnection>(server->port()));
    ASSERT_TRUE(silent.back()->connected()) << "connection " << i;
  }
  const auto start = std::chrono::steady_clock::now();
  auto rank = connect_tcp_store(options_for(server->port(), "", 30s));
  rank->set("k", "v");
  EXPECT_EQ(rank->get("k", 1s), "v");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 20s) << "a rank waited behind " << flood << " silent connections";
  // The rank's later connections get in too, while the flood is still open.
  expect_server_works(server->port(), "", "during-flood");
}

TEST(TcpStoreFlood, TheOldestSilentConnectionIsPushedOutNotTheNewest) {
  TcpStoreLimits limits;
  limits.max_pending_hellos = 8;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "t", limits);
  RawConnection oldest(server->port());
  ASSERT_TRUE(oldest.connected());
  std::vector<std::unique_ptr<RawConnection>> newer;
  for (int i = 0; i < 40; ++i) newer.push_back(std::make_unique<RawConnection>(server->port()));
  EXPECT_TRUE(oldest.closed_by_server()) << "the oldest silent connection was kept";
  EXPECT_TRUE(newer.back()->hello_accepted("t")) << "the newest connection was pushed out";
}

TEST(TcpStoreFlood, AConnectionThatSaysNothingIsClosedAtItsHelloDeadline) {
  TcpStoreLimits limits;
  limits.hello_timeout = 200ms;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "", limits);
  RawConnection silent(server->port());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(silent.closed_by_server());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(TcpStoreFlood, AClientRetriesAHelloDroppedWhileTheServerIsFull) {
  TcpStoreLimits limits;
  limits.max_connections = 2;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "", limits);
  auto first = connect_tcp_store(options_for(server->port(), ""));
  auto second = connect_tcp_store(options_for(server->port(), ""));
  const std::string full = rendezvous_error([&] { connect_tcp_store(options_for(server->port(), "", 300ms)); });
  EXPECT_TRUE(contains(full, "closed the connection before answering hello")) << full;
  auto third = std::async(std::launch::async, [&] { return connect_tcp_store(options_for(server->port(), "", 30s)); });
  EXPECT_EQ(third.wait_for(300ms), std::future_status::timeout) << "the server let a third connection in";
  first.reset();  // frees a connection: the retrying client gets in
  ASSERT_EQ(third.wait_for(kHangDeadline), std::future_status::ready);
  auto store = third.get();
  store->set("k", "v");
  EXPECT_EQ(store->get("k", 1s), "v");
}

TEST(TcpStoreMemory, StoredBytesStopAtTheirLimitWithAClearError) {
  TcpStoreLimits limits;
  limits.max_stored_bytes = size_t(1) << 20;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "", limits);
  auto store = connect_tcp_store(options_for(server->port(), ""));
  const std::string value(300 << 10, 'v');
  for (int i = 0; i < 3; ++i) store->set("k" + std::to_string(i), value);
  const std::string refused = rendezvous_error([&] { store->set("k3", value); });
  EXPECT_TRUE(contains(refused, "set('k3') was refused")) << refused;
  EXPECT_TRUE(contains(refused, "kMaxStoredBytes")) << refused;
  const std::string add_refused = rendezvous_error([&] {
    for (int i = 0; i < 10000; ++i) store->add("counter/" + std::to_string(i), 1);
  });
  EXPECT_TRUE(contains(add_refused, "kMaxStoredBytes")) << add_refused;
  // Replacing a value in place needs no more room; the stored values are intact.
  store->set("k0", value);
  EXPECT_EQ(store->get("k2", 1s), value);
  EXPECT_THROW(store->get("k3", 0ms), RendezvousError);
}

TEST(TcpStoreMemory, ARequestPastTheInFlightLimitIsRefusedAndTheConnectionLives) {
  TcpStoreLimits limits;
  limits.max_buffered_bytes = size_t(1) << 20;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "", limits);
  auto store = connect_tcp_store(options_for(server->port(), ""));
  const std::string refused = rendezvous_error([&] { store->set("big", std::string(2 << 20, 'v')); });
  EXPECT_TRUE(contains(refused, "kMaxBufferedBytes")) << refused;
  EXPECT_TRUE(contains(refused, "was refused")) << refused;
  store->set("small", "fits");
  EXPECT_EQ(store->get("small", 1s), "fits");
  EXPECT_THROW(store->get("big", 0ms), RendezvousError);
}

TEST(TcpStoreServer, ListensOnlyOnTheAddressItIsGiven) {
  // All of 127/8 is loopback on Linux: a store bound to 127.0.0.2 is not reachable at 127.0.0.1.
  auto server = TcpStoreServer::start("127.0.0.2", 0, "");
  RawConnection elsewhere(server->port(), "127.0.0.1");
  EXPECT_FALSE(elsewhere.connected()) << "the store listens beyond 127.0.0.2";
  RawConnection there(server->port(), "127.0.0.2");
  EXPECT_TRUE(there.connected());
  TcpStoreOptions options = options_for(server->port(), "");
  options.host = "127.0.0.2";
  connect_tcp_store(options)->set("bound", "1");
}

TEST(TcpStoreServer, ANameListensOnEachOfItsAddresses) {
  auto server = TcpStoreServer::start("localhost", 0, "");
  expect_server_works(server->port(), "", "by-name");  // 127.0.0.1, whatever localhost tried first
}

// The launch environment a rank of `world` ranks on this host would read.
std::map<std::string, std::optional<std::string>> rank_environment(int rank, int world, uint16_t port) {
  return {{"RANK", std::to_string(rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", std::to_string(port)},
          {"CO2_MASTER_PORT", std::nullopt},
          {"CO2_STORE_BIND", std::nullopt},
          {"CO2_AUTH_TOKEN", "group-token"},
          {"CO2_TEST_SERVE", "1"},
          {"UCX_TLS", "tcp"},
          {"UCX_NET_DEVICES", "lo"},
          {"CO2_LOG_LEVEL", "warn"}};
}

// A port for a rank 0 that serves the store itself, below the ephemeral range so that no
// outgoing connection holds it; a test retries with another when it is taken all the same.
uint16_t random_port() {
  static std::mt19937 random(std::random_device{}());
  return uint16_t(20000 + random() % 10000);
}
constexpr int kPortAttempts = 5;

bool port_was_taken(const co2::testing::Subprocess& rank0) { return contains(rank0.err(), "in use"); }

TEST(TcpStoreProcesses, RankZeroListensOnMasterAddrOrWhereCo2StoreBindSays) {
  for (const char* bind : {"", "127.0.0.2", "*"}) {
    SCOPED_TRACE(std::string("CO2_STORE_BIND=") + bind);
    for (int attempt = 1;; ++attempt) {
      const uint16_t port = random_port();
      auto environment = rank_environment(0, 2, port);
      if (*bind) environment["CO2_STORE_BIND"] = bind;
      // Rank 0 serves, then waits for rank 1 (which this test never starts).
      co2::testing::Subprocess rank0({CO2_TCP_STORE_HELPER, "rank"}, environment);
      ASSERT_TRUE(rank0.started());
      if (!rank0.wait_for_stdout("serving", 1, kHangDeadline)) {
        rank0.finish(kHangDeadline);
        if (port_was_taken(rank0) && attempt < kPortAttempts) continue;
        FAIL() << rank0.describe();
      }
      const std::string expected = std::string(bind) == "127.0.0.2" ? "127.0.0.2" : "127.0.0.1";
      const std::string other = expected == "127.0.0.1" ? "127.0.0.2" : "127.0.0.1";
      RawConnection there(port, expected.c_str());
      EXPECT_TRUE(there.connected()) << "rank 0's store is not at " << expected;
      RawConnection elsewhere(port, other.c_str());
      EXPECT_EQ(elsewhere.connected(), std::string(bind) == "*") << "rank 0's store at " << other;
      ::kill(rank0.pid(), SIGKILL);
      rank0.finish(kHangDeadline);
      break;
    }
  }
}

TEST(TcpStoreProcesses, TwoProcessesWithTheSameRankAreToldSo) {
  if (!co2::ucx_built()) GTEST_SKIP() << "no UCX in this build: form_group cannot connect processes";
  for (int attempt = 1;; ++attempt) {
    const uint16_t port = random_port();
    // Rank 2 starts only once the duplicate has failed: until then the group cannot form, so the
    // store is up whichever rank 1 comes second.
    co2::testing::Subprocess rank0({CO2_TCP_STORE_HELPER, "group"}, rank_environment(0, 3, port));
    co2::testing::Subprocess first({CO2_TCP_STORE_HELPER, "group"}, rank_environment(1, 3, port));
    co2::testing::Subprocess second({CO2_TCP_STORE_HELPER, "group"}, rank_environment(1, 3, port));
    const auto start = std::chrono::steady_clock::now();
    bool first_failed = false, second_failed = false;
    while (!first_failed && !second_failed && std::chrono::steady_clock::now() - start < kHangDeadline) {
      first_failed = first.wait_for_stdout("never printed", 1, 50ms) || contains(first.err(), "tcp_store_helper:");
      second_failed = second.wait_for_stdout("never printed", 1, 50ms) || contains(second.err(), "tcp_store_helper:");
    }
    const auto took = std::chrono::steady_clock::now() - start;
    co2::testing::Subprocess rank2({CO2_TCP_STORE_HELPER, "group"}, rank_environment(2, 3, port));
    for (auto* process : {&rank0, &first, &second, &rank2})
      ASSERT_TRUE(process->finish(kHangDeadline * 2)) << process->describe();
    if (port_was_taken(rank0) && attempt < kPortAttempts) continue;
    ASSERT_TRUE(first_failed || second_failed) << first.describe() << second.describe();
    // The second to claim rank 1 was told at once, not after the rendezvous timeout (60 s in
    // the helper); the other formed the group with ranks 0 and 2.
    const auto& loser = first_failed ? first : second;
    const auto& winner = first_failed ? second : first;
    EXPECT_TRUE(loser.exited_with(1)) << loser.describe();
    EXPECT_TRUE(contains(loser.err(), "rank 1 joined twice")) << loser.describe();
    EXPECT_LT(took, 30s);
    EXPECT_TRUE(winner.exited_with(0)) << winner.describe();
    EXPECT_TRUE(contains(winner.out(), "formed rank 1 of 3")) << winner.describe();
    EXPECT_TRUE(rank0.exited_with(0)) << rank0.describe();
    EXPECT_TRUE(rank2.exited_with(0)) << rank2.describe();
    break;
  }
}

TEST(TcpStoreProcesses, RanksInSeparateProcessesMeet) {
  constexpr int kRanks = 4;
  auto server = TcpStoreServer::start("127.0.0.1", 0, "group-token");
  std::vector<std::unique_ptr<co2::testing::Subprocess>> ranks;
  for (int rank = 0; rank < kRanks; ++rank)
    ranks.push_back(std::make_unique<co2::testing::Subprocess>(
        std::vector<std::string>{CO2_TCP_STORE_HELPER, "rank"},
        std::map<std::string, std::optional<std::string>>{{"RANK", std::to_string(rank)},
                                                          {"WORLD_SIZE", std::to_string(kRanks)},
                                                          {"LOCAL_RANK", std::to_string(rank)},
                                                          {"LOCAL_WORLD_SIZE", std::to_string(kRanks)},
                                                          {"MASTER_ADDR", "127.0.0.1"},
                                                          {"MASTER_PORT", "1"},  // CO2_MASTER_PORT wins
                                                          {"CO2_MASTER_PORT", std::to_string(server->port())},
                                                          {"CO2_AUTH_TOKEN", "group-token"},
                                                          {"CO2_TEST_SERVE", std::nullopt}}));
  for (int rank = 0; rank < kRanks; ++rank) {
    auto& process = *ranks[size_t(rank)];
    ASSERT_TRUE(process.finish(kHangDeadline)) << process.describe();
    EXPECT_TRUE(process.exited_with(0)) << process.describe();
    EXPECT_TRUE(contains(process.out(), "rank " + std::to_string(rank) + " of 4: saw 4 addresses")) << process.describe();
  }
  // The server saw all four.
  EXPECT_EQ(connect_tcp_store(options_for(server->port(), "group-token"))->add("done", 0), kRanks);
}

}  // namespace
}  // namespace co2::store

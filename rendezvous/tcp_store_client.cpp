// The TCP store client. A request takes an idle connection from a small pool (or opens one), so
// threads sharing the store do not queue behind one another's blocking get(). Every send and
// receive has a deadline; a connection the server closed, or one left mid-request, is dropped.
#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "rendezvous/socket.hpp"
#include "rendezvous/tcp_store.hpp"
#include "rendezvous/wire_protocol.hpp"

namespace co2::store {
namespace {

using net::Clock;
using net::IoResult;
using net::Socket;

// Idle connections kept for reuse; more concurrent calls than this open and close their own.
constexpr size_t kMaxIdleConnections = 8;
// Pause between attempts while the server is not up yet (doubling from the first).
constexpr std::chrono::milliseconds kFirstRetryPause{10};
constexpr std::chrono::milliseconds kLongestRetryPause{250};

struct Answer {
  wire::Reply kind = wire::Reply::Error;
  std::string payload;  // after the reply byte
};

class TcpStore final : public Store {
 public:
  explicit TcpStore(TcpStoreOptions options)
      : options_(std::move(options)), where_(net::endpoint_name(options_.host, options_.port)) {}

  // Opens the first connection, retrying while nobody listens yet.
  void connect_first() {
    give_back(open_connection(net::deadline_after(options_.timeout), options_.server_may_be_late));
  }

  void set(const std::string& key, const std::string& value) override {
    check_key(key, "set");
    if (value.size() > wire::kMaxValueBytes)
      fail("set('" + key + "'): a value of " + std::to_string(value.size()) + " bytes is over the limit of " +
           std::to_string(wire::kMaxValueBytes));
    const Answer answer =
        request(wire::Writer().u8(uint8_t(wire::Op::Set)).str(key).str(value).frame(), options_.timeout, "set('" + key + "')");
    expect_ok(answer, "set('" + key + "')");
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    check_key(key, "get");
    const std::string what = "get('" + key + "')";
    Answer answer = request(wire::Writer().u8(uint8_t(wire::Op::Get)).str(key).u64(milliseconds(timeout)).frame(),
                            with_grace(timeout), what);
    expect_ok(answer, what);
    wire::Reader in(answer.payload.data(), answer.payload.size());
    std::string value = in.str(wire::kMaxValueBytes);
    if (!in.finished()) fail(what + ": a malformed answer from the server");
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    check_key(key, "add");
    const std::string what = "add('" + key + "')";
    const Answer answer =
        request(wire::Writer().u8(uint8_t(wire::Op::Add)).str(key).i64(delta).frame(), options_.timeout, what);
    expect_ok(answer, what);
    wire::Reader in(answer.payload.data(), answer.payload.size());
    const int64_t value = in.i64();
    if (!in.finished()) fail(what + ": a malformed answer from the server");
    return value;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    if (keys.size() > wire::kMaxWaitKeys)
      fail("wait(): " + std::to_string(keys.size()) + " keys are over the limit of " + std::to_string(wire::kMaxWaitKeys));
    wire::Writer out;
    out.u8(uint8_t(wire::Op::Wait)).u32(uint32_t(keys.size()));
    size_t bytes = 0;
    for (const auto& key : keys) {
      check_key(key, "wait");
      out.str(key);
      bytes += key.size() + 4;
    }
    if (bytes + 32 > wire::kMaxFrameBytes) fail("wait(): the keys take more than a frame");
    out.u64(milliseconds(timeout));
    const Answer answer = request(out.frame(), with_grace(timeout), "wait()");
    expect_ok(answer, "wait()");
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw transport::RendezvousError("TCP store at " + where_ + ": " + message);
  }

  // timeout + kReplyGrace, saturating.
  static std::chrono::milliseconds with_grace(std::chrono::milliseconds timeout) {
    if (timeout > std::chrono::milliseconds::max() - kReplyGrace) return std::chrono::milliseconds::max();
    return timeout + kReplyGrace;
  }

  static uint64_t milliseconds(std::chrono::milliseconds timeout) { return uint64_t(std::max<int64_t>(timeout.count(), 0)); }

  void check_key(const std::string& key, const char* call) const {
    if (key.size() > wire::kMaxKeyBytes)
      fail(std::string(call) + "(): a key of " + std::to_string(key.size()) + " bytes is over the limit of " +
           std::to_string(wire::kMaxKeyBytes));
  }

  void expect_ok(const Answer& answer, const std::string& what) const {
    if (answer.kind == wire::Reply::Ok) return;
    wire::Reader in(answer.payload.data(), answer.payload.size());
    const std::string message = in.str(wire::kMaxFrameBytes);
    if (answer.kind == wire::Reply::Timeout) throw transport::RendezvousError(message);
    fail(what + ": " + message);
  }

  // A connection that has said hello, retrying until `deadline`: while nobody listens (only
  // when `server_may_be_late`, i.e. before the first connection), and whenever the server drops
  // the connection before answering the Hello (it pushes out the oldest silent connections when
  // flooded, and drops hellos past its connection limit). A refusal (a wrong token) is final.
  Socket open_connection(Clock::time_point deadline, bool server_may_be_late, const std::string& what = "connect") {
    auto pause = kFirstRetryPause;
    std::string error;
    for (int attempt = 1;; ++attempt) {
      Socket socket = net::connect_once(options_.host, options_.port, deadline, error);
      if (socket.valid()) {
        if (say_hello(socket, std::min(deadline, net::deadline_after(kHelloAnswerTimeout)), error)) return socket;
      } else if (!server_may_be_late) {
        fail(what + ": cannot reconnect (" + error + "); the store's host, rank 0, is gone?");
      }
      if (Clock::now() + pause >= deadline) {
        const std::string tried = " within " + std::to_string(options_.timeout.count()) + " ms (" +
                                  std::to_string(attempt) + " attempts; last error: " + error + ")";
        // A connection that was accepted but never answered the Hello: a program other than a
        // co2 store listens there.
        if (socket.valid())
          fail("something listens at " + where_ + " but does not answer as a co2 store" + tried +
               ": another program holds the port (under torchrun, torchrun's agent holds MASTER_PORT), so give "
               "co2's store a free port with CO2_MASTER_PORT on every rank");
        fail("no co2 store answered at " + where_ + tried +
             ": start rank 0 too (every rank of WORLD_SIZE), and give every rank the same MASTER_ADDR and "
             "MASTER_PORT (or CO2_MASTER_PORT)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kLongestRetryPause);
    }
  }

  // True when the server accepted the Hello; false (with `error`) when the connection was
  // dropped or not answered in time; throws when the server refused it.
  bool say_hello(Socket& socket, Clock::time_point deadline, std::string& error) {
    const std::string hello =
        wire::Writer().u8(uint8_t(wire::Op::Hello)).u32(wire::kMagic).u32(wire::kVersion).str(options_.auth_token).frame();
    IoResult result = net::send_all(socket.fd(), hello.data(), hello.size(), deadline);
    std::string payload;
    if (result == IoResult::Ok) result = receive_frame(socket, deadline, "hello", payload);
    if (result != IoResult::Ok) {
      error = result == IoResult::Timeout ? "the server did not answer hello in time"
                                          : "the server closed the connection before answering hello";
      return false;
    }
    const wire::Reply kind = reply_kind(payload, "hello");
    if (kind == wire::Reply::Ok) return true;
    wire::Reader in(payload.data() + 1, payload.size() - 1);
    fail("refused this client: " + in.str(wire::kMaxFrameBytes));
  }

  // Receives one answer frame into `payload` (reply byte first).
  IoResult receive_frame(Socket& socket, Clock::time_point deadline, const std::string& what, std::string& payload) {
    char header[wire::kFrameHeaderBytes];
    IoResult result = net::receive_exact(socket.fd(), header, sizeof(header), deadline);
    if (result != IoResult::Ok) return result;
    const uint32_t length = wire::read_u32(header);
    if (length == 0 || length > wire::kMaxFrameBytes)
      fail(what + ": the server sent a frame of " + std::to_string(length) + " bytes (not a co2 store?)");
    payload.assign(length, '\0');
    return net::receive_exact(socket.fd(), payload.data(), length, deadline);
  }

  wire::Reply reply_kind(const std::string& payload, const std::string& what) const {
    const auto kind = wire::Reply(uint8_t(payload[0]));
    if (kind != wire::Reply::Ok && kind != wire::Reply::Error && kind != wire::Reply::Timeout)
      fail(what + ": the server sent an unknown answer (not a co2 store?)");
    return kind;
  }

  // Sends one request frame and receives its answer; throws on anything but a complete answer.
  Answer exchange(Socket& socket, const std::string& frame, Clock::time_point deadline, const std::string& what) {
    IoResult result = net::send_all(socket.fd(), frame.data(), frame.size(), deadline);
    std::string payload;
    if (result == IoResult::Ok) result = receive_frame(socket, deadline, what, payload);
    if (result == IoResult::Timeout)
      fail(what + ": the server did not answer in time (is the store's host, rank 0, still running?)");
    if (result != IoResult::Ok)
      fail(what + ": the server closed the connection (is the store's host, rank 0, still running?)");
    Answer answer;
    answer.kind = reply_kind(payload, what);
    answer.payload = payload.substr(1);
    return answer;
  }

  Answer request(const std::string& frame, std::chrono::milliseconds timeout, const std::string& what) {
    const auto deadline = net::deadline_after(timeout);
    Socket socket = take_idle();
    // The server was up when we first connected: a new connection gets no retries to connect.
    if (!socket.valid()) socket = open_connection(deadline, false, what);
    Answer answer = exchange(socket, frame, deadline, what);  // throws: the connection is dropped
    give_back(std::move(socket));
    return answer;
  }

  Socket take_idle() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.empty()) return Socket();
    Socket socket = std::move(idle_.back());
    idle_.pop_back();
    return socket;
  }

  void give_back(Socket socket) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(socket));
  }

  const TcpStoreOptions options_;
  const std::string where_;
  std::mutex mutex_;
  std::vector<Socket> idle_;
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const TcpStoreOptions& options) {
  if (options.host.empty()) throw transport::RendezvousError("TCP store: no host given (MASTER_ADDR is empty?)");
  if (options.port == 0) throw transport::RendezvousError("TCP store: no port given (MASTER_PORT is 0 or unset?)");
  if (options.auth_token.size() > wire::kMaxTokenBytes)
    throw transport::RendezvousError("TCP store: CO2_AUTH_TOKEN is longer than " + std::to_string(wire::kMaxTokenBytes) +
                                     " bytes");
  auto store = std::make_shared<TcpStore>(options);
  store->connect_first();
  return store;
}

}  // namespace co2::store

// The TCP store server: one thread, one poll() loop over the listening socket, a wake-up
// eventfd and every connection. Sockets are non-blocking; each connection has its own input and
// output buffers, so a slow or malicious client never stalls the others. A connection handles
// one request at a time: a get()/wait() whose keys are missing parks it until a set()/add()
// provides them or its deadline passes.
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <thread>
#include <vector>

#include "rendezvous/socket.hpp"
#include "rendezvous/stored_integer.hpp"
#include "rendezvous/tcp_store.hpp"
#include "rendezvous/wire_protocol.hpp"

namespace co2::store {
namespace {

using net::Clock;
using net::Socket;

// How long the server stops accepting when it has no descriptors left.
constexpr std::chrono::milliseconds kAcceptPauseWhenOutOfDescriptors{100};

// Bytes read from one connection per loop iteration, so one busy client cannot starve others.
constexpr size_t kReadBudgetPerWakeup = size_t(1) << 20;

// Connections accepted per loop iteration; well below kMaxPendingHellos (see accept_new).
constexpr size_t kAcceptBatch = 32;

[[noreturn]] void listen_failure(const std::string& where, const std::string& why) {
  throw transport::RendezvousError("TCP store server: cannot listen on " + where + ": " + why);
}

// Compares without an early exit, so the time taken does not reveal how much of a guess matched.
bool same_token(const std::string& a, const std::string& b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? uint8_t(a[i]) : 0;
    const unsigned char y = i < b.size() ? uint8_t(b[i]) : 0;
    difference |= uint8_t(x ^ y);
  }
  return difference == 0;
}

std::string timeout_message(const std::vector<std::string>& missing, uint64_t timeout_ms) {
  std::string keys;
  for (size_t i = 0; i < missing.size() && i < 5; ++i) keys += (i ? ", '" : "'") + missing[i] + "'";
  if (missing.size() > 5) keys += " and " + std::to_string(missing.size() - 5) + " more";
  return "TCP store: key" + std::string(missing.size() == 1 ? " " : "s ") + keys +
         (missing.size() == 1 ? " was" : " were") + " not set within " + std::to_string(timeout_ms) + " ms";
}

struct Connection {
  Socket socket;
  std::list<Connection>::iterator self;  // its place in the server's pending or connected list
  std::string input;   // received, not yet handled
  std::string output;  // to send
  bool authenticated = false;
  bool closing = false;  // close once `output` is sent; read nothing more
  bool dead = false;     // remove now
  Clock::time_point hello_deadline;
  // The frame being received: its length once its header is in, and whether the server has
  // room for it (admitted) or throws its bytes away and then answers with an error.
  bool have_length = false;
  bool admitted = false;
  uint32_t frame_length = 0;
  size_t discard_left = 0;
  std::string discard_message;
  // A parked get()/wait(): the keys it waits for, until when, and which reply it wants.
  bool parked = false;
  bool parked_get = false;
  std::vector<std::string> parked_keys;
  uint64_t parked_timeout_ms = 0;
  Clock::time_point parked_deadline;

  // Bytes this connection holds in buffers, as the memory limit counts them: the whole frame
  // once admitted (it will arrive), and the reply waiting to be sent.
  size_t buffered() const {
    return (admitted ? wire::kFrameHeaderBytes + frame_length : input.size()) + output.size();
  }
  // Whether a whole request waits in `input`.
  bool frame_complete() const { return have_length && input.size() >= wire::kFrameHeaderBytes + frame_length; }
};

class Server final : public TcpStoreServer {
 public:
  Server(std::vector<Socket> listeners, uint16_t port, std::string token, const TcpStoreLimits& limits)
      : listeners_(std::move(listeners)), port_(port), token_(std::move(token)), limits_(limits) {
    wake_ = Socket(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_.valid()) listen_failure("port " + std::to_string(port), std::string("eventfd: ") + std::strerror(errno));
    thread_ = std::thread([this] { serve(); });
  }

  ~Server() override {
    const uint64_t one = 1;
    ssize_t written;
    do {
      written = ::write(wake_.fd(), &one, sizeof(one));
    } while (written < 0 && errno == EINTR);
    thread_.join();
  }

  uint16_t port() const override { return port_; }

 private:
  void serve() {
    try {
      serve_until_stopped();
    } catch (const std::exception&) {
      // Out of memory outside any one request: close everything, so that clients fail at
      // once instead of waiting for their timeouts.
    }
    pending_.clear();
    connections_.clear();
    listeners_.clear();
  }

  void serve_until_stopped() {
    std::vector<pollfd> polled;
    std::vector<Connection*> polled_connections;
    const size_t first_connection = 1 + listeners_.size();
    for (;;) {
      polled.clear();
      polled_connections.clear();
      polled.push_back({wake_.fd(), POLLIN, 0});
      const auto now = Clock::now();
      for (const auto& listener : listeners_)
        polled.push_back({listener.fd(), short(now >= accept_paused_until_ ? POLLIN : 0), 0});
      Clock::time_point next_deadline = now + std::chrono::hours(24);
      if (now < accept_paused_until_) next_deadline = accept_paused_until_;
      buffered_bytes_ = 0;
      for (auto* list : {&pending_, &connections_}) {
        for (auto& connection : *list) {
          buffered_bytes_ += connection.buffered();
          short events = 0;
          if (wants_input(connection)) events |= POLLIN;
          if (!connection.output.empty()) events |= POLLOUT;
          polled.push_back({connection.socket.fd(), events, 0});
          polled_connections.push_back(&connection);
          if (!connection.authenticated) next_deadline = std::min(next_deadline, connection.hello_deadline);
          if (connection.parked) next_deadline = std::min(next_deadline, connection.parked_deadline);
        }
      }
      const int ready = ::poll(polled.data(), polled.size(), net::poll_timeout_ms(next_deadline));
      if (ready < 0 && errno != EINTR) return;  // cannot happen with valid descriptors
      if (polled[0].revents != 0) return;       // the destructor asks us to stop

      for (size_t i = first_connection; i < polled.size(); ++i) {
        Connection& connection = *polled_connections[i - first_connection];
        if (polled[i].revents == 0) continue;
        try {
          if (polled[i].revents & (POLLHUP | POLLERR)) {
            connection.dead = true;  // the client is gone: whatever it still sent needs no answer
            continue;
          }
          if (polled[i].revents & POLLIN) read_from(connection);
          if (!connection.dead && (polled[i].revents & POLLOUT)) flush(connection);
          handle_input(connection);
        } catch (const std::exception&) {
          connection.dead = true;  // e.g. out of memory for this connection's request
        }
      }
      expire(Clock::now());
      remove_dead();
      for (size_t i = 1; i < first_connection; ++i)
        if (polled[i].revents & POLLIN) accept_new(listeners_[i - 1]);
    }
  }

  bool wants_input(const Connection& connection) const {
    if (connection.closing) return false;
    if (connection.discard_left > 0) return true;
    return !connection.frame_complete();  // one request at a time
  }

  size_t frame_limit(const Connection& connection) const {
    return connection.authenticated ? wire::kMaxFrameBytes : wire::kMaxHelloFrameBytes;
  }

  void remove_dead() {
    pending_.remove_if([](const Connection& connection) { return connection.dead; });
    connections_.remove_if([](const Connection& connection) { return connection.dead; });
  }

  void accept_new(const Socket& listener) {
    // A bounded batch per wakeup: the connections accepted earlier get their Hello read before
    // a flood behind them can push them out of the pending list.
    const size_t batch = std::max<size_t>(1, std::min(kAcceptBatch, limits_.max_pending_hellos / 4));
    for (size_t accepted = 0; accepted < batch; ++accepted) {
      Socket socket(::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!socket.valid()) {
        // Out of descriptors: the pending connection keeps the listener readable, so stop
        // watching it for a moment instead of spinning.
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          accept_paused_until_ = Clock::now() + kAcceptPauseWhenOutOfDescriptors;
        return;
      }
      // The oldest stranger goes, not the newcomer: a flood cannot keep a real client out.
      while (!pending_.empty() && pending_.size() >= limits_.max_pending_hellos) pending_.pop_front();
      net::tune_connection(socket.fd());
      pending_.emplace_back();
      Connection& connection = pending_.back();
      connection.self = std::prev(pending_.end());
      connection.socket = std::move(socket);
      connection.hello_deadline = Clock::now() + limits_.hello_timeout;
    }
  }

  void read_from(Connection& connection) {
    char chunk[65536];
    size_t budget = kReadBudgetPerWakeup;
    while (budget > 0 && !connection.closing && !connection.dead) {
      size_t want;
      if (connection.discard_left > 0) {
        want = connection.discard_left;
      } else if (!connection.have_length) {
        want = wire::kFrameHeaderBytes - connection.input.size();
      } else {
        want = wire::kFrameHeaderBytes + connection.frame_length - connection.input.size();
        if (want == 0) return;  // a whole request waits to be handled
      }
      want = std::min({sizeof(chunk), budget, want});
      const ssize_t received = ::recv(connection.socket.fd(), chunk, want, 0);
      if (received > 0) {
        budget -= size_t(received);
        if (connection.discard_left > 0) {
          connection.discard_left -= size_t(received);
          if (connection.discard_left == 0)
            reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Error)).str(connection.discard_message).frame());
          continue;
        }
        connection.input.append(chunk, size_t(received));
        if (!connection.admitted) buffered_bytes_ += size_t(received);  // an admitted frame was counted whole
        if (!connection.have_length && connection.input.size() == wire::kFrameHeaderBytes) read_header(connection);
        continue;
      }
      if (received < 0 && errno == EINTR) continue;
      if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      connection.dead = true;  // closed by the client, or reset
      return;
    }
  }

  // A frame's header is in: refuse a length over the limit, and make room for the frame or
  // decide to throw it away.
  void read_header(Connection& connection) {
    const uint32_t length = wire::read_u32(connection.input.data());
    if (length == 0 || length > frame_limit(connection))
      return refuse(connection, "TCP store: protocol error: a frame of " + std::to_string(length) +
                                    " bytes (the limit is " + std::to_string(frame_limit(connection)) + ")");
    connection.have_length = true;
    connection.frame_length = length;
    const size_t frame = wire::kFrameHeaderBytes + length;
    if (connection.authenticated && buffered_bytes_ - connection.input.size() + frame > limits_.max_buffered_bytes) {
      buffered_bytes_ -= connection.input.size();
      connection.input.clear();
      connection.have_length = false;
      connection.discard_left = length;
      connection.discard_message = "TCP store: a request of " + std::to_string(frame) +
                                   " bytes was refused: the server holds " + std::to_string(buffered_bytes_) +
                                   " bytes of requests and replies in flight, and its limit is " +
                                   std::to_string(limits_.max_buffered_bytes) + " (kMaxBufferedBytes)";
      return;
    }
    buffered_bytes_ += frame - connection.input.size();
    connection.admitted = true;
  }

  void flush(Connection& connection) {
    while (!connection.output.empty()) {
      const ssize_t sent = ::send(connection.socket.fd(), connection.output.data(), connection.output.size(),
                                  MSG_NOSIGNAL);
      if (sent > 0) {
        connection.output.erase(0, size_t(sent));
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      connection.dead = true;
      return;
    }
    if (connection.closing) connection.dead = true;
  }

  void reply(Connection& connection, std::string frame) {
    buffered_bytes_ += frame.size();
    connection.output += frame;
    flush(connection);
  }

  std::string error_frame(const std::string& message) {
    return wire::Writer().u8(uint8_t(wire::Reply::Error)).str(message).frame();
  }

  // Answers with an error and closes: the client broke the protocol (or was refused).
  void refuse(Connection& connection, const std::string& message) {
    connection.closing = true;
    connection.input.clear();
    connection.have_length = connection.admitted = false;
    reply(connection, error_frame(message));
  }

  // Handles the request in the input, if a whole one is there and the previous one is answered.
  void handle_input(Connection& connection) {
    if (connection.dead || connection.closing || connection.parked || !connection.output.empty() ||
        !connection.frame_complete())
      return;
    const std::string payload = connection.input.substr(wire::kFrameHeaderBytes, connection.frame_length);
    connection.input.clear();
    connection.have_length = connection.admitted = false;
    handle_request(connection, payload);
  }

  void handle_hello(Connection& connection, wire::Reader& in) {
    const uint32_t magic = in.u32();
    const uint32_t version = in.u32();
    const std::string token = in.str(wire::kMaxTokenBytes);
    if (!in.finished() || magic != wire::kMagic)
      return refuse(connection, "TCP store: protocol error: not a co2 store hello");
    if (version != wire::kVersion)
      return refuse(connection, "TCP store: protocol version " + std::to_string(version) +
                                    " is not supported (the server speaks " + std::to_string(wire::kVersion) + ")");
    if (!token_.empty() && !same_token(token, token_)) {  // no token: any client is welcome
      return refuse(connection, token.empty()
                                    ? "authentication failed: the store requires CO2_AUTH_TOKEN and this client presented none"
                                    : "authentication failed: this client's CO2_AUTH_TOKEN does not match the store's");
    }
    if (connections_.size() >= limits_.max_connections) {
      connection.dead = true;  // full for now: the client tries again within its timeout
      return;
    }
    connection.authenticated = true;
    connections_.splice(connections_.end(), pending_, connection.self);  // iterators stay valid
    reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Ok)).frame());
  }

  void handle_request(Connection& connection, const std::string& payload) {
    wire::Reader in(payload.data(), payload.size());
    const auto op = wire::Op(in.u8());
    if (!connection.authenticated) {
      if (op != wire::Op::Hello) return refuse(connection, "TCP store: protocol error: the first request must be hello");
      return handle_hello(connection, in);
    }

    switch (op) {
      case wire::Op::Set: {
        std::string key = in.str(wire::kMaxKeyBytes);
        std::string value = in.str(wire::kMaxValueBytes);
        if (!in.finished()) break;
        if (!make_room(connection, "set('" + key + "')", key, value.size())) return;
        values_[key] = std::move(value);
        reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Ok)).frame());
        return key_changed(key);
      }
      case wire::Op::Get: {
        std::string key = in.str(wire::kMaxKeyBytes);
        const uint64_t timeout_ms = in.u64();
        if (!in.finished()) break;
        return park(connection, true, {std::move(key)}, timeout_ms);
      }
      case wire::Op::Add: {
        const std::string key = in.str(wire::kMaxKeyBytes);
        const int64_t delta = in.i64();
        if (!in.finished()) break;
        return add(connection, key, delta);
      }
      case wire::Op::Wait: {
        const uint32_t count = in.u32();
        if (!in.ok() || count > wire::kMaxWaitKeys) break;
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < count && in.ok(); ++i) keys.push_back(in.str(wire::kMaxKeyBytes));
        const uint64_t timeout_ms = in.u64();
        if (!in.finished()) break;
        return park(connection, false, std::move(keys), timeout_ms);
      }
      case wire::Op::Hello:
        return refuse(connection, "TCP store: protocol error: a second hello");
    }
    refuse(connection, "TCP store: protocol error: a malformed request (op " + std::to_string(int(op)) + ", " +
                           std::to_string(payload.size()) + " bytes)");
  }

  static size_t entry_bytes(const std::string& key, size_t value_bytes) {
    return key.size() + value_bytes + kStoredEntryOverheadBytes;
  }

  // Accounts for `key` holding a value of `value_bytes` from now on; answers with an error and
  // returns false when that would pass the stored-bytes limit.
  bool make_room(Connection& connection, const std::string& what, const std::string& key, size_t value_bytes) {
    const auto it = values_.find(key);
    const size_t old_bytes = it == values_.end() ? 0 : entry_bytes(key, it->second.size());
    const size_t new_bytes = entry_bytes(key, value_bytes);
    if (stored_bytes_ - old_bytes + new_bytes > limits_.max_stored_bytes) {
      reply(connection, error_frame("TCP store: " + what + " was refused: storing " + std::to_string(new_bytes) +
                                    " bytes would pass the store's limit of " +
                                    std::to_string(limits_.max_stored_bytes) + " bytes (kMaxStoredBytes; " +
                                    std::to_string(stored_bytes_) + " are in use)"));
      return false;
    }
    stored_bytes_ = stored_bytes_ - old_bytes + new_bytes;
    return true;
  }

  void add(Connection& connection, const std::string& key, int64_t delta) {
    auto it = values_.find(key);
    int64_t result;
    try {
      result = add_to_stored_integer("TCP store", key, it == values_.end() ? nullptr : &it->second, delta);
    } catch (const transport::RendezvousError& error) {
      return reply(connection, error_frame(error.what()));
    }
    std::string text = std::to_string(result);
    if (!make_room(connection, "add('" + key + "')", key, text.size())) return;
    values_[key] = std::move(text);
    reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Ok)).i64(result).frame());
    key_changed(key);
  }

  void park(Connection& connection, bool is_get, std::vector<std::string> keys, uint64_t timeout_ms) {
    connection.parked = true;
    connection.parked_get = is_get;
    connection.parked_keys = std::move(keys);
    connection.parked_timeout_ms = timeout_ms;
    const uint64_t longest = uint64_t(std::numeric_limits<int64_t>::max() / 1000000);
    connection.parked_deadline = net::deadline_after(std::chrono::milliseconds(int64_t(std::min(timeout_ms, longest))));
    try_answer(connection);
  }

  // Answers a parked request if its keys are all there now.
  void try_answer(Connection& connection) {
    for (const auto& key : connection.parked_keys)
      if (values_.count(key) == 0) return;
    connection.parked = false;
    if (connection.parked_get) {
      const std::string& key = connection.parked_keys.front();
      const std::string& value = values_.at(key);
      connection.parked_keys.clear();
      // Each waiting reply is a copy: many connections asking for a large value must not
      // multiply it past the limit.
      if (buffered_bytes_ + value.size() > limits_.max_buffered_bytes)
        return reply(connection, error_frame("TCP store: get('" + key + "'): a reply of " +
                                             std::to_string(value.size()) + " bytes would pass the limit of " +
                                             std::to_string(limits_.max_buffered_bytes) +
                                             " bytes of replies in flight (kMaxBufferedBytes)"));
      return reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Ok)).str(value).frame());
    }
    connection.parked_keys.clear();
    reply(connection, wire::Writer().u8(uint8_t(wire::Reply::Ok)).frame());
  }

  void key_changed(const std::string& key) {
    for (auto& waiter : connections_) {
      if (!waiter.parked || waiter.dead) continue;
      if (std::find(waiter.parked_keys.begin(), waiter.parked_keys.end(), key) == waiter.parked_keys.end()) continue;
      try_answer(waiter);
    }
  }

  void expire(Clock::time_point now) {
    for (auto& connection : pending_)
      if (now >= connection.hello_deadline) connection.dead = true;
    for (auto& connection : connections_) {
      if (connection.dead) continue;
      if (connection.parked && now >= connection.parked_deadline) {
        std::vector<std::string> missing;
        for (const auto& key : connection.parked_keys)
          if (values_.count(key) == 0) missing.push_back(key);
        connection.parked = false;
        connection.parked_keys.clear();
        reply(connection, wire::Writer()
                              .u8(uint8_t(wire::Reply::Timeout))
                              .str(timeout_message(missing, connection.parked_timeout_ms))
                              .frame());
      }
      // A reply that was waiting for a parked request may have freed the next one.
      if (!connection.dead) handle_input(connection);
    }
  }

  std::vector<Socket> listeners_;
  Clock::time_point accept_paused_until_;
  const uint16_t port_;
  const std::string token_;
  const TcpStoreLimits limits_;
  Socket wake_;
  // Stable addresses (the poll set points into them); a connection moves from pending_ (in the
  // order accepted, oldest first) to connections_ when its Hello is accepted.
  std::list<Connection> pending_;
  std::list<Connection> connections_;
  std::map<std::string, std::string> values_;
  size_t stored_bytes_ = 0;    // entry_bytes() of every key in values_
  size_t buffered_bytes_ = 0;  // Connection::buffered() of every connection, recounted each round
  std::thread thread_;
};

// Binds and listens on one address; returns an invalid socket and `error` on failure.
Socket listen_on(int family, const sockaddr* address, socklen_t length, std::string& error) {
  Socket socket(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket.valid()) {
    error = std::string("socket(): ") + std::strerror(errno);
    return Socket();
  }
  const int one = 1;
  ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (family == AF_INET6) {
    const int zero = 0;  // dual stack: IPv4 clients too
    ::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (::bind(socket.fd(), address, length) != 0 || ::listen(socket.fd(), SOMAXCONN) != 0) {
    error = std::strerror(errno);
    if (errno == EADDRINUSE) error += " (another program holds this port)";
    return Socket();
  }
  return socket;
}

uint16_t port_of(const Socket& listener, const std::string& where) {
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  if (::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&bound), &length) != 0)
    listen_failure(where, std::string("getsockname(): ") + std::strerror(errno));
  return bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

void set_port(sockaddr* address, uint16_t port) {
  if (address->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(port);
  if (address->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(port);
}

}  // namespace

std::unique_ptr<TcpStoreServer> TcpStoreServer::start(const std::string& bind_host, uint16_t port,
                                                      const std::string& auth_token, const TcpStoreLimits& limits) {
  if (auth_token.size() > wire::kMaxTokenBytes)
    throw transport::RendezvousError("TCP store server: CO2_AUTH_TOKEN is longer than " +
                                     std::to_string(wire::kMaxTokenBytes) + " bytes");
  const std::string where = net::endpoint_name(bind_host.empty() ? "*" : bind_host, port);
  std::string error;
  std::vector<Socket> listeners;
  if (bind_host.empty()) {
    sockaddr_in6 any6{};
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    any6.sin6_port = htons(port);
    Socket listener = listen_on(AF_INET6, reinterpret_cast<sockaddr*>(&any6), sizeof(any6), error);
    if (!listener.valid() && error.find("Address already in use") == std::string::npos) {
      sockaddr_in any4{};  // no IPv6 on this host
      any4.sin_family = AF_INET;
      any4.sin_addr.s_addr = htonl(INADDR_ANY);
      any4.sin_port = htons(port);
      listener = listen_on(AF_INET, reinterpret_cast<sockaddr*>(&any4), sizeof(any4), error);
    }
    if (listener.valid()) listeners.push_back(std::move(listener));
  } else {
    // Every address the name resolves to ("localhost": ::1 and 127.0.0.1), all on one port, so
    // that a client reaches the store whichever of them it tries first.
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    addrinfo* addresses = nullptr;
    const int resolved = ::getaddrinfo(bind_host.c_str(), std::to_string(port).c_str(), &hints, &addresses);
    if (resolved != 0) listen_failure(where, ::gai_strerror(resolved));
    std::vector<std::string> seen;
    bool in_use = false;
    for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
      const std::string raw(reinterpret_cast<const char*>(address->ai_addr), address->ai_addrlen);
      if (std::find(seen.begin(), seen.end(), raw) != seen.end()) continue;
      seen.push_back(raw);
      if (!listeners.empty()) set_port(address->ai_addr, port_of(listeners.front(), where));
      std::string failure;
      Socket listener = listen_on(address->ai_family, address->ai_addr, address->ai_addrlen, failure);
      if (listener.valid()) {
        listeners.push_back(std::move(listener));
        continue;
      }
      in_use = in_use || failure.find("Address already in use") != std::string::npos;
      if (error.empty() || in_use) error = failure;
    }
    ::freeaddrinfo(addresses);
    // Half a store is worse than none: clients that resolve to the taken address would meet
    // whoever holds it.
    if (in_use) listeners.clear();
  }
  if (listeners.empty() && error.find("Address already in use") != std::string::npos)
    throw PortInUseError("TCP store server: cannot listen on " + where + ": " + error);
  if (listeners.empty()) listen_failure(where, error);
  const uint16_t bound_port = port_of(listeners.front(), where);
  return std::make_unique<Server>(std::move(listeners), bound_port, auth_token, limits);
}

}  // namespace co2::store

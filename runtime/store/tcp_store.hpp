// The TCP store: rank 0 serves a store at MASTER_ADDR:MASTER_PORT (or CO2_MASTER_PORT), every
// rank (rank 0 included) connects to it. The wire protocol and its limits are in
// wire_protocol.hpp and docs/launching.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/store/store.hpp"

namespace co2::store {

// How long a server waits for a new connection's Hello before closing it: strangers that
// connect and say nothing do not hold a slot for long.
constexpr std::chrono::milliseconds kHelloTimeout{10000};

// How long past its own timeout a client waits for the server's answer to get()/wait() (the
// server answers "timeout" itself; this covers the trip back).
constexpr std::chrono::milliseconds kReplyGrace{5000};

// Most connections a server holds at once; further ones are accepted and closed at once.
constexpr size_t kMaxStoreConnections = 4096;

// A store server on its own thread (one poll() loop for every connection: a client that sends
// garbage, half a frame or nothing only ever loses its own connection). A get() or wait() for a
// key that is not there yet waits on the server, which answers when the key is set or the
// request's timeout passes. The destructor stops the thread promptly and closes every
// connection, so clients blocked on it fail at once.
class TcpStoreServer {
 public:
  // Listens on bind_host:port ("" = every address, IPv6 and IPv4; port 0 = a free port). With a
  // non-empty auth_token, a client whose Hello does not carry the same token is refused.
  // Throws transport::RendezvousError when it cannot listen.
  static std::unique_ptr<TcpStoreServer> start(const std::string& bind_host, uint16_t port,
                                               const std::string& auth_token);

  virtual ~TcpStoreServer() = default;

  // The port it listens on (the chosen one when started with port 0).
  virtual uint16_t port() const = 0;
};

struct TcpStoreOptions {
  std::string host;
  uint16_t port = 0;
  std::string auth_token;
  // How long connect_tcp_store keeps retrying (the server may start after the client), and the
  // deadline of each set()/add() answer.
  std::chrono::milliseconds timeout = kDefaultStoreTimeout;
};

// Connects to a TcpStoreServer, retrying until options.timeout. Throws transport::RendezvousError
// with a message that says why: the token was refused, no server answered in time, the server
// went away. Each later call has a deadline too; if the server dies, blocked calls fail promptly.
// The store may be shared by threads (each concurrent call uses its own connection).
std::shared_ptr<Store> connect_tcp_store(const TcpStoreOptions& options);

}  // namespace co2::store

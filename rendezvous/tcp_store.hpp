// The TCP store: rank 0 serves a store at MASTER_ADDR:MASTER_PORT (or CO2_MASTER_PORT), every
// rank (rank 0 included) connects to it. The wire protocol and its limits are in
// wire_protocol.hpp and docs/launching.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "rendezvous/store.hpp"

namespace co2::store {

// How long a server waits for a new connection's Hello before closing it: strangers that
// connect and say nothing do not hold a slot for long.
constexpr std::chrono::milliseconds kHelloTimeout{10000};

// How long past its own timeout a client waits for the server's answer to get()/wait() (the
// server answers "timeout" itself; this covers the trip back).
constexpr std::chrono::milliseconds kReplyGrace{5000};

// How long a client waits for the answer to one Hello before it tries a new connection (within
// its overall timeout): a server that dropped or never read the Hello costs at most this much.
constexpr std::chrono::milliseconds kHelloAnswerTimeout{5000};

// Most connections that said hello a server holds at once; a Hello past it is dropped (the
// client tries again within its timeout).
constexpr size_t kMaxStoreConnections = 4096;

// Most connections that have not said hello yet. A new connection past it pushes out the oldest
// such one, so that a flood of silent connections cannot lock out a rank: a real client sends its
// Hello at once and is answered long before kMaxPendingHellos newer strangers push it out.
constexpr size_t kMaxPendingHellos = 256;

// Memory the server spends on all clients together. Keys and values stored: kMaxStoredBytes
// (each entry counted as key + value + kStoredEntryOverheadBytes); a set()/add() past it is
// answered with an error. Requests being received and replies being sent: kMaxBufferedBytes; a
// request that would pass it is read and thrown away, then answered with an error. Each
// connection holds at most one request and one reply (wire::kMaxFrameBytes each) and, before its
// Hello, at most wire::kMaxHelloFrameBytes.
constexpr size_t kMaxStoredBytes = size_t(128) << 20;
constexpr size_t kMaxBufferedBytes = size_t(64) << 20;
constexpr size_t kStoredEntryOverheadBytes = 64;

// The limits above; tests shrink them.
struct TcpStoreLimits {
  size_t max_connections = kMaxStoreConnections;
  size_t max_pending_hellos = kMaxPendingHellos;
  std::chrono::milliseconds hello_timeout = kHelloTimeout;
  size_t max_stored_bytes = kMaxStoredBytes;
  size_t max_buffered_bytes = kMaxBufferedBytes;
};

// What TcpStoreServer::start throws when another socket already holds the port: the caller
// knows whose port it is (MASTER_PORT, torchrun's) and says what to do.
class PortInUseError : public transport::RendezvousError {
 public:
  using transport::RendezvousError::RendezvousError;
};

// A store server on its own thread (one poll() loop for every connection: a client that sends
// garbage, half a frame or nothing only ever loses its own connection). A get() or wait() for a
// key that is not there yet waits on the server, which answers when the key is set or the
// request's timeout passes. The destructor stops the thread promptly and closes every
// connection, so clients blocked on it fail at once.
class TcpStoreServer {
 public:
  // Listens on bind_host:port ("" = every address, IPv6 and IPv4; a name = every address it
  // resolves to; port 0 = a free port). With a non-empty auth_token, a client whose Hello does
  // not carry the same token is refused. Throws transport::RendezvousError when it cannot listen,
  // PortInUseError when the port is taken.
  static std::unique_ptr<TcpStoreServer> start(const std::string& bind_host, uint16_t port,
                                               const std::string& auth_token, const TcpStoreLimits& limits = {});

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
  // Whether the server may not be listening yet, so that a refused connection is retried until
  // the timeout. false: for a server known to have been up, which is gone when it refuses.
  bool server_may_be_late = true;
};

// Connects to a TcpStoreServer, retrying until options.timeout. Throws transport::RendezvousError
// with a message that says why: the token was refused, no server answered in time, the server
// went away. Each later call has a deadline too; if the server dies, blocked calls fail promptly.
// The store may be shared by threads (each concurrent call uses its own connection).
std::shared_ptr<Store> connect_tcp_store(const TcpStoreOptions& options);

}  // namespace co2::store

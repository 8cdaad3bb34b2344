// TCP sockets for the store: connect, send and receive, each bounded by a deadline.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "rendezvous/deadline.hpp"

namespace co2::store::net {

using store::Clock;
using store::deadline_after;
using store::poll_timeout_ms;

// Owns a file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { reset(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset();

 private:
  int fd_ = -1;
};

// TCP keepalive on store connections: a peer whose host vanished without closing (power loss, a
// cut link) is noticed after about kKeepAliveIdle + kKeepAliveProbes * kKeepAliveInterval
// instead of at the end of a long timeout.
constexpr int kKeepAliveIdleSeconds = 30;
constexpr int kKeepAliveIntervalSeconds = 5;
constexpr int kKeepAliveProbes = 3;

// Turns on TCP_NODELAY and keepalive (best effort: a failure only loses the early detection).
void tune_connection(int fd);

// One attempt to connect to every address of host:port in turn, each bounded by `deadline`.
// Returns an invalid socket and fills `error` when none accepted. The socket is blocking, with
// TCP_NODELAY and close-on-exec.
Socket connect_once(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& error);

enum class IoResult { Ok, Closed, Timeout, Failed };

// Sends every byte before `deadline` (never raises SIGPIPE).
IoResult send_all(int fd, const char* data, size_t size, Clock::time_point deadline);

// Receives exactly `size` bytes before `deadline`; Closed when the peer closed first.
IoResult receive_exact(int fd, char* data, size_t size, Clock::time_point deadline);

// "host:port", with brackets around an IPv6 literal.
std::string endpoint_name(const std::string& host, uint16_t port);

}  // namespace co2::store::net

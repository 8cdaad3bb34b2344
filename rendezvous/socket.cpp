#include "rendezvous/socket.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace co2::store::net {

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

bool set_blocking(int fd, bool blocking) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  return ::fcntl(fd, F_SETFL, blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK)) == 0;
}

// Connects one address without blocking past `deadline`; returns 0 or an errno value.
int connect_address(int fd, const addrinfo& address, Clock::time_point deadline) {
  if (!set_blocking(fd, false)) return errno;
  if (::connect(fd, address.ai_addr, address.ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd waiting{fd, POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&waiting, 1, poll_timeout_ms(deadline));
    } while (ready < 0 && errno == EINTR);
    if (ready < 0) return errno;
    if (ready == 0) return ETIMEDOUT;
    int error = 0;
    socklen_t length = sizeof(error);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) return errno;
    if (error != 0) return error;
  }
  if (!set_blocking(fd, true)) return errno;
  return 0;
}

}  // namespace

void tune_connection(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &kKeepAliveIdleSeconds, sizeof(kKeepAliveIdleSeconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &kKeepAliveIntervalSeconds, sizeof(kKeepAliveIntervalSeconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &kKeepAliveProbes, sizeof(kKeepAliveProbes));
}

Socket connect_once(const std::string& host, uint16_t port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* addresses = nullptr;
  const std::string service = std::to_string(port);
  const int resolved = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &addresses);
  if (resolved != 0) {
    error = "cannot resolve '" + host + "': " + ::gai_strerror(resolved);
    return Socket();
  }
  error.clear();
  for (addrinfo* address = addresses; address != nullptr; address = address->ai_next) {
    Socket socket(::socket(address->ai_family, address->ai_socktype | SOCK_CLOEXEC, address->ai_protocol));
    if (!socket.valid()) {
      error = std::string("socket(): ") + std::strerror(errno);
      continue;
    }
    const int failure = connect_address(socket.fd(), *address, deadline);
    if (failure != 0) {
      error = std::strerror(failure);
      continue;
    }
    tune_connection(socket.fd());
    ::freeaddrinfo(addresses);
    return socket;
  }
  ::freeaddrinfo(addresses);
  if (error.empty()) error = "no address";
  return Socket();
}

namespace {

// Waits until `fd` is ready for `events` or `deadline` passes.
IoResult wait_ready(int fd, short events, Clock::time_point deadline) {
  pollfd waiting{fd, events, 0};
  for (;;) {
    const int ready = ::poll(&waiting, 1, poll_timeout_ms(deadline));
    if (ready > 0) return IoResult::Ok;
    if (ready == 0) return IoResult::Timeout;
    if (errno != EINTR) return IoResult::Failed;
  }
}

}  // namespace

IoResult send_all(int fd, const char* data, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    const ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      data += sent;
      size -= size_t(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoResult ready = wait_ready(fd, POLLOUT, deadline);
      if (ready != IoResult::Ok) return ready;
      continue;
    }
    return (errno == EPIPE || errno == ECONNRESET) ? IoResult::Closed : IoResult::Failed;
  }
  return IoResult::Ok;
}

IoResult receive_exact(int fd, char* data, size_t size, Clock::time_point deadline) {
  while (size > 0) {
    const ssize_t received = ::recv(fd, data, size, MSG_DONTWAIT);
    if (received > 0) {
      data += received;
      size -= size_t(received);
      continue;
    }
    if (received == 0) return IoResult::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoResult ready = wait_ready(fd, POLLIN, deadline);
      if (ready != IoResult::Ok) return ready;
      continue;
    }
    return errno == ECONNRESET ? IoResult::Closed : IoResult::Failed;
  }
  return IoResult::Ok;
}

std::string endpoint_name(const std::string& host, uint16_t port) {
  const bool ipv6_literal = host.find(':') != std::string::npos;
  return (ipv6_literal ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace co2::store::net

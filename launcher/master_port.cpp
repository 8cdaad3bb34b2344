#include "launcher/master_port.hpp"

#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

namespace co2::launcher {
namespace {

// Below this lie the well-known and commonly configured service ports.
constexpr int kLowestPick = 10000;
// Linux's default net.ipv4.ip_local_port_range starts here; used where /proc cannot be read.
constexpr int kDefaultEphemeralLow = 32768;
// Random candidates tried before the kernel's choice is taken instead.
constexpr int kAttempts = 64;

int ephemeral_low() {
  std::FILE* range = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (range == nullptr) return kDefaultEphemeralLow;
  int low = 0, high = 0;
  const bool read = std::fscanf(range, "%d %d", &low, &high) == 2;
  std::fclose(range);
  return read && low > 0 ? low : kDefaultEphemeralLow;
}

// Binds `port` (0: the kernel's choice) the way a listener would and returns the port bound,
// or 0; the probe socket is closed again.
int bindable(int port) {
  const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(uint16_t(port));
  socklen_t length = sizeof(address);
  int bound = 0;
  if (::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    bound = ntohs(address.sin_port);
  ::close(probe);
  return bound;
}

}  // namespace

int pick_master_port() {
  const int span = ephemeral_low() - 1 - kLowestPick;  // the pair's second port stays below too
  for (int attempt = 0; span > 0 && attempt < kAttempts; ++attempt) {
    unsigned random = 0;
    if (::getrandom(&random, sizeof(random), 0) != sizeof(random)) break;
    const int port = kLowestPick + int(random % unsigned(span));
    if (bindable(port) == port && bindable(port + 1) == port + 1) return port;
  }
  return bindable(0);
}

}  // namespace co2::launcher

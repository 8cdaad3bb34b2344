#include "runtime/group/addresses.hpp"

#include <ifaddrs.h>
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstdlib>
#include <random>

namespace co2 {

std::string random_hex(size_t bytes) {
  std::random_device entropy;
  std::string out;
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned value = entropy() & 0xff;
    out += digits[value >> 4];
    out += digits[value & 15];
  }
  return out;
}

std::string advertised_host() {
  if (const char* host = std::getenv("CO2_MASTER_ADDR"); host && *host) return host;
  std::string found = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (!(entry->ifa_flags & IFF_UP) || (entry->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN];
    const auto* address = reinterpret_cast<const sockaddr_in*>(entry->ifa_addr);
    if (inet_ntop(AF_INET, &address->sin_addr, text, sizeof text)) {
      found = text;
      break;
    }
  }
  freeifaddrs(list);
  return found;
}

}  // namespace co2

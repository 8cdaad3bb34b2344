// What a transport needs to find its peers: a key-value space shared by the group (addresses are
// opaque bytes). The runtime's stores (rendezvous/) implement it; a transport sees only this.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace co2::transport {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;

  // Publishes `value` under `key` (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;

  // Blocks until `key` exists and returns its value. Throws RendezvousError (transport.hpp)
  // when `timeout` passes first, or when the store itself fails.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;

  // Atomically adds `delta` to the integer stored under `key` (absent = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
};

}  // namespace co2::transport

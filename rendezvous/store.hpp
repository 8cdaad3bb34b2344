// Rendezvous stores: a key-value space shared by the ranks of a group while it forms (worker
// addresses, layout checks, barriers). Every blocking call has a timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "transports/rendezvous.hpp"
#include "transports/transport.hpp"

namespace co2::store {

// Default wait of a store call when the caller gives none.
constexpr std::chrono::milliseconds kDefaultStoreTimeout{300000};

class Store : public transport::Rendezvous {
 public:
  // Blocks until every key in `keys` exists; throws transport::RendezvousError on timeout.
  // By default one get() after another under one deadline; the TCP store waits server-side.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
};

// A store in this process's memory: shared by threads (tests, the in-process ranks).
std::shared_ptr<Store> make_memory_store();

// A store in `directory` (created if missing), shared by every process that can see it: a
// shared filesystem across hosts, or a local directory for processes on one host.
std::shared_ptr<Store> open_file_store(const std::string& directory);

}  // namespace co2::store

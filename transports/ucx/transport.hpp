// The `ucx` transport: point-to-point messages over UCX's UCP tag API, for ranks in separate
// processes on one host (shared memory, TCP loopback) or across hosts (TCP, RDMA). One UCP
// context and worker per transport; an endpoint to every rank (itself included), created with
// peer error handling so that a lost peer becomes Outcome::PeerLost instead of a dead process.
// UCX reads its own UCX_* environment variables (UCX_TLS, UCX_NET_DEVICES, ...) as usual.
// Tag layout, progress model and fault handling: docs/transports.md.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transports/rendezvous.hpp"
#include "transports/transport.hpp"

namespace co2::transport::ucx {

// Largest group: the source rank travels in 14 bits of the UCP tag.
constexpr int kMaxRanks = 1 << 14;

// Bulk connections (endpoints, over TCP sockets) per peer: messages are striped over them by
// tag, so that a path that caps each connection still carries the link's rate. The control
// lane is one more.
constexpr int kMaxConnections = 16;
constexpr int kDefaultConnections = 1;

// Creates this rank's UCP context and worker, publishes the worker's address under
// key_prefix + rank, fetches every peer's, creates the endpoints and exchanges a wire-up message
// with every peer (itself included). Returns once every rank answered; throws RendezvousError
// when `timeout` passes first (naming the ranks that never answered), when the arguments are
// out of range, when ranks ask for different numbers of connections, or when UCX cannot be
// initialised. `connections`: bulk connections per peer, 0 for kDefaultConnections; the
// environment's CO2_UCX_CONNECTIONS overrides it.
std::unique_ptr<PointToPoint> connect(Rendezvous& rendezvous, const std::string& key_prefix,
                                      int rank, int size, std::chrono::milliseconds timeout,
                                      int connections = 0);

// True when a UCP context and worker can be created in this process with the current UCX_*
// settings (the answer of the first call is kept).
bool available();

// Throws RendezvousError naming UCX's failure, the UCX_TLS / UCX_NET_DEVICES in effect and what
// to do when available() is false: for callers that fail before they meet any peer.
void check_can_start();

}  // namespace co2::transport::ucx

// The point-to-point transport interface. A transport moves tagged byte ranges between ranks and
// knows nothing of collectives or of CO2. All calls except abort() are made from one thread (the
// communicator's progress thread); abort() may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace co2::transport {

enum class Outcome {
  Pending,
  Done,
  PeerLost,      // the peer went away (destroyed, died, endpoint closed)
  SizeMismatch,  // sender and receiver disagree on the message length
  Aborted,       // abort() was called on this or a peer's transport
  Failed,        // any other transport failure (see error_message())
};

using Handle = uint64_t;

// Tags carry at most this many bits (tag < 2^kTagBits): a transport may use the bits above for
// its own matching (UCX puts the source rank and a message kind there, docs/transports.md).
constexpr unsigned kTagBits = 48;
// Tags with this bit belong to the control lane: small messages that something waits on. A
// transport must not queue them behind the other (bulk) lane's messages on a link; bulk messages
// may wait behind them (docs/architecture.md, "Lanes").
constexpr uint64_t kControlLaneTag = uint64_t(1) << (kTagBits - 1);

class PointToPoint {
 public:
  virtual ~PointToPoint() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Posts an asynchronous send/receive of `length` bytes. The buffer must stay valid until the
  // handle completes. Messages between one (sender, receiver) pair with the same tag are matched
  // in posting order. A tag wider than kTagBits bits fails the operation (Outcome::Failed).
  virtual Handle post_send(int peer, uint64_t tag, const void* data, size_t length) = 0;
  virtual Handle post_recv(int peer, uint64_t tag, void* data, size_t length) = 0;

  // Non-blocking. Once it returns anything but Pending the handle is released.
  virtual Outcome test(Handle handle) = 0;

  // Drives the transport's internal progress (no-op for transports that need none).
  virtual void progress() = 0;

  // Blocks until something may have changed or `max_wait` elapses.
  virtual void wait_for_activity(std::chrono::microseconds max_wait) = 0;

  // Fails every pending and future operation here and at the peers. Thread-safe.
  virtual void abort(const std::string& reason) = 0;
  // Ranks known not to answer at all (a stopped process, as the group's membership sees it; the
  // ranks an elastic group's survivors left out, before the old transport goes): an abort does
  // not wait for them to hear of it before it lets go of what was in flight to them. A hint;
  // thread-safe, before or after abort().
  virtual void peers_unresponsive(const std::vector<int>& /*ranks*/) {}

  // Detail of the last non-Done outcome.
  virtual std::string error_message() const = 0;

  // Whether a receive that failed may still be written into for a while, even after abort()
  // and test(): true when the transport cannot withdraw a receive that a peer already matched
  // (UCX over shared memory cannot force-close an endpoint). The collectives then receive into
  // memory of their own, copied to the caller's buffer on success and kept alive until the
  // transport released it, so a caller's buffer is never written after its request completed.
  virtual bool receives_may_land_late() const { return false; }
  // How many connections messages to one peer are striped over (by tag): the collectives keep
  // at least this many chunks in flight, so that every connection carries one.
  virtual int connections_per_peer() const { return 1; }
};

}  // namespace co2::transport

namespace co2::transport {

// Thrown when a group cannot be formed (a peer never arrived, size or rank conflict).
class RendezvousError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace co2::transport

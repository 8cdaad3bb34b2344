// The collective transport interface: a transport that brings its own collectives (NCCL) instead
// of point-to-point messages. Operations are stream-ordered: each post enqueues the collective on
// a device stream and returns a handle whose test() reports completion without blocking. Like
// PointToPoint it knows nothing of CO2 or of the runtime. All calls except abort() are made from
// one thread at a time; abort() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transports/transport.hpp"

namespace co2::transport {

enum class Element : int { F32 = 0, F64 = 3, I32 = 4, I64 = 5 };
enum class Reduction : int { Sum = 0, Avg = 1, Min = 2, Max = 3 };

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // The stream every collective of this transport runs on (a cudaStream_t). Callers order
  // their own work against it with events; all collectives share it because a communicator's
  // collectives must not run concurrently.
  virtual void* stream() const = 0;

  // The CUDA device the transport's collectives run on (-1: not bound to one).
  virtual int device() const { return -1; }

  // Buffers may be device memory (used in place, stream-ordered) or host memory (staged through
  // device memory by the transport). In-place when send == recv.
  virtual Handle post_allreduce(const void* send, void* recv, size_t count, Element element,
                                Reduction op) = 0;
  virtual Handle post_broadcast(void* buffer, size_t count, Element element, int root) = 0;
  // recv receives size() * count_per_rank elements in rank order.
  virtual Handle post_allgather(const void* send, void* recv, size_t count_per_rank,
                                Element element) = 0;

  // Non-blocking. Done once the collective's results are in place; PeerLost / Failed / Aborted
  // when the transport hit an error (it is unusable afterwards). The handle is released once it
  // returns anything but Pending.
  virtual Outcome test(Handle handle) = 0;

  // Fails every pending and future operation; the peers see their collectives fail too.
  // Thread-safe.
  virtual void abort(const std::string& reason) = 0;

  virtual std::string error_message() const = 0;
};

}  // namespace co2::transport

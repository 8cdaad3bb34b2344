// The collective transport interface: a transport that brings its own collectives (NCCL) instead
// of point-to-point messages. Operations are stream-ordered: each post enqueues the collective on
// a device stream and returns a handle whose test() reports completion without blocking. Like
// PointToPoint it knows nothing of CO2 or of the runtime. All calls except abort() are made from
// one thread at a time; abort() may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/base/types.hpp"  // DataType, ReduceOp
#include "transports/transport.hpp"

namespace co2::transport {

// The shard layout of the sharded collectives (here and in runtime/collectives/collectives.hpp): `count`
// elements over `size` ranks in shards of S = ceil(count / size); rank r owns the contiguous
// range [min(r S, count), min((r + 1) S, count)). Every shard but the trailing ones has exactly
// S elements (the last non-empty one may be shorter, those after it are empty), so a buffer
// padded to size * S is what an equal-size reduce-scatter (NCCL, ZeRO) expects, and a rank can
// keep its shard in S elements whatever its place.
struct ShardRange {
  size_t begin = 0;
  size_t end = 0;
  size_t count() const { return end - begin; }
};
inline size_t shard_size(size_t count, int size) {
  return size <= 0 ? 0 : count / size_t(size) + (count % size_t(size) != 0);
}
inline ShardRange shard_range(size_t count, int size, int rank) {
  const size_t s = shard_size(count, size);
  const size_t begin = rank <= 0 ? 0 : size_t(rank) * s;
  return {begin < count ? begin : count, begin + s < count ? begin + s : count};
}

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
  virtual Handle post_allreduce(const void* send, void* recv, size_t count, DataType element,
                                ReduceOp op) = 0;
  virtual Handle post_broadcast(void* buffer, size_t count, DataType element, int root) = 0;
  // recv receives size() * count_per_rank elements in rank order.
  virtual Handle post_allgather(const void* send, void* recv, size_t count_per_rank,
                                DataType element) = 0;

  // In place on `count` elements of `buffer`: afterwards this rank's shard_range of it holds the
  // reduction over every rank; the rest of the buffer is unspecified.
  virtual Handle post_reduce_scatter(void* buffer, size_t count, DataType element,
                                     ReduceOp op) = 0;
  // In place: every rank's shard_range of `buffer` is sent to every other rank, bit for bit.
  virtual Handle post_allgather_shards(void* buffer, size_t count, DataType element) = 0;

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

// The communicator: asynchronous collectives over a point-to-point transport, driven by one
// progress thread per communicator. Collectives are matched across ranks by issue order (a
// sequence number); each carries a descriptor -- its identity (owner, purpose, per-purpose
// sequence) and its shape (kind, op, dtype, count, root) -- that the peers compare, so ranks
// that issue different collectives get CollectiveMismatch instead of a hang or a silent pairing
// (docs/capi.md, "Collective identity").
// Several collectives may be in flight at once; the progress thread advances all of them, and
// control collectives move their data on a lane of their own (docs/architecture.md, "Lanes"),
// so a small collective is not stuck behind a round-long all-reduce.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/status.hpp"
#include "runtime/base/types.hpp"
#include "runtime/outer/wire_format.hpp"
#include "transports/collective.hpp"
#include "transports/transport.hpp"

namespace co2 {

using Clock = std::chrono::steady_clock;

// The shard layout of reduce_scatter / allgather_shards (transports/collective.hpp): S =
// ceil(count / W) elements per shard, rank r owns [min(r S, count), min((r + 1) S, count)).
using transport::ShardRange;
using transport::shard_range;
using transport::shard_size;

// Completion state of one collective, shared by the submitter and the progress thread.
class Request {
 public:
  // True once finished. Throws Error if the collective failed.
  bool test();
  // True once finished, successfully or not; never throws.
  bool finished() const { return done_.load(); }
  // Waits up to `timeout` (negative: no limit of its own; the communicator's no-progress
  // timeout still applies). Returns false on expiry, throws Error if the collective failed.
  bool wait_for(std::chrono::milliseconds timeout);
  // Like wait_for(-1) but never throws: the final status.
  Status wait_status();
  // Why it failed (empty while running or after success).
  std::string message() const;

  Clock::time_point submitted_at() const { return submitted_at_; }
  Clock::time_point completed_at() const;  // valid once finished
  uint64_t sequence() const { return sequence_; }
  // What the collective was, for statistics, logs and the trace.
  Purpose purpose() const { return purpose_; }
  uint64_t bytes() const { return bytes_; }  // payload per rank
  bool control_lane() const { return control_lane_; }

  // --- used by the communicator ---
  Request(uint64_t sequence, Clock::time_point submitted_at, Purpose purpose = Purpose::User,
          uint64_t bytes = 0, bool control_lane = false)
      : sequence_(sequence), submitted_at_(submitted_at), purpose_(purpose), bytes_(bytes),
        control_lane_(control_lane) {}
  void complete(Status status, const std::string& message);

 private:
  const uint64_t sequence_;
  const Clock::time_point submitted_at_;
  const Purpose purpose_;
  const uint64_t bytes_;
  const bool control_lane_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  Status status_ = Status::Ok;
  std::string message_;
  Clock::time_point completed_at_{};
};

struct CommOptions {
  // A collective that makes no progress for this long fails with PeerTimeout.
  std::chrono::milliseconds timeout{300000};
  // Collectives are split into chunks of about this many bytes, pipelined around the ring.
  size_t chunk_bytes = size_t(1) << 20;
  // UCX: bulk connections to each peer, messages striped over them (0: CO2_UCX_CONNECTIONS,
  // else 1; transports/ucx/transport.hpp).
  int connections_per_peer = 0;
  // Elastic groups (docs/architecture.md, "Membership"): 0, a lost rank fails the communicator
  // on every rank (for good); k >= 1, the survivors re-form without it while at least k remain.
  int elastic_min_ranks = 0;
};

// How an f32 all-reduce travels (runtime/collectives/collectives.hpp, make_allreduce): `format` other than
// F32 compresses every message; `residual` (optional, `count` floats, valid until the request
// finished) receives what this rank's encodings dropped; `segments` (valid until the request
// finished) where int8 groups must start. Over a collective-kind transport the buffer must be host
// memory: each rank's encoding, made at submission, is all-gathered (collectives::GatheredWire).
struct WireCompression {
  WireFormat format = WireFormat::F32;
  float* residual = nullptr;
  SegmentStarts segments;
};

namespace collectives {
struct Descriptor;  // runtime/collectives/collectives.hpp
}
class PointToPointExecutor;  // defined in comm.cpp: the progress thread and the active collectives
class CollectiveTransportExecutor;  // runtime/comm/collective_comm.hpp: collective-kind transports (NCCL)

// A group's transport after its membership changed: point-to-point (UCX, local) or collective
// (NCCL), whichever kind the group was formed over; neither where the group stays as it was.
struct GroupTransport {
  std::unique_ptr<transport::PointToPoint> point_to_point;
  std::unique_ptr<transport::Collective> collective;

  GroupTransport() = default;
  GroupTransport(std::unique_ptr<transport::PointToPoint> t) : point_to_point(std::move(t)) {}  // NOLINT: implicit by design
  GroupTransport(std::unique_ptr<transport::Collective> t) : collective(std::move(t)) {}        // NOLINT
  explicit operator bool() const { return point_to_point != nullptr || collective != nullptr; }
};

// What an elastic communicator asks of its membership (implemented by runtime/group/membership,
// a layer above): the transport of the group after it changed.
class MembershipChanges {
 public:
  virtual ~MembershipChanges() = default;
  // After a failure: the transport of the ranks still alive. Blocks while the survivors agree
  // on who they are; throws Error when this rank is left out or too few ranks remain. `cause`:
  // the failure's message.
  virtual GroupTransport survivors(const std::string& cause) = 0;
  // After survivors(): for every rank of the new group, its rank in the group before.
  virtual std::vector<int> previous_ranks() const = 0;
  // Join requests made at the group's door so far, as this rank sees them (0 where it does not
  // look: only the rank that keeps the door does).
  virtual int64_t join_requests() = 0;
  // Of them, the ones admitted: the same on every member.
  virtual int64_t admitted() const = 0;
  // Collective over the members, with join_requests > admitted(): the transport of the members
  // and the processes that made requests up to `join_requests`; empty where nobody who asked
  // could be admitted.
  virtual GroupTransport admit(int64_t join_requests) = 0;
  // Collective over the members, `leaving` among them: the transport of the members without it;
  // empty on the rank that leaves, which is then no member any more.
  virtual GroupTransport release(int leaving) = 0;
  // Ranks of the current group this process saw not answering for a while (a stopped process):
  // a failed communicator's abort does not wait for them. Thread-safe.
  virtual std::vector<int> unresponsive() const { return {}; }
  // How the membership fails the communicator it serves when it learns of a lost member before
  // the collectives do (runtime/group/membership.hpp: a ring successor silent for the
  // communicator's timeout, counted from when it stopped answering rather than from the start of
  // the collective that then waits for it). The communicator hands it over in set_membership and
  // takes it back (an empty function) in its destructor: `fail` may run on a thread of the
  // membership's, and once the call that replaces it returned it is neither running nor called
  // again. Thread-safe.
  using FailureSink = std::function<void(Status status, const std::string& message)>;
  virtual void report_failures_to(FailureSink fail) { (void)fail; }
};

class Communicator {
 public:
  Communicator(std::unique_ptr<transport::PointToPoint> transport, const CommOptions& options);
  // Over a collective-kind transport (NCCL): same API, same fault handling; buffers may be
  // device memory, ordered on collective_stream().
  Communicator(std::unique_ptr<transport::Collective> transport, const CommOptions& options);
  ~Communicator();  // fails what is still in flight with Aborted, joins the progress thread
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  const CommOptions& options() const;

  // All submit calls: thread-compatible (one submitting thread at a time), buffers must stay
  // valid until the request finishes. Results are bit-identical on every rank. If the
  // communicator has failed, they throw the stored error.
  // `id` names the collective's owner and purpose; the communicator numbers each (owner,
  // purpose) pair's collectives, and the peers refuse to pair collectives whose identity or
  // shape differ: CollectiveMismatch on every rank.
  std::shared_ptr<Request> allreduce(void* buffer, size_t count, DataType dtype, ReduceOp op,
                                     CollectiveId id = {});
  // Like allreduce, and runs `on_result` on the progress thread once the result is final, just
  // before the request completes: the engine checks the average for NaN/Inf there, off the
  // training thread. (Added by the engine; on_result must not throw.)
  std::shared_ptr<Request> allreduce_then(void* buffer, size_t count, DataType dtype, ReduceOp op,
                                          std::function<void()> on_result, CollectiveId id = {},
                                          const WireCompression& wire = {});
  std::shared_ptr<Request> broadcast(void* buffer, size_t count, DataType dtype, int root,
                                     CollectiveId id = {});
  // The all-reduce's first half, in place on the whole buffer: once the request completed,
  // shard_range(count, size(), rank()) of `buffer` holds exactly what allreduce would have left
  // there (bit for bit, every wire format, the residual of `wire` too: all `count` entries, as
  // the all-reduce writes them). The rest of `buffer` is unspecified. Identity, lanes, timeout
  // and fault handling are the all-reduce's. `on_result` (may be empty) runs on the progress
  // thread once this rank's shard is final, before the request completes.
  std::shared_ptr<Request> reduce_scatter(void* buffer, size_t count, DataType dtype, ReduceOp op,
                                          CollectiveId id = {}, const WireCompression& wire = {},
                                          std::function<void()> on_result = {});
  // The all-reduce's second half, in place: every rank's shard_range of `buffer` reaches every
  // other rank bit for bit; afterwards all of `buffer` is equal on every rank. After
  // reduce_scatter of the same buffer, the result is allreduce's bit for bit. Travels in fp32
  // (the all-gather is not compressed). Over NCCL the layout is the same but the result is
  // NCCL's, not bit-equal to its allreduce.
  // `after` (may be empty): the all-gather starts only once that earlier request of this
  // communicator completed here, so that a chain submitted at once — reduce_scatter whose
  // on_result rewrites this rank's shard, then allgather_shards — gathers the rewritten shards.
  // Waiting for it counts as progress (no timeout of its own). If that request failed, this
  // collective never starts: the communicator fails with its status and a message that quotes
  // its error, here and (through the transport's abort) at the peers, so a failed link fails the
  // rest of its chain on every rank. Over a collective transport (NCCL), which runs collectives
  // in the order they were posted, the collectives submitted after a gated one wait with it.
  std::shared_ptr<Request> allgather_shards(void* buffer, size_t count, DataType dtype,
                                            CollectiveId id = {},
                                            std::function<void()> on_result = {},
                                            std::shared_ptr<Request> after = {});
  // Each rank contributes `count_per_rank` elements from `send`; `recv` receives
  // size() * count_per_rank elements in rank order. `send` may alias recv's own block.
  std::shared_ptr<Request> allgather(const void* send, void* recv, size_t count_per_rank,
                                     DataType dtype, CollectiveId id = {});

  // A new owner id for CollectiveId (1, 2, ...): engines take one when they are created, so
  // the n-th engine on one rank pairs only with the n-th engine on the others. Thread-safe.
  uint32_t register_owner();

  // Thread-safe: fails everything pending and future, here and at the peers, with Aborted.
  void abort();
  // Like abort, with the status and message of a failure found elsewhere (an engine whose other
  // communicator failed: its peers here learn of it at once instead of after their timeout).
  // The first failure of a communicator wins.
  void fail_with(Status status, const std::string& message);

  // Ok, or the sticky error that failed the communicator (first one wins).
  Status error_status() const;
  std::string error_message() const;

  // The stream (cudaStream_t) a collective-kind transport runs every collective on; nullptr
  // over point-to-point, whose collectives take host memory only.
  void* collective_stream() const;
  // The CUDA device of a collective-kind transport's collectives; -1 over point-to-point.
  int collective_device() const;

  // --- elastic membership (docs/architecture.md, "Membership") ---
  // Set by the group layer (runtime/group/membership.hpp) on an elastic communicator.
  void set_membership(std::shared_ptr<MembershipChanges> membership);
  bool elastic() const { return membership_ != nullptr; }
  // Whether a failure of this communicator can be survived: it is elastic and the failure is a
  // lost or silent peer (or a peer's abort caused by one), not this process's own abort().
  bool can_reform() const;
  // After a failure that can_reform(): continues over the survivors' transport, with the new
  // rank and size, fresh sequence numbers and no collective in flight. Caller: the submitting
  // thread, with every request of this communicator finished. Throws the membership's Error.
  void reform();
  // Join requests made so far at the group's door, as this rank sees them (only the rank that
  // keeps the door looks; 0 elsewhere), and how many of them the members admitted.
  int64_t join_requests() const;
  int64_t admitted() const;
  // After reform(): for every rank of the re-formed group, its rank in the group before.
  std::vector<int> previous_ranks() const;
  // Collective over the members, with join_requests > admitted(): continues over a transport
  // of the members and the processes that asked up to `join_requests` (the members keep their
  // ranks, the joiners follow in the order they asked). Caller as for reform(), on a healthy
  // communicator.
  void admit(int64_t join_requests);
  // Collective over the members, on a healthy communicator: continues over a transport without
  // rank `leaving` (the others keep their order). On that rank every later collective fails
  // with Status::Left; the others hear nothing of it (no abort reaches them).
  void release(int leaving);
  // A process that joined a running group: its engine's commit takes the group's state instead
  // of forming its own (runtime/engine/membership_change.cpp). Cleared by that commit.
  bool joining() const { return joining_; }
  void set_joining(bool joining) { joining_ = joining; }
  // 0 at formation, +1 at every membership change.
  uint64_t generation() const { return generation_.load(); }

 private:
  std::unique_ptr<PointToPointExecutor> point_to_point_;
  std::unique_ptr<CollectiveTransportExecutor> collective_transport_;  // instead of point_to_point_ for collective transports
  std::atomic<uint32_t> next_owner_{1};
  // Continues over `transport` (of either kind) with fresh sequence numbers; the old executor
  // goes, and with it whatever of the old group it still held.
  void replace_transport(GroupTransport transport);
  // A compressed all-reduce (whole) or reduce-scatter over the collective transport: this rank's
  // encoding of `buffer` as it is now, all-gathered, decoded once completed (collectives::GatheredWire).
  std::shared_ptr<Request> submit_gathered(const collectives::Descriptor& descriptor, float* buffer,
                                           const WireCompression& wire, bool whole, std::function<void()> on_result);

  std::shared_ptr<MembershipChanges> membership_;
  bool joining_ = false;
  std::atomic<bool> aborted_here_{false};  // abort() was called on this communicator
  std::atomic<uint64_t> generation_{0};
  // Held by reform() while it replaces point_to_point_, and by the calls other threads may make.
  mutable std::mutex executor_mutex_;
};

// Per-(owner, purpose) sequence numbers of one communicator's collectives.
class PurposeSequences {
 public:
  uint64_t peek(CollectiveId id) const;
  void consume(CollectiveId id) { ++next_[key(id)]; }

 private:
  static std::pair<uint32_t, uint8_t> key(CollectiveId id) { return {id.owner, uint8_t(id.purpose)}; }
  std::map<std::pair<uint32_t, uint8_t>, uint64_t> next_;
};

}  // namespace co2

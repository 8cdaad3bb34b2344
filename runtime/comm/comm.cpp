#include "runtime/comm/comm.hpp"

#include <algorithm>
#include <deque>
#include <functional>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/collective_comm.hpp"
#include "runtime/collectives/collectives.hpp"

namespace co2 {

uint64_t PurposeSequences::peek(CollectiveId id) const {
  const auto found = next_.find(key(id));
  return found == next_.end() ? 0 : found->second;
}

// ---------------------------------------------------------------------------------------------
// Request

bool Request::test() {
  if (!done_.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (status_ != Status::Ok) throw Error(status_, message_);
  return true;
}

bool Request::wait_for(std::chrono::milliseconds timeout) {
  // The condition variable adds the timeout to now() in nanoseconds: INT64_MAX ms would overflow
  // into the past and time out at once. Anything longer than a century waits like a century.
  constexpr std::chrono::milliseconds kLongestTimedWait = std::chrono::hours(24 * 365 * 100);
  timeout = std::min(timeout, kLongestTimedWait);
  std::unique_lock<std::mutex> lock(mutex_);
  const auto is_done = [&] { return done_.load(std::memory_order_relaxed); };
  if (timeout.count() < 0) {
    cv_.wait(lock, is_done);
  } else if (!cv_.wait_for(lock, timeout, is_done)) {
    return false;
  }
  if (status_ != Status::Ok) throw Error(status_, message_);
  return true;
}

Status Request::wait_status() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_.load(std::memory_order_relaxed); });
  return status_;
}

std::string Request::message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

Clock::time_point Request::completed_at() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_at_;
}

void Request::complete(Status status, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    status_ = status;
    message_ = message;
    completed_at_ = Clock::now();
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

// ---------------------------------------------------------------------------------------------
// PointToPointExecutor: the progress thread and the collectives it drives.

namespace {

// The transport's wait cannot be interrupted by a submission, so while collectives are active
// the progress thread looks for new submissions (and re-checks deadlines) at least this often.
constexpr auto kPollInterval = std::chrono::microseconds(1000);

// After the transport was aborted, how long to wait for it to release a failed collective's
// messages before giving up on them (an aborted transport releases them at the next test).
// Giving up is safe for the caller's buffers: a transport whose receives may land late has
// them land in the collective's own staging (transport::PointToPoint::receives_may_land_late),
// and the collective is kept alive in abandoned_ until the transport is gone.
constexpr auto kReleaseLimit = std::chrono::seconds(5);

// Chunks (segments of an all-reduce) in flight per collective: enough to keep every link busy
// while one chunk is being reduced, few enough to bound the scratch memory.
constexpr size_t kChunksInFlight = 4;
// With several connections per peer: chunks in flight per connection, so that a connection has
// its next chunk queued when one completes instead of idling while the ring hands it another
// (measured on a per-flow-capped link: docs/transports.md, "Several connections per peer").
constexpr size_t kChunksInFlightPerConnection = 2;

}  // namespace

class PointToPointExecutor {
 public:
  using Factory = std::function<std::unique_ptr<collectives::Collective>(
      transport::PointToPoint&, const collectives::Descriptor&, const collectives::Tuning&)>;

  PointToPointExecutor(std::unique_ptr<transport::PointToPoint> transport, const CommOptions& options);
  ~PointToPointExecutor();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }

  // Assigns the next sequence number to `descriptor`, builds the collective and queues it.
  // `on_result` (may be empty) runs on the progress thread once the result is final.
  // `after` (may be empty): the collective is not advanced before that request finished.
  std::shared_ptr<Request> submit(collectives::Descriptor descriptor, const Factory& make,
                                  std::function<void()> on_result = {},
                                  std::shared_ptr<Request> after = {});

  // Records the first error (later ones are dropped), lets the progress thread fail everything
  // in flight and, with tell_peers, aborts the transport so that the peers fail promptly too.
  void fail(Status status, const std::string& message, bool tell_peers = true);
  // Where an abort learns which peers do not answer at all (MembershipChanges::unresponsive):
  // set before the first collective.
  void set_membership(std::shared_ptr<const MembershipChanges> membership) {
    std::lock_guard<std::mutex> lock(mutex_);
    membership_ = std::move(membership);
  }
  // Peers known never to answer (transport::PointToPoint::peers_unresponsive). Thread-safe.
  void peers_unresponsive(const std::vector<int>& ranks) { transport_->peers_unresponsive(ranks); }

  Status error_status() const;
  std::string error_message() const;

 private:
  struct Submitted {
    std::shared_ptr<Request> request;
    std::unique_ptr<collectives::Collective> collective;
    std::function<void()> on_result;
    std::shared_ptr<Request> after;
  };
  struct Active {
    Submitted submitted;
    Clock::time_point last_progress;
  };

  void run();
  // One round-robin pass over every active collective. True if any message completed.
  bool advance_all(std::vector<Active>& active);
  void enforce_progress_timeout(const std::vector<Active>& active);
  void fail_all(std::vector<Active>& active);
  void complete_successfully(Submitted& submitted);
  std::string where() const { return "rank " + std::to_string(rank_); }

  std::unique_ptr<transport::PointToPoint> transport_;
  std::shared_ptr<const MembershipChanges> membership_;  // guarded by mutex_ (set_membership)
  const CommOptions options_;
  const collectives::Tuning tuning_;
  const int rank_;
  const int size_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;  // submissions, failure, stop
  std::deque<Submitted> incoming_;
  uint64_t next_sequence_ = 0;
  PurposeSequences purpose_sequences_;
  bool stop_requested_ = false;
  std::atomic<bool> failed_{false};
  Status error_status_ = Status::Ok;
  std::string error_message_;

  // Failed collectives whose messages the transport never released: they (and their scratch)
  // must outlive the transport. Touched by the progress thread only, then by the destructor.
  std::vector<std::unique_ptr<collectives::Collective>> abandoned_;

  std::thread progress_thread_;  // last: starts once everything above is initialised
};

PointToPointExecutor::PointToPointExecutor(std::unique_ptr<transport::PointToPoint> transport,
                                   const CommOptions& options)
    : transport_(std::move(transport)),
      options_(options),
      tuning_{options.chunk_bytes,
              std::max(kChunksInFlight, kChunksInFlightPerConnection * size_t(transport_->connections_per_peer()))},
      rank_(transport_->rank()),
      size_(transport_->size()),
      progress_thread_([this] { run(); }) {}

PointToPointExecutor::~PointToPointExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
  progress_thread_.join();
  transport_.reset();
  abandoned_.clear();
}

std::shared_ptr<Request> PointToPointExecutor::submit(collectives::Descriptor descriptor,
                                                  const Factory& make,
                                                  std::function<void()> on_result,
                                                  std::shared_ptr<Request> after) {
  std::shared_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) throw Error(error_status_, error_message_);
    const CollectiveId id{descriptor.owner, descriptor.purpose};
    descriptor.sequence = next_sequence_;
    descriptor.purpose_sequence = purpose_sequences_.peek(id);
    // Built before the sequence numbers are consumed: a rejected submission leaves no gap.
    auto collective = make(*transport_, descriptor, tuning_);
    purpose_sequences_.consume(id);
    request = std::make_shared<Request>(next_sequence_++, Clock::now(), descriptor.purpose,
                                        descriptor.count * dtype_size(descriptor.dtype),
                                        descriptor.control_lane());
    incoming_.push_back({request, std::move(collective), std::move(on_result), std::move(after)});
  }
  wake_.notify_all();
  return request;
}

void PointToPointExecutor::fail(Status status, const std::string& message, bool tell_peers) {
  std::shared_ptr<const MembershipChanges> membership;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) return;
    error_status_ = status;
    error_message_ = message;
    failed_ = true;
    membership = membership_;
  }
  if (tell_peers) {
    if (membership) transport_->peers_unresponsive(membership->unresponsive());
    transport_->abort(message);
  }
  wake_.notify_all();
}

Status PointToPointExecutor::error_status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_status_;
}

std::string PointToPointExecutor::error_message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_message_;
}

void PointToPointExecutor::run() {
  std::vector<Active> active;
  for (;;) {
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (active.empty())
        wake_.wait(lock, [&] { return stop_requested_ || !incoming_.empty(); });
      const auto now = Clock::now();
      for (auto& submitted : incoming_) active.push_back({std::move(submitted), now});
      incoming_.clear();
      stopping = stop_requested_;
    }
    if (stopping && !active.empty())
      fail(Status::Aborted, "communicator on " + where() + " destroyed with " +
                                std::to_string(active.size()) + " collective(s) in flight");
    if (failed_) {
      fail_all(active);
      if (stopping) return;
      continue;
    }
    if (stopping) return;

    const bool progressed = advance_all(active);
    transport_->progress();
    enforce_progress_timeout(active);
    if (!progressed && !active.empty() && !failed_) transport_->wait_for_activity(kPollInterval);
  }
}

bool PointToPointExecutor::advance_all(std::vector<Active>& active) {
  bool progressed = false;
  for (auto it = active.begin(); it != active.end();) {
    collectives::Collective& collective = *it->submitted.collective;
    if (it->submitted.after) {
      if (!it->submitted.after->finished()) {  // gated: waiting counts as progress
        it->last_progress = Clock::now();
        ++it;
        continue;
      }
      // A chain stops at its first failed link: what follows would work on a result that never
      // came (a partly reduced shard). Failing the communicator, not only this collective, ends
      // the peers' side of it at once instead of after their timeout.
      const Status before = it->submitted.after->wait_status();
      if (before != Status::Ok) {
        fail(before, collectives::chain_stopped_message(it->submitted.collective->descriptor().to_string() + " on " + where(),
                                           it->submitted.after->message()));
        return progressed;  // the next turn of the loop fails everything
      }
      it->submitted.after.reset();
    }
    if (collective.advance()) {
      progressed = true;
      it->last_progress = Clock::now();
    }
    if (collective.failed()) {
      fail(collective.status(), collective.message());
      return progressed;  // the next turn of the loop fails everything
    }
    if (collective.finished()) {
      complete_successfully(it->submitted);
      it = active.erase(it);
      continue;
    }
    ++it;
  }
  return progressed;
}

void PointToPointExecutor::enforce_progress_timeout(const std::vector<Active>& active) {
  const auto now = Clock::now();
  for (const Active& entry : active) {
    if (now - entry.last_progress < options_.timeout) continue;
    fail(Status::PeerTimeout,
         entry.submitted.collective->descriptor().to_string() + " on " + where() + ": no progress for " +
             std::to_string(options_.timeout.count()) +
             " ms (a peer is stalled or gone, or did not issue this collective)");
    return;
  }
}

void PointToPointExecutor::fail_all(std::vector<Active>& active) {
  const Status status = error_status();
  const std::string message = error_message();
  const auto give_up_at = Clock::now() + kReleaseLimit;
  for (Active& entry : active) {
    Submitted& failed = entry.submitted;
    // The caller may free its buffers once the request completes, so first give the transport
    // the chance to release them; what it keeps writes only into the collective's staging.
    while (!failed.collective->release_transfers() && Clock::now() < give_up_at)
      transport_->wait_for_activity(kPollInterval);
    if (!failed.collective->release_transfers()) abandoned_.push_back(std::move(failed.collective));
    failed.request->complete(status, message);
  }
  active.clear();
}

void PointToPointExecutor::complete_successfully(Submitted& submitted) {
  if (submitted.on_result) {
    try {
      submitted.on_result();
    } catch (const std::exception& error) {
      // The result is final on every rank, so only this request fails, not the communicator.
      submitted.request->complete(Status::Internal,
                                  std::string("result hook of a collective threw: ") + error.what());
      return;
    } catch (...) {
      submitted.request->complete(Status::Internal, "result hook of a collective threw");
      return;
    }
  }
  submitted.request->complete(Status::Ok, "");
}

// ---------------------------------------------------------------------------------------------
// Communicator

namespace {

void require_valid_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
    case ReduceOp::Min:
    case ReduceOp::Max: return;
  }
  fail(Status::UnknownEnum, "unknown reduction op " + std::to_string(int(op)));
}

void require_buffer(const void* buffer, size_t count, const char* what) {
  require(buffer != nullptr || count == 0, Status::InvalidArgument,
          std::string(what) + " is NULL but count is " + std::to_string(count));
}

}  // namespace

Communicator::Communicator(std::unique_ptr<transport::PointToPoint> transport,
                           const CommOptions& options) {
  require(transport != nullptr, Status::InvalidArgument, "communicator needs a transport");
  require(options.timeout.count() > 0, Status::InvalidConfig,
          "communicator timeout must be > 0 ms, not " + std::to_string(options.timeout.count()));
  require(options.chunk_bytes > 0, Status::InvalidConfig, "communicator chunk_bytes must be > 0");
  point_to_point_ = std::make_unique<PointToPointExecutor>(std::move(transport), options);
}

Communicator::Communicator(std::unique_ptr<transport::Collective> transport,
                           const CommOptions& options) {
  require(transport != nullptr, Status::InvalidArgument, "communicator needs a transport");
  require(options.timeout.count() > 0, Status::InvalidConfig,
          "communicator timeout must be > 0 ms, not " + std::to_string(options.timeout.count()));
  collective_transport_ = std::make_unique<CollectiveTransportExecutor>(std::move(transport), options);
}

Communicator::~Communicator() {
  // Before anything goes: the membership's thread may be failing this communicator right now,
  // and must not once the executor is being destroyed.
  if (membership_) membership_->report_failures_to(nullptr);
}

int Communicator::rank() const {
  std::lock_guard<std::mutex> lock(executor_mutex_);
  return collective_transport_ ? collective_transport_->rank() : point_to_point_->rank();
}
int Communicator::size() const {
  std::lock_guard<std::mutex> lock(executor_mutex_);
  return collective_transport_ ? collective_transport_->size() : point_to_point_->size();
}
const CommOptions& Communicator::options() const {
  return collective_transport_ ? collective_transport_->options() : point_to_point_->options();
}
void* Communicator::collective_stream() const { return collective_transport_ ? collective_transport_->stream() : nullptr; }
int Communicator::collective_device() const { return collective_transport_ ? collective_transport_->device() : -1; }

namespace {
}  // namespace

std::shared_ptr<Request> Communicator::allreduce(void* buffer, size_t count, DataType dtype,
                                                 ReduceOp op, CollectiveId id) {
  return allreduce_then(buffer, count, dtype, op, {}, id);
}

namespace {
collectives::Descriptor descriptor_of(CollectiveId id, collectives::Kind kind, DataType dtype,
                                      size_t count) {
  collectives::Descriptor descriptor;
  descriptor.owner = id.owner;
  descriptor.purpose = id.purpose;
  descriptor.kind = kind;
  descriptor.dtype = dtype;
  descriptor.count = count;
  return descriptor;
}

// The checked descriptor of an all-reduce or a reduce-scatter.
collectives::Descriptor reduction_descriptor(CollectiveId id, collectives::Kind kind,
                                             const void* buffer, size_t count, DataType dtype,
                                             ReduceOp op, WireFormat format, bool collective_kind) {
  dtype_size(dtype);
  require_valid_op(op);
  require_buffer(buffer, count, kind == collectives::Kind::AllReduce ? "allreduce buffer"
                                                                     : "reduce_scatter buffer");
  collectives::Descriptor descriptor = descriptor_of(id, kind, dtype, count);
  descriptor.op = op;
  descriptor.wire = wire_format_of(int(format));
  require(!collective_kind || format == WireFormat::F32 || dtype == DataType::F32, Status::InvalidArgument,
          std::string("a ") + wire_format_name(format) + " wire format compresses f32 values");
  return descriptor;
}
}  // namespace

std::shared_ptr<Request> Communicator::allreduce_then(void* buffer, size_t count, DataType dtype,
                                                      ReduceOp op,
                                                      std::function<void()> on_result,
                                                      CollectiveId id, const WireCompression& wire) {
  const collectives::Descriptor descriptor =
      reduction_descriptor(id, collectives::Kind::AllReduce, buffer, count, dtype, op, wire.format,
                           collective_transport_ != nullptr);
  if (collective_transport_ && wire.format != WireFormat::F32)
    return submit_gathered(descriptor, static_cast<float*>(buffer), wire, /*whole=*/true, std::move(on_result));
  if (collective_transport_)
    return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
      return t.post_allreduce(buffer, buffer, count, dtype, op);
    }, std::move(on_result));
  float* residual = wire.residual;
  const SegmentStarts segments = wire.segments;
  return point_to_point_->submit(descriptor, [buffer, residual, segments](transport::PointToPoint& transport,
                                                                  const collectives::Descriptor& agreed,
                                                                  const collectives::Tuning& tuning) {
    return collectives::make_allreduce(transport, agreed, buffer, tuning, residual, segments);
  }, std::move(on_result));
}

std::shared_ptr<Request> Communicator::broadcast(void* buffer, size_t count, DataType dtype,
                                                 int root, CollectiveId id) {
  dtype_size(dtype);
  require_buffer(buffer, count, "broadcast buffer");
  require(root >= 0 && root < size(), Status::InvalidArgument,
          "broadcast root " + std::to_string(root) + " is out of range for " +
              std::to_string(size()) + " ranks");
  collectives::Descriptor descriptor = descriptor_of(id, collectives::Kind::Broadcast, dtype, count);
  descriptor.root = root;
  if (collective_transport_)
    return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
      return t.post_broadcast(buffer, count, dtype, root);
    });
  return point_to_point_->submit(descriptor, [buffer](transport::PointToPoint& transport,
                                              const collectives::Descriptor& agreed,
                                              const collectives::Tuning& tuning) {
    return collectives::make_broadcast(transport, agreed, buffer, tuning);
  });
}

std::shared_ptr<Request> Communicator::allgather(const void* send, void* recv,
                                                 size_t count_per_rank, DataType dtype,
                                                 CollectiveId id) {
  dtype_size(dtype);
  require_buffer(send, count_per_rank, "allgather send buffer");
  require_buffer(recv, count_per_rank, "allgather receive buffer");
  const collectives::Descriptor descriptor =
      descriptor_of(id, collectives::Kind::AllGather, dtype, count_per_rank);
  if (collective_transport_)
    return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
      return t.post_allgather(send, recv, count_per_rank, dtype);
    });
  return point_to_point_->submit(descriptor, [send, recv](transport::PointToPoint& transport,
                                                  const collectives::Descriptor& agreed,
                                                  const collectives::Tuning& tuning) {
    return collectives::make_allgather(transport, agreed, send, recv, tuning);
  });
}

std::shared_ptr<Request> Communicator::reduce_scatter(void* buffer, size_t count, DataType dtype,
                                                      ReduceOp op, CollectiveId id,
                                                      const WireCompression& wire,
                                                      std::function<void()> on_result) {
  const collectives::Descriptor descriptor =
      reduction_descriptor(id, collectives::Kind::ReduceScatter, buffer, count, dtype, op,
                           wire.format, collective_transport_ != nullptr);
  if (collective_transport_ && wire.format != WireFormat::F32)
    return submit_gathered(descriptor, static_cast<float*>(buffer), wire, /*whole=*/false, std::move(on_result));
  if (collective_transport_)
    return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
      return t.post_reduce_scatter(buffer, count, dtype, op);
    }, std::move(on_result));
  float* residual = wire.residual;
  const SegmentStarts segments = wire.segments;
  return point_to_point_->submit(descriptor, [buffer, residual, segments](transport::PointToPoint& transport,
                                                                  const collectives::Descriptor& agreed,
                                                                  const collectives::Tuning& tuning) {
    return collectives::make_reduce_scatter(transport, agreed, buffer, tuning, residual, segments);
  }, std::move(on_result));
}

std::shared_ptr<Request> Communicator::allgather_shards(void* buffer, size_t count, DataType dtype,
                                                        CollectiveId id,
                                                        std::function<void()> on_result,
                                                        std::shared_ptr<Request> after) {
  dtype_size(dtype);
  require_buffer(buffer, count, "allgather_shards buffer");
  const collectives::Descriptor descriptor =
      descriptor_of(id, collectives::Kind::AllGatherShards, dtype, count);
  if (collective_transport_)
    return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
      return t.post_allgather_shards(buffer, count, dtype);
    }, std::move(on_result), std::move(after));
  return point_to_point_->submit(descriptor, [buffer](transport::PointToPoint& transport,
                                              const collectives::Descriptor& agreed,
                                              const collectives::Tuning& tuning) {
    return collectives::make_allgather_shards(transport, agreed, buffer, tuning);
  }, std::move(on_result), std::move(after));
}

// The encoding runs here, on the submitting thread, so `buffer` must be host memory; one rank
// sends nothing and its result is its input, as over the ring.
std::shared_ptr<Request> Communicator::submit_gathered(const collectives::Descriptor& descriptor, float* buffer,
                                                       const WireCompression& wire, bool whole,
                                                       std::function<void()> on_result) {
  const int ranks = size(), me = rank();
  auto gathered = std::make_shared<const collectives::GatheredWire>(wire.format, descriptor.count, ranks, wire.segments);
  auto blocks = std::make_shared<std::vector<int64_t>>(gathered->words_per_rank * size_t(ranks), 0);
  int64_t* mine = blocks->data() + gathered->words_per_rank * size_t(me);
  if (ranks > 1)
    gathered->encode(buffer, wire.residual, reinterpret_cast<std::byte*>(mine));
  else if (wire.residual)
    std::fill(wire.residual, wire.residual + descriptor.count, 0.0f);
  const bool average = descriptor.op == ReduceOp::Avg;
  return collective_transport_->submit(descriptor, [=](transport::Collective& t) {
    return t.post_allgather(mine, blocks->data(), gathered->words_per_rank, DataType::I64);
  }, [=, then = std::move(on_result)] {
    if (ranks > 1) {
      const auto* all = reinterpret_cast<const std::byte*>(blocks->data());
      for (int shard = whole ? 0 : me; shard < (whole ? ranks : me + 1); ++shard)
        gathered->decode(all, shard, average, buffer);
    }
    if (then) then();
  });
}

uint32_t Communicator::register_owner() { return next_owner_.fetch_add(1); }

void Communicator::abort() {
  aborted_here_ = true;
  std::lock_guard<std::mutex> lock(executor_mutex_);
  if (collective_transport_)
    return collective_transport_->fail(Status::Aborted, "communicator aborted on rank " +
                                                            std::to_string(collective_transport_->rank()));
  point_to_point_->fail(Status::Aborted, "communicator aborted on rank " + std::to_string(point_to_point_->rank()));
}

void Communicator::fail_with(Status status, const std::string& message) {
  std::lock_guard<std::mutex> lock(executor_mutex_);
  if (collective_transport_) return collective_transport_->fail(status, message);
  point_to_point_->fail(status, message);
}

Status Communicator::error_status() const {
  std::lock_guard<std::mutex> lock(executor_mutex_);
  return collective_transport_ ? collective_transport_->error_status() : point_to_point_->error_status();
}
std::string Communicator::error_message() const {
  std::lock_guard<std::mutex> lock(executor_mutex_);
  return collective_transport_ ? collective_transport_->error_message() : point_to_point_->error_message();
}

void Communicator::set_membership(std::shared_ptr<MembershipChanges> membership) {
  membership_ = std::move(membership);
  // The unresponsive peers' hint is for point-to-point transports, whose abort waits for each
  // peer to hear of it; a collective transport's abort does not wait.
  if (point_to_point_) point_to_point_->set_membership(membership_);
  // Thread-safe like fail_with itself; reform() swaps the executor under the same lock, so a
  // failure the membership finds during a change lands on whichever executor is current.
  membership_->report_failures_to([this](Status status, const std::string& message) { fail_with(status, message); });
}

bool Communicator::can_reform() const {
  if (!membership_ || aborted_here_) return false;
  switch (error_status()) {
    case Status::PeerLost:
    case Status::PeerTimeout:
    case Status::Aborted:  // a peer's abort: it lost a peer first (an abort of our own is excluded above)
    case Status::Transport:
      return true;
    default:
      return false;
  }
}

void Communicator::reform() {
  require(can_reform(), Status::InvalidState,
          "reform() after a failure that elastic membership survives only (status " +
              std::to_string(int(error_status())) + ": " + error_message() + ")");
  // The new transport is a transport of its own (its own UCX worker): nothing of the old,
  // failed group reaches it. A membership that throws leaves the communicator failed as it was.
  const int old_size = size();
  GroupTransport survivors = membership_->survivors(error_message());
  // The ranks the survivors agreed to leave out are dead or stopped (a live one that arrived too
  // late fails at its own agreement): the old transport's teardown need not wait for them to hear
  // of its abort. A stopped rank never would, so every survivor whose heartbeat did not watch it
  // waited out the transport's notice grace (UCX: 1 s from the abort) here, before the state
  // hand-over could start (docs/benchmarks.md, "Elastic groups: what a lost rank costs").
  const std::vector<int> kept = membership_->previous_ranks();
  std::vector<int> left_out;
  for (int rank = 0; rank < old_size; ++rank)
    if (std::find(kept.begin(), kept.end(), rank) == kept.end()) left_out.push_back(rank);
  {
    std::lock_guard<std::mutex> lock(executor_mutex_);
    if (point_to_point_) point_to_point_->peers_unresponsive(left_out);  // an aborted NCCL waits for nobody
  }
  replace_transport(std::move(survivors));
}

int64_t Communicator::join_requests() const {
  if (!membership_ || error_status() != Status::Ok) return 0;
  return membership_->join_requests();
}

int64_t Communicator::admitted() const { return membership_ ? membership_->admitted() : 0; }

std::vector<int> Communicator::previous_ranks() const {
  return membership_ ? membership_->previous_ranks() : std::vector<int>{};
}

void Communicator::admit(int64_t join_requests) {
  require(membership_ != nullptr && error_status() == Status::Ok && join_requests > admitted(), Status::InvalidState,
          "admit() needs a healthy elastic communicator and a join request not admitted yet");
  // Empty: nobody who asked could be admitted; the group stays as it is.
  if (GroupTransport grown = membership_->admit(join_requests)) replace_transport(std::move(grown));
}

void Communicator::release(int leaving) {
  require(membership_ != nullptr && error_status() == Status::Ok && leaving >= 0 && leaving < size(),
          Status::InvalidState, "release() needs a healthy elastic communicator and a member's rank");
  const int rank_before = rank();
  if (GroupTransport kept = membership_->release(leaving)) return replace_transport(std::move(kept));
  const std::string left = "rank " + std::to_string(rank_before) + " left its group (co2_engine_leave)";
  std::lock_guard<std::mutex> lock(executor_mutex_);
  if (collective_transport_) return collective_transport_->fail(Status::Left, left, /*tell_peers=*/false);
  point_to_point_->fail(Status::Left, left, /*tell_peers=*/false);
}

void Communicator::replace_transport(GroupTransport transport) {
  require(bool(transport), Status::Internal, "membership: a re-formed group without a transport");
  std::unique_ptr<PointToPointExecutor> next_point_to_point;
  std::unique_ptr<CollectiveTransportExecutor> next_collective;
  if (transport.collective) {
    next_collective = std::make_unique<CollectiveTransportExecutor>(std::move(transport.collective), options());
  } else {
    next_point_to_point = std::make_unique<PointToPointExecutor>(std::move(transport.point_to_point), options());
    next_point_to_point->set_membership(membership_);
  }
  std::unique_ptr<PointToPointExecutor> old_point_to_point;
  std::unique_ptr<CollectiveTransportExecutor> old_collective;
  {
    std::lock_guard<std::mutex> lock(executor_mutex_);
    old_point_to_point = std::exchange(point_to_point_, std::move(next_point_to_point));
    old_collective = std::exchange(collective_transport_, std::move(next_collective));
  }
  old_point_to_point.reset();
  old_collective.reset();
  ++generation_;
}

}  // namespace co2

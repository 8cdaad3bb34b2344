// The communicator's executor for collective-kind transports (NCCL): collectives are posted to
// the transport (stream-ordered) from the submitting thread, and one poller thread per
// communicator completes their Requests. Fault handling is the same as over point-to-point: a
// sticky first error, the transport aborted so peers fail promptly, the no-progress timeout
// (a collective pending longer than the timeout fails with PeerTimeout: a collective transport
// reports no partial progress), abort from any thread.
//
// Identity check: NCCL exchanges no descriptors, so every collective is preceded on the stream
// by an all-gather of its descriptor (48 bytes per rank, host-staged). The poller compares the
// gathered descriptors before it looks at the collective itself: on a mismatch every rank sees
// every descriptor, so all of them fail with CollectiveMismatch at once and the transport is
// aborted, which also ends a real collective that the mismatch left hanging. The real collective
// is already enqueued behind the check, so with equal sizes it may have run on mismatched
// partners; its request then fails and the communicator is failed, so such a result is never
// reported as OK (docs/capi.md, "Collective identity").
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collectives/collectives.hpp"
#include "runtime/comm/comm.hpp"
#include "transports/collective.hpp"

namespace co2 {

class CollectiveTransportExecutor {
 public:
  using Post = std::function<transport::Handle(transport::Collective&)>;

  CollectiveTransportExecutor(std::unique_ptr<transport::Collective> transport, const CommOptions& options);
  ~CollectiveTransportExecutor();  // fails what is in flight with Aborted, joins the poller
  CollectiveTransportExecutor(const CollectiveTransportExecutor&) = delete;
  CollectiveTransportExecutor& operator=(const CollectiveTransportExecutor&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const CommOptions& options() const { return options_; }
  void* stream() const { return stream_; }
  int device() const { return transport_->device(); }

  // Posts through `post` (under the transport lock) and tracks the handle. `on_result` runs on
  // the poller thread once the collective completed, before the request does.
  // `descriptor` is the collective's identity and shape; its sequence numbers are assigned here.
  // `after` (may be empty): an earlier request that must complete first (a chain whose
  // reduce-scatter's on_result rewrites the shard its all-gather sends). The transport runs
  // collectives in the order they are posted, and every rank must post them in one order, so a
  // gated collective holds back every later one: they are posted by the poller, in submission
  // order, once it completed. If it failed, the communicator fails quoting its error.
  std::shared_ptr<Request> submit(collectives::Descriptor descriptor, const Post& post,
                                  std::function<void()> on_result = {}, std::shared_ptr<Request> after = {});

  // First error wins; everything in flight fails with `status` and, with tell_peers, the
  // transport is aborted so that the peers fail promptly too. Without (a rank that left its
  // elastic group): the transport is left for the destructor to close cleanly.
  void fail(Status status, const std::string& message, bool tell_peers = true);
  Status error_status() const;
  std::string error_message() const;

 private:
  struct Active {
    // The all-gather of every rank's descriptor, then the collective itself.
    std::shared_ptr<collectives::DescriptorWire> check_send;
    std::shared_ptr<std::vector<collectives::DescriptorWire>> check_recv;
    bool checked = false;
    transport::Handle check;
    collectives::Descriptor descriptor;
    transport::Handle handle;
    std::shared_ptr<Request> request;
    std::function<void()> on_result;
    Clock::time_point posted;
  };
  // Submitted, not posted yet: waits for `after`, or behind an earlier one that does.
  struct Deferred {
    collectives::Descriptor descriptor;
    Post post;
    std::function<void()> on_result;
    std::shared_ptr<Request> request;
    std::shared_ptr<Request> after;
  };
  // Posts the collective and its descriptor check; caller holds transport_mutex_.
  void post_locked(Deferred submitted);
  // Posts the deferred collectives whose `after` completed, oldest first (poller thread).
  void post_ready_deferred();
  void poll_loop();
  // Outcome of the front entry's descriptor check: Done once all descriptors matched.
  transport::Outcome test_check(Active& front);
  void fail_all_locked();

  std::unique_ptr<transport::Collective> transport_;
  const CommOptions options_;
  const int rank_, size_;
  void* const stream_;
  std::mutex transport_mutex_;  // transport calls except abort
  mutable std::mutex mutex_;    // active_, error, stop
  std::condition_variable cv_;
  std::vector<Active> active_;
  std::deque<Deferred> deferred_;
  uint64_t next_sequence_ = 0;  // and purpose_sequences_: guarded by transport_mutex_
  PurposeSequences purpose_sequences_;
  Status error_ = Status::Ok;
  std::string error_message_;
  bool stop_ = false;
  std::thread poller_;
};

}  // namespace co2

#include "runtime/comm/collective_comm.hpp"

#include <chrono>

namespace co2 {

namespace {
// How often the poller tests handles while collectives are in flight: a completed collective is
// noticed within this, and a stream-ordered consumer never waits for it anyway.
constexpr std::chrono::microseconds kPollInterval{50};
}  // namespace

CollectiveTransportExecutor::CollectiveTransportExecutor(std::unique_ptr<transport::Collective> transport,
                                     const CommOptions& options)
    : transport_(std::move(transport)),
      options_(options),
      rank_(transport_->rank()),
      size_(transport_->size()),
      stream_(transport_->stream()) {
  poller_ = std::thread([this] { poll_loop(); });
}

CollectiveTransportExecutor::~CollectiveTransportExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  poller_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!active_.empty() || !deferred_.empty()) {
    transport_->abort("communicator destroyed with collectives in flight");
    if (error_ == Status::Ok) {
      error_ = Status::Aborted;
      error_message_ = "communicator destroyed with collectives in flight";
    }
    fail_all_locked();
  }
}

std::shared_ptr<Request> CollectiveTransportExecutor::submit(collectives::Descriptor descriptor,
                                                   const Post& post,
                                                   std::function<void()> on_result,
                                                   std::shared_ptr<Request> after) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_ != Status::Ok) co2::fail(error_, error_message_);
  }
  // Held from the sequence numbers to the post: the transport's order is the submission order.
  std::lock_guard<std::mutex> order(transport_mutex_);
  const CollectiveId id{descriptor.owner, descriptor.purpose};
  descriptor.sequence = next_sequence_++;
  descriptor.purpose_sequence = purpose_sequences_.peek(id);
  purpose_sequences_.consume(id);
  Deferred submitted{descriptor, post, std::move(on_result),
                     std::make_shared<Request>(descriptor.sequence, Clock::now(), descriptor.purpose,
                                               descriptor.count * dtype_size(descriptor.dtype),
                                               descriptor.control_lane()),
                     std::move(after)};
  auto request = submitted.request;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_ != Status::Ok) {
      request->complete(error_, error_message_);
      return request;
    }
    if (!deferred_.empty() || (submitted.after && !submitted.after->finished())) {
      deferred_.push_back(std::move(submitted));
      cv_.notify_all();
      return request;
    }
  }
  post_locked(std::move(submitted));
  return request;
}

void CollectiveTransportExecutor::post_locked(Deferred submitted) {
  Active entry;
  entry.descriptor = submitted.descriptor;
  entry.check_send = std::make_shared<collectives::DescriptorWire>(collectives::encode(submitted.descriptor));
  entry.check_recv = std::make_shared<std::vector<collectives::DescriptorWire>>(size_t(size_));
  static_assert(collectives::kDescriptorBytes % sizeof(int64_t) == 0, "whole I64 elements");
  entry.check = transport_->post_allgather(entry.check_send->data(), entry.check_recv->data(),
                                           collectives::kDescriptorBytes / sizeof(int64_t), DataType::I64);
  entry.handle = submitted.post(*transport_);
  entry.on_result = std::move(submitted.on_result);
  entry.request = std::move(submitted.request);
  entry.posted = Clock::now();  // the no-progress timeout runs from here: waiting to be posted is not a stall
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_ != Status::Ok) {  // failed while posting: the handles are dead with the transport
    entry.request->complete(error_, error_message_);
    return;
  }
  active_.push_back(std::move(entry));
  cv_.notify_all();
}

void CollectiveTransportExecutor::post_ready_deferred() {
  std::lock_guard<std::mutex> order(transport_mutex_);
  for (;;) {
    Deferred next;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (deferred_.empty() || error_ != Status::Ok) return;
      Deferred& front = deferred_.front();
      if (front.after && !front.after->finished()) return;
      next = std::move(front);
      deferred_.pop_front();
    }
    if (next.after && next.after->wait_status() != Status::Ok) {
      // A chain stops at its first failed link; failing the communicator ends the peers' side of
      // it at once instead of after their timeout.
      const std::string message =
          collectives::chain_stopped_message(next.descriptor.to_string(), next.after->message());
      next.request->complete(next.after->wait_status(), message);
      fail(next.after->wait_status(), message);
      return;
    }
    post_locked(std::move(next));
  }
}

transport::Outcome CollectiveTransportExecutor::test_check(Active& front) {
  if (front.checked) return transport::Outcome::Done;
  transport::Outcome outcome;
  {
    std::lock_guard<std::mutex> transport_lock(transport_mutex_);
    outcome = transport_->test(front.check);
  }
  if (outcome != transport::Outcome::Done) return outcome;
  front.checked = true;
  for (int rank = 0; rank < size_; ++rank) {
    const auto theirs = collectives::decode((*front.check_recv)[size_t(rank)]);
    if (theirs && *theirs == front.descriptor) continue;
    fail(Status::CollectiveMismatch,
         collectives::mismatch_message(rank_, front.descriptor, "rank " + std::to_string(rank),
                                       theirs) +
             " (NCCL: the collective itself may have run; its result is discarded)");
    return transport::Outcome::Failed;
  }
  return transport::Outcome::Done;
}

void CollectiveTransportExecutor::fail(Status status, const std::string& message, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_ != Status::Ok) return;
    error_ = status;
    error_message_ = message;
  }
  if (tell_peers) transport_->abort(message);  // thread-safe by contract: peers fail promptly too
  std::lock_guard<std::mutex> lock(mutex_);
  fail_all_locked();
  cv_.notify_all();
}

void CollectiveTransportExecutor::fail_all_locked() {
  for (Active& a : active_) a.request->complete(error_, error_message_);
  active_.clear();
  for (Deferred& d : deferred_) d.request->complete(error_, error_message_);
  deferred_.clear();
}

Status CollectiveTransportExecutor::error_status() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

std::string CollectiveTransportExecutor::error_message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_message_;
}

void CollectiveTransportExecutor::poll_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (active_.empty()) {
      if (deferred_.empty()) {
        cv_.wait(lock, [&] { return stop_ || !active_.empty() || !deferred_.empty(); });
        continue;
      }
      // Gated on a request that completes elsewhere (or just did): post what is ready, else poll.
      lock.unlock();
      post_ready_deferred();
      lock.lock();
      if (active_.empty() && !stop_) {
        lock.unlock();
        std::this_thread::sleep_for(kPollInterval);
        lock.lock();
      }
      continue;
    }
    // Completion is in posting order on the one stream, so only the oldest needs testing.
    Active front = active_.front();
    lock.unlock();
    transport::Outcome outcome = test_check(front);
    if (outcome == transport::Outcome::Failed && error_status() == Status::CollectiveMismatch) {
      lock.lock();
      continue;
    }
    if (outcome == transport::Outcome::Done) {
      {
        lock.lock();
        if (!active_.empty() && active_.front().request == front.request)
          active_.front().checked = true;
        lock.unlock();
      }
      std::lock_guard<std::mutex> transport_lock(transport_mutex_);
      outcome = transport_->test(front.handle);
    }
    if (outcome == transport::Outcome::Pending) {
      if (Clock::now() - front.posted > options_.timeout) {
        fail(Status::PeerTimeout,
             front.descriptor.to_string() + " made no progress for " +
                 std::to_string(options_.timeout.count()) +
                 " ms (a peer stalled or died); the communicator is aborted");
      } else {
        std::this_thread::sleep_for(kPollInterval);
      }
      lock.lock();
      continue;
    }
    if (outcome != transport::Outcome::Done) {
      std::string message;
      {
        std::lock_guard<std::mutex> transport_lock(transport_mutex_);
        message = transport_->error_message();
      }
      fail(collectives::status_of(outcome), message.empty() ? "collective transport failed" : message);
      lock.lock();
      continue;
    }
    if (front.on_result) front.on_result();
    lock.lock();
    if (!active_.empty() && active_.front().request == front.request) {
      active_.erase(active_.begin());
      front.request->complete(Status::Ok, "");
    }
    if (!deferred_.empty()) {  // the collective just completed may be what they wait for
      lock.unlock();
      post_ready_deferred();
      lock.lock();
    }
  }
}

}  // namespace co2

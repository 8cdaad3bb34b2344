// The `local` transport. Every group lives in a process-global registry keyed by its name; each
// member owns a mailbox that holds the receives it posted and the sends addressed to it that no
// receive has matched yet. Whichever side arrives second finds its partner in the receiver's
// mailbox and copies the bytes, so all state of one message is guarded by one mutex: that of the
// receiving member's mailbox.
#include "transports/local/transport.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace co2::transport::local {

namespace {

using Clock = std::chrono::steady_clock;

// One posted send or receive. `owner` posted it; `peer` is the other end.
struct Operation {
  enum class State { Queued, Matched, Finished };

  bool is_send = false;
  int owner = 0;
  int peer = 0;
  uint64_t tag = 0;
  const std::byte* send_data = nullptr;
  std::byte* recv_data = nullptr;
  size_t length = 0;

  // Guarded by the mailbox mutex of the receiving member.
  State state = State::Queued;
  Clock::time_point ready_at{};             // Matched: when the link model lets it complete
  Outcome outcome = Outcome::Pending;       // Finished: the final outcome
  std::string detail;                       // Finished with an error: why
};

using OperationPtr = std::shared_ptr<Operation>;

// Wakes a member's wait_for_activity. Kept apart from the mailbox mutex so that it can be
// signalled while any mailbox is locked (it is always the innermost lock).
class ActivitySignal {
 public:
  // Something happened now; `ready_at` (if in the future) is when a delayed completion will.
  void notify(Clock::time_point ready_at = Clock::time_point::min()) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++sequence_;
    const auto now = Clock::now();
    if (ready_at > now) wake_times_.push(ready_at);
    cv_.notify_all();
  }

  // Waits until the sequence differs from `observed`, a delayed completion falls due, or
  // `max_wait` passes. Returns the sequence to observe next time.
  uint64_t wait(uint64_t observed, std::chrono::microseconds max_wait) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto deadline = Clock::now() + max_wait;
    for (;;) {
      if (sequence_ != observed) break;
      const auto now = Clock::now();
      bool became_due = false;
      while (!wake_times_.empty() && wake_times_.top() <= now) {
        wake_times_.pop();
        became_due = true;
      }
      if (became_due || now >= deadline) break;
      auto wake = deadline;
      if (!wake_times_.empty()) wake = std::min(wake, wake_times_.top());
      cv_.wait_until(lock, wake);
    }
    return sequence_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t sequence_ = 0;
  std::priority_queue<Clock::time_point, std::vector<Clock::time_point>,
                      std::greater<Clock::time_point>>
      wake_times_;
};

// Which queue of the link sender -> receiver a message waits in: the control lane's messages
// never wait behind the bulk lane's (transport::kControlLaneTag).
uint64_t link_key(int sender, uint64_t tag) {
  return (uint64_t(uint32_t(sender)) << 1) | ((tag & kControlLaneTag) ? 1 : 0);
}

struct Member {
  std::mutex mailbox_mutex;
  std::deque<OperationPtr> posted_recvs;      // receives this member posted, unmatched
  std::deque<OperationPtr> unexpected_sends;  // sends addressed to this member, unmatched
  // Per (sender, lane) that ever sent here: when that queue of the link is free. Only links in
  // use have an entry (a ring uses one or two), so a group's state grows with W, not W^2.
  std::unordered_map<uint64_t, Clock::time_point> link_free_at;

  // False once this member's transport is destroyed. Written under this member's mailbox
  // mutex, read under others' too, hence atomic.
  std::atomic<bool> alive{true};
  // This member's outgoing links. Written before the group forms, read-only afterwards.
  LinkModel link;

  ActivitySignal activity;
};

struct Group {
  Group(std::string group_name, int group_size)
      : name(std::move(group_name)), size(group_size), joined(size_t(group_size), false) {
    for (int i = 0; i < size; ++i) members.push_back(std::make_unique<Member>());
  }

  const std::string name;
  const int size;
  std::vector<std::unique_ptr<Member>> members;

  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;
  std::string abort_reason;  // guarded by abort_mutex; the first reason wins

  // Guarded by the registry mutex.
  std::vector<bool> joined;
  int joined_count = 0;
  bool formed = false;
  int live_members = 0;  // transports not yet destroyed, once formed

  void notify_all_members() {
    for (auto& member : members) member->activity.notify();
  }

  std::string reason_for_abort() {
    std::lock_guard<std::mutex> lock(abort_mutex);
    return abort_reason;
  }
};

struct Registry {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::shared_ptr<Group>> groups;
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// Transfer time of one message on a link described by `link`.
Clock::duration transfer_time(const LinkModel& link, size_t length) {
  Clock::duration time = link.latency;
  if (link.bytes_per_second > 0.0) {
    time += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(double(length) / link.bytes_per_second));
  }
  return time;
}

std::string describe_tag(uint64_t tag) {
  std::ostringstream out;
  out << "0x" << std::hex << tag;
  return out.str();
}

class LocalTransport final : public PointToPoint {
 public:
  LocalTransport(std::shared_ptr<Group> group, int rank) : group_(std::move(group)), rank_(rank) {}
  ~LocalTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return group_->size; }

  Handle post_send(int peer, uint64_t tag, const void* data, size_t length) override;
  Handle post_recv(int peer, uint64_t tag, void* data, size_t length) override;
  Outcome test(Handle handle) override;
  void progress() override {}
  void wait_for_activity(std::chrono::microseconds max_wait) override;
  void abort(const std::string& reason) override;
  std::string error_message() const override { return last_error_; }

 private:
  Member& member(int index) { return *group_->members[size_t(index)]; }
  Member& self() { return member(rank_); }
  Handle remember(OperationPtr operation);
  static void finish(Operation& operation, Outcome outcome, std::string detail);
  // Pairs a send with a receive (both unmatched, in the receiver's mailbox, lock held).
  void match(Operation& send, Operation& recv, Member& receiver);
  Outcome release(Handle handle, Outcome outcome, std::string detail);

  std::shared_ptr<Group> group_;
  const int rank_;
  Handle next_handle_ = 1;
  std::unordered_map<Handle, OperationPtr> operations_;
  uint64_t observed_activity_ = 0;
  std::string last_error_;
};

LocalTransport::~LocalTransport() {
  Member& me = self();
  {
    // Sends that peers addressed to us can never be received now.
    std::lock_guard<std::mutex> lock(me.mailbox_mutex);
    me.alive = false;
    for (auto& send : me.unexpected_sends)
      finish(*send, Outcome::PeerLost, "rank " + std::to_string(rank_) + " is gone");
    me.unexpected_sends.clear();
    me.posted_recvs.clear();
  }
  for (int peer = 0; peer < group_->size; ++peer) {
    if (peer == rank_) continue;
    Member& other = member(peer);
    std::lock_guard<std::mutex> lock(other.mailbox_mutex);
    // Our unmatched sends reference our caller's buffers, which may go away after we return.
    auto& sends = other.unexpected_sends;
    sends.erase(std::remove_if(sends.begin(), sends.end(),
                               [&](const OperationPtr& send) { return send->owner == rank_; }),
                sends.end());
    auto& recvs = other.posted_recvs;
    recvs.erase(std::remove_if(recvs.begin(), recvs.end(),
                               [&](const OperationPtr& recv) {
                                 if (recv->peer != rank_) return false;
                                 finish(*recv, Outcome::PeerLost,
                                        "rank " + std::to_string(rank_) + " is gone");
                                 return true;
                               }),
                recvs.end());
  }
  group_->notify_all_members();

  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (--group_->live_members == 0) {
    auto found = reg.groups.find(group_->name);
    if (found != reg.groups.end() && found->second == group_) reg.groups.erase(found);
  }
}

void LocalTransport::finish(Operation& operation, Outcome outcome, std::string detail) {
  operation.state = Operation::State::Finished;
  operation.outcome = outcome;
  operation.detail = std::move(detail);
}

Handle LocalTransport::remember(OperationPtr operation) {
  const Handle handle = next_handle_++;
  operations_.emplace(handle, std::move(operation));
  return handle;
}

void LocalTransport::match(Operation& send, Operation& recv, Member& receiver) {
  if (send.length != recv.length) {
    std::string detail = "message size mismatch from rank " + std::to_string(send.owner) +
                         " to rank " + std::to_string(recv.owner) + " on tag " +
                         describe_tag(send.tag) + ": " + std::to_string(send.length) +
                         " bytes sent, " + std::to_string(recv.length) + " bytes expected";
    finish(send, Outcome::SizeMismatch, detail);
    finish(recv, Outcome::SizeMismatch, detail);
  } else {
    if (send.length > 0) std::memcpy(recv.recv_data, send.send_data, send.length);
    const LinkModel& link = member(send.owner).link;
    auto ready_at = Clock::now();
    if (link.bytes_per_second > 0.0 || link.latency.count() > 0) {
      auto& free_at =
          receiver.link_free_at.try_emplace(link_key(send.owner, send.tag), Clock::time_point::min())
              .first->second;
      ready_at = std::max(ready_at, free_at) + transfer_time(link, send.length);
      free_at = ready_at;
    }
    for (Operation* operation : {&send, &recv}) {
      operation->state = Operation::State::Matched;
      operation->ready_at = ready_at;
    }
  }
  member(send.owner).activity.notify(send.ready_at);
  if (recv.owner != send.owner) member(recv.owner).activity.notify(recv.ready_at);
}

Handle LocalTransport::post_send(int peer, uint64_t tag, const void* data, size_t length) {
  auto send = std::make_shared<Operation>();
  send->is_send = true;
  send->owner = rank_;
  send->peer = peer;
  send->tag = tag;
  send->send_data = static_cast<const std::byte*>(data);
  send->length = length;
  if (tag >> kTagBits) {
    finish(*send, Outcome::Failed, "send tag " + describe_tag(tag) + " has more than " +
                                       std::to_string(kTagBits) + " bits");
    send->peer = -1;  // never queued: test() reports the outcome as it is
    return remember(std::move(send));
  }
  if (peer < 0 || peer >= group_->size) {
    finish(*send, Outcome::Failed, "send to rank " + std::to_string(peer) +
                                       " which is out of range for a group of " +
                                       std::to_string(group_->size));
    return remember(std::move(send));
  }

  Member& receiver = member(peer);
  {
    std::lock_guard<std::mutex> lock(receiver.mailbox_mutex);
    if (group_->aborted) {
      finish(*send, Outcome::Aborted, "");
    } else if (!receiver.alive) {
      finish(*send, Outcome::PeerLost, "rank " + std::to_string(peer) + " is gone");
    } else {
      auto& recvs = receiver.posted_recvs;
      auto partner = std::find_if(recvs.begin(), recvs.end(), [&](const OperationPtr& recv) {
        return recv->peer == rank_ && recv->tag == tag;
      });
      if (partner != recvs.end()) {
        OperationPtr recv = *partner;
        recvs.erase(partner);
        match(*send, *recv, receiver);
      } else {
        receiver.unexpected_sends.push_back(send);
        receiver.activity.notify();
      }
    }
  }
  return remember(std::move(send));
}

Handle LocalTransport::post_recv(int peer, uint64_t tag, void* data, size_t length) {
  auto recv = std::make_shared<Operation>();
  recv->owner = rank_;
  recv->peer = peer;
  recv->tag = tag;
  recv->recv_data = static_cast<std::byte*>(data);
  recv->length = length;
  if (tag >> kTagBits) {
    finish(*recv, Outcome::Failed, "receive tag " + describe_tag(tag) + " has more than " +
                                       std::to_string(kTagBits) + " bits");
    recv->peer = -1;  // never queued: test() reports the outcome as it is
    return remember(std::move(recv));
  }
  if (peer < 0 || peer >= group_->size) {
    finish(*recv, Outcome::Failed, "receive from rank " + std::to_string(peer) +
                                       " which is out of range for a group of " +
                                       std::to_string(group_->size));
    return remember(std::move(recv));
  }

  Member& me = self();
  {
    std::lock_guard<std::mutex> lock(me.mailbox_mutex);
    auto& sends = me.unexpected_sends;
    auto partner = std::find_if(sends.begin(), sends.end(), [&](const OperationPtr& send) {
      return send->owner == peer && send->tag == tag;
    });
    if (group_->aborted) {
      finish(*recv, Outcome::Aborted, "");
    } else if (partner != sends.end()) {
      OperationPtr send = *partner;
      sends.erase(partner);
      match(*send, *recv, me);
    } else if (!member(peer).alive) {
      // A dead peer withdrew its unmatched sends (under our mailbox mutex) before it died, so
      // nothing can arrive any more.
      finish(*recv, Outcome::PeerLost, "rank " + std::to_string(peer) + " is gone");
    } else {
      me.posted_recvs.push_back(recv);
    }
  }
  return remember(std::move(recv));
}

Outcome LocalTransport::release(Handle handle, Outcome outcome, std::string detail) {
  operations_.erase(handle);
  if (outcome != Outcome::Done) last_error_ = std::move(detail);
  return outcome;
}

Outcome LocalTransport::test(Handle handle) {
  auto found = operations_.find(handle);
  if (found == operations_.end()) {
    last_error_ = "test of unknown handle " + std::to_string(handle);
    return Outcome::Failed;
  }
  Operation& operation = *found->second;
  const bool peer_in_range = operation.peer >= 0 && operation.peer < group_->size;
  if (!peer_in_range) return release(handle, operation.outcome, operation.detail);

  Member& receiver = operation.is_send ? member(operation.peer) : self();
  std::lock_guard<std::mutex> lock(receiver.mailbox_mutex);
  if (group_->aborted) {
    // Withdraw it so that nobody copies into (or out of) a buffer the caller may now free.
    if (operation.state == Operation::State::Queued) {
      auto& queue = operation.is_send ? receiver.unexpected_sends : receiver.posted_recvs;
      queue.erase(std::find(queue.begin(), queue.end(), found->second));
    }
    return release(handle, Outcome::Aborted,
                   "local group '" + group_->name + "' aborted: " + group_->reason_for_abort());
  }
  switch (operation.state) {
    case Operation::State::Queued:
      return Outcome::Pending;
    case Operation::State::Matched:
      if (Clock::now() < operation.ready_at) return Outcome::Pending;
      return release(handle, Outcome::Done, "");
    case Operation::State::Finished:
      break;
  }
  return release(handle, operation.outcome, operation.detail);
}

void LocalTransport::wait_for_activity(std::chrono::microseconds max_wait) {
  observed_activity_ = self().activity.wait(observed_activity_, max_wait);
}

void LocalTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(group_->abort_mutex);
    if (!group_->aborted) {
      group_->abort_reason = "rank " + std::to_string(rank_) + ": " + reason;
      group_->aborted = true;
    }
  }
  group_->notify_all_members();
}

std::string missing_ranks(const Group& group) {
  std::string list;
  for (int rank = 0; rank < group.size; ++rank) {
    if (group.joined[size_t(rank)]) continue;
    if (!list.empty()) list += ", ";
    list += std::to_string(rank);
  }
  return list;
}

std::string group_label(const std::string& name) { return "local transport group '" + name + "'"; }

}  // namespace

LinkModel LinkModel::from_environment() {
  LinkModel link;
  if (const char* text = std::getenv("CO2_LOCAL_TEST_BANDWIDTH"); text && *text) {
    char* end = nullptr;
    const double value = std::strtod(text, &end);
    if (*end != '\0' || !(value >= 0.0))
      throw std::invalid_argument(std::string("CO2_LOCAL_TEST_BANDWIDTH must be a number of "
                                              "bytes per second >= 0, not '") + text + "'");
    link.bytes_per_second = value;
  }
  if (const char* text = std::getenv("CO2_LOCAL_TEST_LATENCY_US"); text && *text) {
    char* end = nullptr;
    const long long value = std::strtoll(text, &end, 10);
    if (*end != '\0' || value < 0)
      throw std::invalid_argument(std::string("CO2_LOCAL_TEST_LATENCY_US must be a whole number "
                                              "of microseconds >= 0, not '") + text + "'");
    link.latency = std::chrono::microseconds(value);
  }
  return link;
}

std::unique_ptr<PointToPoint> join(const std::string& group_name, int rank, int size,
                                   std::chrono::milliseconds timeout, const LinkModel& link) {
  const std::string label = group_label(group_name);
  if (size < 1 || size > kMaxRanks)
    throw RendezvousError(label + ": world size " + std::to_string(size) +
                          " is out of range: the local transport runs 1.." +
                          std::to_string(kMaxRanks) + " ranks (threads of one process)");
  if (rank < 0 || rank >= size)
    throw RendezvousError(label + ": rank " + std::to_string(rank) + " is out of range for size " +
                          std::to_string(size));

  Registry& reg = registry();
  std::unique_lock<std::mutex> lock(reg.mutex);
  std::shared_ptr<Group>& entry = reg.groups[group_name];
  if (!entry) entry = std::make_shared<Group>(group_name, size);
  std::shared_ptr<Group> group = entry;
  if (group->size != size)
    throw RendezvousError(label + " has size " + std::to_string(group->size) + " but rank " +
                          std::to_string(rank) + " joined with size " + std::to_string(size));
  if (group->joined[size_t(rank)])
    throw RendezvousError(label + ": rank " + std::to_string(rank) + " is already taken" +
                          (group->formed ? " (the group is formed and still in use)" : ""));

  group->joined[size_t(rank)] = true;
  group->members[size_t(rank)]->link = link;
  if (++group->joined_count == size) {
    group->formed = true;
    group->live_members = size;
    reg.changed.notify_all();
  }

  const bool formed =
      reg.changed.wait_for(lock, timeout, [&] { return group->formed; });
  if (!formed) {
    // Withdraw, so that the rank can try again and an abandoned name does not linger.
    const std::string missing = missing_ranks(*group);
    const int joined = group->joined_count;
    group->joined[size_t(rank)] = false;
    if (--group->joined_count == 0) {
      auto found = reg.groups.find(group_name);
      if (found != reg.groups.end() && found->second == group) reg.groups.erase(found);
    }
    throw RendezvousError(label + ": rank " + std::to_string(rank) + " timed out after " +
                          std::to_string(timeout.count()) + " ms waiting for the group to form (" +
                          std::to_string(joined) + " of " + std::to_string(size) +
                          " ranks joined; missing: " + missing + ")");
  }
  return std::make_unique<LocalTransport>(std::move(group), rank);
}

}  // namespace co2::transport::local

#include "runtime/group/local_membership.hpp"

#include <condition_variable>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "runtime/base/log.hpp"
#include "runtime/base/status.hpp"

namespace co2 {

// The door of one running elastic local group: the requests of the threads that ask to join,
// and rank 0's admissions.
struct LocalDoor {
  std::mutex mutex;
  std::condition_variable changed;
  int members = 0;  // LocalMemberships alive; 0: the group ended, the door is closed
  struct Request {
    bool withdrawn = false;  // the asking thread gave up before it was admitted
    bool admitted = false;
    int rank = 0, size = 0;
    uint64_t generation = 0;
    int64_t requests_admitted = 0;  // the members' admitted() after this admission
  };
  std::vector<Request> requests;
  uint64_t decided_generation = 0;  // rank 0's latest admission, and the group's size after it
  int decided_size = 0;
};

namespace {

struct Doors {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<LocalDoor>> by_group;
};

Doors& doors() {
  static Doors* d = new Doors;  // never destroyed: threads may form groups during exit
  return *d;
}

// The door of `group` while the group runs; null otherwise.
std::shared_ptr<LocalDoor> open_door_of(const std::string& group) {
  std::lock_guard<std::mutex> lock(doors().mutex);
  auto found = doors().by_group.find(group);
  if (found == doors().by_group.end()) return nullptr;
  std::shared_ptr<LocalDoor> door = found->second.lock();
  if (!door) return nullptr;
  std::lock_guard<std::mutex> door_lock(door->mutex);
  return door->members > 0 ? door : nullptr;
}

// The door of a group forming now: its first member opens it, the others share it.
std::shared_ptr<LocalDoor> door_of_forming_group(const std::string& group) {
  std::lock_guard<std::mutex> lock(doors().mutex);
  for (auto it = doors().by_group.begin(); it != doors().by_group.end();)  // doors of groups long gone
    it = it->second.expired() && it->first != group ? doors().by_group.erase(it) : std::next(it);
  std::weak_ptr<LocalDoor>& entry = doors().by_group[group];
  std::shared_ptr<LocalDoor> door = entry.lock();
  if (door) {
    std::lock_guard<std::mutex> door_lock(door->mutex);
    if (door->members > 0) return door;  // a member of this formation opened it
  }
  door = std::make_shared<LocalDoor>();  // an ended group's door stays closed for its joiners
  entry = door;
  return door;
}

}  // namespace

LocalMembership::LocalMembership(std::string group, int rank, int size, std::chrono::milliseconds timeout,
                                 transport::local::LinkModel link)
    : LocalMembership(group, door_of_forming_group(group), timeout, link) {
  rank_ = rank;
  size_ = size;
}

LocalMembership::LocalMembership(std::string group, std::shared_ptr<LocalDoor> door, std::chrono::milliseconds timeout,
                                 transport::local::LinkModel link)
    : group_(std::move(group)), door_(std::move(door)), timeout_(timeout), link_(link) {
  std::lock_guard<std::mutex> lock(door_->mutex);
  ++door_->members;
}

LocalMembership::~LocalMembership() {
  std::lock_guard<std::mutex> lock(door_->mutex);
  --door_->members;
  door_->changed.notify_all();  // a thread still waiting to be admitted learns the group ended
}

bool LocalMembership::door_open(const std::string& group) { return open_door_of(group) != nullptr; }

std::pair<std::shared_ptr<LocalMembership>, std::unique_ptr<transport::PointToPoint>> LocalMembership::join(
    const std::string& group, const CommOptions& options, transport::local::LinkModel link) {
  const std::shared_ptr<LocalDoor> door = open_door_of(group);
  require(door != nullptr, Status::Rendezvous, "the elastic local group '" + group + "' is not running: nothing to join");
  std::unique_lock<std::mutex> lock(door->mutex);
  const size_t request = door->requests.size();
  door->requests.emplace_back();
  // The members admit joiners at a boundary, every few steps of theirs.
  const bool answered = door->changed.wait_for(lock, 2 * options.timeout, [&] {
    return door->requests[request].admitted || door->members == 0;
  });
  const LocalDoor::Request decision = door->requests[request];
  if (!decision.admitted) {
    door->requests[request].withdrawn = true;
    fail(Status::Rendezvous, answered ? "the elastic local group '" + group + "' ended before it admitted this thread"
                                      : "the elastic local group '" + group + "' did not admit this thread within " +
                                            std::to_string(2 * options.timeout.count()) +
                                            " ms (its members admit joiners at a boundary while they train)");
  }
  lock.unlock();
  std::shared_ptr<LocalMembership> m(new LocalMembership(group, door, options.timeout, link));
  m->rank_ = decision.rank;
  m->size_ = decision.size;
  m->generation_ = decision.generation;
  m->admitted_ = decision.requests_admitted;
  std::unique_ptr<transport::PointToPoint> transport = m->connect();
  log::info("membership: joined the local group '" + group + "' as rank " + std::to_string(m->rank_) + " of " +
            std::to_string(m->size_));
  return {m, std::move(transport)};
}

GroupTransport LocalMembership::survivors(const std::string& cause) {
  fail(Status::PeerLost, "the group lost a rank (" + cause + "): a group of threads (the local transport) survives "
                         "a rank that leaves with co2_engine_leave, not a lost one; over UCX every loss is survived");
}

int64_t LocalMembership::join_requests() {
  std::lock_guard<std::mutex> lock(door_->mutex);
  return int64_t(door_->requests.size());
}

GroupTransport LocalMembership::admit(int64_t join_requests) {
  const int64_t first = admitted_;
  require(join_requests > first, Status::Internal, "membership: admit() without a new join request");
  admitted_ = join_requests;
  ++generation_;
  std::unique_lock<std::mutex> lock(door_->mutex);
  if (rank_ == 0) {
    // Rank 0 decides: every requester still waiting, in the order they asked.
    int grown = size_;
    std::vector<size_t> admitted;
    for (int64_t i = first; i < join_requests && i < int64_t(door_->requests.size()); ++i) {
      LocalDoor::Request& r = door_->requests[size_t(i)];
      if (r.withdrawn) {
        log::info("membership: join request " + std::to_string(i) + " is not admitted: its thread gave up");
        continue;
      }
      r.admitted = true;
      r.rank = grown++;
      r.generation = generation_;
      r.requests_admitted = join_requests;
      admitted.push_back(size_t(i));
    }
    for (size_t i : admitted) door_->requests[i].size = grown;
    door_->decided_generation = generation_;
    door_->decided_size = grown;
    door_->changed.notify_all();
  } else if (!door_->changed.wait_for(lock, timeout_, [&] { return door_->decided_generation >= generation_; })) {
    fail(Status::PeerTimeout, "membership: rank 0 of the local group '" + group_ + "' did not decide an admission within " +
                                  std::to_string(timeout_.count()) + " ms");
  }
  const int grown = door_->decided_size;
  lock.unlock();
  if (grown == size_) return {};  // everyone who asked gave up meanwhile
  log::info("membership: " + std::to_string(grown - size_) + " thread(s) joined the local group '" + group_ + "'; " +
            std::to_string(grown) + " ranks");
  size_ = grown;
  return connect();
}

GroupTransport LocalMembership::release(int leaving) {
  require(leaving >= 0 && leaving < size_, Status::Internal, "membership: release() of a rank out of range");
  ++generation_;
  if (leaving == rank_) return {};
  if (rank_ > leaving) --rank_;
  --size_;
  log::info("membership: rank " + std::to_string(leaving) + " left the local group; " + std::to_string(size_) +
            " ranks, this one is rank " + std::to_string(rank_));
  return connect();
}

std::unique_ptr<transport::PointToPoint> LocalMembership::connect() const {
  // Every member meets the generation's group in this process, under a name of its own.
  return transport::local::join(group_ + "/generation/" + std::to_string(generation_), rank_, size_, timeout_, link_);
}

}  // namespace co2

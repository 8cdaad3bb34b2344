#include "runtime/group/membership.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

#include "runtime/base/log.hpp"
#include "runtime/base/status.hpp"
#include "runtime/group/addresses.hpp"

namespace co2 {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How often the coordinator looks for arrivals and asks the missing ranks' endpoints.
constexpr milliseconds kSurvivorPoll{20};

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

std::shared_ptr<store::Store> connect_within(store::TcpStoreOptions where, milliseconds timeout) {
  where.timeout = timeout;
  where.server_may_be_late = false;  // every endpoint was up at formation: refused means gone
  return store::connect_tcp_store(where);
}

// Each rank records at its own endpoint the last generation it agreed on, so that a rank that
// was stopped while the others re-formed cannot start a second group when it resumes.
constexpr const char* kAgreedKey = "co2/elastic/agreed";

// The generation the rank behind `store` last agreed on (0: none), or -1 when it does not answer
// within the store's deadline.
int64_t agreed_generation(store::Store& store) {
  try {
    return store.add(kAgreedKey, 0);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

std::shared_ptr<Membership> Membership::publish(store::Store& store, const std::string& prefix, int rank, int size,
                                                int min_ranks, milliseconds timeout) {
  std::shared_ptr<Membership> m(new Membership);
  const std::string token = random_hex(16);
  m->server_ = store::TcpStoreServer::start("", 0, token);
  m->rank_ = rank;
  m->min_ranks_ = min_ranks;
  m->timeout_ = timeout;
  store.set(prefix + "endpoint/" + std::to_string(rank),
            advertised_host() + " " + std::to_string(m->server_->port()) + " " + token);
  for (int peer = 0; peer < size; ++peer) {
    std::stringstream in(store.get(prefix + "endpoint/" + std::to_string(peer), timeout));
    store::TcpStoreOptions where;
    in >> where.host >> where.port >> where.auth_token;
    m->endpoints_.push_back(where);
  }
  return m;
}

Membership::~Membership() = default;

std::shared_ptr<store::Store> Membership::coordinator_store(int* coordinator) const {
  const milliseconds probe = std::min(timeout_, kMembershipProbeTimeout);
  for (int candidate = 0; candidate < size(); ++candidate) {
    // Our own endpoint answers unless this process is broken; its deadline is the long one.
    if (candidate == rank_) {
      *coordinator = candidate;
      return connect_within(endpoints_[size_t(candidate)], timeout_);
    }
    try {
      std::shared_ptr<store::Store> found = connect_within(endpoints_[size_t(candidate)], probe);
      if (agreed_generation(*found) < 0) continue;
      *coordinator = candidate;
      return connect_within(endpoints_[size_t(candidate)], timeout_);
    } catch (const std::exception&) {
      continue;  // gone (refused) or stopped (no answer): the next rank coordinates
    }
  }
  fail(Status::Internal, "membership: no endpoint answered, not even this rank's own");
}

std::vector<int> Membership::wait_for_survivors(store::Store& store, const std::string& prefix) const {
  enum class Seen { Unknown, Arrived, Gone };
  const milliseconds probe = std::min(timeout_, kMembershipProbeTimeout);
  std::vector<Seen> seen(static_cast<size_t>(size()), Seen::Unknown);
  std::vector<std::shared_ptr<store::Store>> probes(static_cast<size_t>(size()));
  // A rank that answers meets the failure within its own no-progress timeout (sooner when a
  // peer's abort reaches it); the time spent probing ranks that do not answer is not counted.
  Clock::time_point deadline = Clock::now() + timeout_ + probe;
  for (;;) {
    bool waiting = false;
    for (int r = 0; r < size(); ++r) {
      Seen& state = seen[size_t(r)];
      if (state != Seen::Unknown) continue;
      if (store.add(prefix + "arrived/" + std::to_string(r), 0) > 0) {
        state = Seen::Arrived;
        continue;
      }
      int64_t generation = -1;
      const Clock::time_point probe_started = Clock::now();
      try {
        if (!probes[size_t(r)]) probes[size_t(r)] = connect_within(endpoints_[size_t(r)], probe);
        generation = agreed_generation(*probes[size_t(r)]);
      } catch (const std::exception&) {
      }
      if (generation >= int64_t(generation_))
        fail(Status::PeerLost, "rank " + std::to_string(rank_) + " was left out of the group: rank " +
                                   std::to_string(r) + " already agreed on generation " + std::to_string(generation) +
                                   " without it (this rank stopped answering while the others re-formed)");
      if (generation >= 0) {
        waiting = true;  // alive, not here yet: its training thread has not seen the failure
        continue;
      }
      state = Seen::Gone;
      deadline += Clock::now() - probe_started;
      log::info("membership: rank " + std::to_string(r) + " does not answer: left out of the group");
    }
    if (!waiting) break;
    if (Clock::now() >= deadline) {
      for (int r = 0; r < size(); ++r)
        if (seen[size_t(r)] == Seen::Unknown) {
          seen[size_t(r)] = Seen::Gone;
          log::warn("membership: rank " + std::to_string(r) + " is alive but did not arrive within " +
                    std::to_string(timeout_.count()) + " ms: left out of the group");
        }
      break;
    }
    std::this_thread::sleep_for(kSurvivorPoll);
  }
  std::vector<int> members;
  for (int r = 0; r < size(); ++r)
    if (seen[size_t(r)] == Seen::Arrived) members.push_back(r);
  return members;
}

Membership::Agreed Membership::agree(const std::string& cause) {
  ++generation_;
  // A coordinator that dies while the others wait at its endpoint: agree again with the next
  // rank that answers. The coordinator's rank is part of the keys, so every survivor meets the
  // others at the same keys whether or not it saw the first coordinator.
  for (int attempt = 1;; ++attempt) {
    try {
      return agree_once(cause);
    } catch (const transport::RendezvousError& e) {
      if (attempt >= size())
        fail(Status::PeerLost, "the group lost a rank (" + cause + ") and the survivors could not agree on a new "
                               "group: " + e.what());
      log::warn("membership: the coordinator of generation " + std::to_string(generation_) +
                " went away during the agreement (" + e.what() + "); agreeing again");
    }
  }
}

Membership::Agreed Membership::agree_once(const std::string& cause) {
  int coordinator = 0;
  std::shared_ptr<store::Store> store = coordinator_store(&coordinator);
  const std::string prefix =
      "co2/elastic/" + std::to_string(generation_) + "/" + std::to_string(coordinator) + "/";
  log::info("membership: rank " + std::to_string(rank_) + " of " + std::to_string(size()) + " lost a peer (" + cause +
            "); rank " + std::to_string(coordinator) + " coordinates generation " + std::to_string(generation_));
  store->add(prefix + "arrived/" + std::to_string(rank_), 1);
  if (coordinator == rank_) {
    const std::vector<int> survivors = wait_for_survivors(*store, prefix);
    store->set(prefix + "members", int(survivors.size()) >= min_ranks_ ? ranks_text(survivors)
                                                                        : "!" + ranks_text(survivors));
  }
  // The coordinator may meet the failure up to a timeout after this rank did, and then waits up
  // to a timeout for ranks that answer but have not arrived.
  const std::string members_text = store->get(prefix + "members", 2 * timeout_ + kMembershipProbeTimeout);
  const bool too_few = !members_text.empty() && members_text[0] == '!';
  const std::vector<int> members = parse_ranks(too_few ? members_text.substr(1) : members_text);
  if (too_few)
    fail(Status::PeerLost, "the group lost a rank (" + cause + ") and only " + std::to_string(members.size()) +
                               " of " + std::to_string(size()) + " ranks remain (" + ranks_text(members) +
                               "), fewer than elastic_min_ranks = " + std::to_string(min_ranks_));
  const auto me = std::find(members.begin(), members.end(), rank_);
  if (me == members.end())
    fail(Status::PeerLost, "rank " + std::to_string(rank_) + " was left out of the re-formed group (members " +
                               ranks_text(members) + " of the old ranks): it arrived after the survivors agreed, "
                               "or its membership endpoint did not answer in time; first failure: " + cause);
  const std::shared_ptr<store::Store> own = connect_within(endpoints_[size_t(rank_)], timeout_);
  own->add(kAgreedKey, int64_t(generation_) - own->add(kAgreedKey, 0));
  Agreed agreed;
  agreed.rank = int(me - members.begin());
  agreed.size = int(members.size());
  agreed.previous = members;
  agreed.store = store;
  agreed.prefix = prefix;
  std::vector<store::TcpStoreOptions> kept;
  for (int r : members) kept.push_back(endpoints_[size_t(r)]);
  endpoints_ = std::move(kept);
  rank_ = agreed.rank;
  log::info("membership: generation " + std::to_string(generation_) + " has " + std::to_string(agreed.size) +
            " ranks (old ranks " + ranks_text(members) + "); this one is rank " + std::to_string(agreed.rank));
  return agreed;
}

}  // namespace co2

// Elastic membership (docs/architecture.md, "Membership"): how the ranks of a group that lost
// some of its members agree on who is left, without the launcher's store (it lived in rank 0,
// and only while the group formed).
//
// At formation every rank starts a small store server of its own (its "membership endpoint")
// and the ranks exchange the endpoints' addresses. After a failure each survivor asks the
// endpoints in rank order and takes the first that answers as the coordinator's. The coordinator
// waits until every rank of the old group has either arrived at its endpoint or stopped
// answering at its own, then writes the new membership there: the arrived ranks, in their old
// order. A rank whose endpoint answers is alive (its server thread runs even while its training
// thread computes), so the coordinator waits for it; a killed process refuses the connection, a
// stopped one does not answer within kMembershipProbeTimeout. The survivors then connect a new
// transport through the coordinator's endpoint. Every survivor reads the same list, so ranks
// never train in two groups: a survivor that the list leaves out fails.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rendezvous/store.hpp"
#include "rendezvous/tcp_store.hpp"

namespace co2 {

// How long a rank's membership endpoint may take to answer before the rank counts as gone.
constexpr std::chrono::milliseconds kMembershipProbeTimeout{2000};

class Membership {
 public:
  // Collective over the ranks forming a group at `store` (keys under `prefix`): starts this
  // rank's endpoint and learns every rank's. `min_ranks`: the fewest ranks a re-formed group may
  // have. `timeout`: the longest the survivors wait for each other.
  static std::shared_ptr<Membership> publish(store::Store& store, const std::string& prefix, int rank, int size,
                                             int min_ranks, std::chrono::milliseconds timeout);
  ~Membership();

  struct Agreed {
    int rank = 0;                    // this rank in the new group
    int size = 0;
    std::vector<int> previous;       // the members, by their rank in the group before
    std::shared_ptr<store::Store> store;  // the coordinator's endpoint, where the new transport meets
    std::string prefix;              // this generation's keys there
  };
  // After a failure (`cause`, for messages): agrees with the survivors on the new group. Throws
  // Error(PeerLost) when this rank was left out or fewer than min_ranks remain.
  Agreed agree(const std::string& cause);

  int rank() const { return rank_; }
  int size() const { return int(endpoints_.size()); }
  uint64_t generation() const { return generation_; }

 private:
  Membership() = default;
  // One try of agree() with the lowest rank that answers as the coordinator.
  Agreed agree_once(const std::string& cause);
  // The endpoint of the lowest rank that answers (this rank's own at the latest).
  std::shared_ptr<store::Store> coordinator_store(int* coordinator) const;
  // The coordinator's part: the old ranks that arrived, once every other one stopped answering.
  std::vector<int> wait_for_survivors(store::Store& store, const std::string& prefix) const;

  std::unique_ptr<store::TcpStoreServer> server_;
  std::vector<store::TcpStoreOptions> endpoints_;  // every member's, by rank
  int rank_ = 0;
  int min_ranks_ = 1;
  std::chrono::milliseconds timeout_{0};
  uint64_t generation_ = 0;
};

}  // namespace co2

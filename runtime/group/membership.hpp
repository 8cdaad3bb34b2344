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
//
// Heartbeat: a stopped rank's kernel still accepts connections, so only the probe's deadline
// tells it from a live one, and the survivors meet the failure only at their no-progress timeout:
// probing then would cost the timeout plus the probe. So while the group trains, each rank's
// watcher thread asks its ring successor's endpoint (rank + 1 mod size, re-pointed at every change
// of membership) a question every kHeartbeatInterval and keeps how long a question of its has gone
// unanswered, in memory and at its own endpoint. A survivor reports that silence of its successor
// when it arrives at the coordinator, and the coordinator counts it toward the probe's deadline:
// a rank its predecessor saw silent for kMembershipProbeTimeout is gone without a probe, one seen
// silent for less is asked once for the rest (until the report is in, the coordinator counts the
// silence the predecessor keeps at its endpoint, and a short question only tells an answer or a
// refusal from silence unless it covers the rest). Looking for the coordinator, a survivor counts
// the same silence: its own watcher's for its successor, and for rank 0 the one rank 0's
// predecessor keeps at its endpoint (read again between short questions: it is as old as the
// watcher's last question, which it keeps at the probe's mark too). The rule stays "no answer for kMembershipProbeTimeout", only timed from the
// stop rather than from the failure; a live endpoint answers within milliseconds, so the heartbeat
// does not make a live rank gone. One watched peer per rank: the cost does not grow with the
// group. Two stopped neighbours: the second is watched by nobody alive and is probed as before.
//
// The heartbeat also fails the group: once the successor has left its questions unanswered for
// the communicator's timeout (CommOptions::timeout: the no-progress timeout's meaning, counted
// from the first question it left unanswered rather than from the start of the collective that
// then waits for it), the watcher fails the communicator with PeerTimeout ("rank R has not
// answered its membership endpoint for N ms"); its abort tells the peers at once, and the
// agreement finds that silence reported (a full probe: no question). The communicator hands
// over how to fail it (MembershipChanges::report_failures_to) and takes it back before it goes.
// Never while the membership changes (agreement, admission, leave: held until the watcher is
// re-pointed), nor for a refusal (a process gone or leaving: its transport says so itself), nor
// for a rank that is only slow (its endpoint's thread answers while its training thread
// computes), nor for this process's own pause (a question that came back far past its deadline
// counts the silence afresh: a stopped rank that resumes does not blame its successor).
//
// Joining: the store a launched group formed at (at MASTER_PORT) stays up as the group's *door*:
// under co2run --elastic the launcher serves it for the whole job, so it outlives any rank;
// otherwise rank 0 serves it and it closes with rank 0's process. A process that finds it open
// there asks to join (its endpoint under co2/elastic/door/join/<n>). The group's rank 0 of the
// moment (after a loss of rank 0, the lowest survivor) counts the requests at every boundary;
// the members agree on the count with the tau advisor's agreement, and at the boundary where it
// arrives every member admits the same joiners: rank 0 writes the new member list and each
// joiner's rank at the door, and the members and the joiners connect a new transport there.
//
// Leaving (co2_engine_leave): the ranks agree on who goes with the same agreement; every member
// then knows the new list without asking anyone, and the others connect a new transport at the
// endpoint of the lowest rank that stays. The leaving process closes its endpoint (a later
// agreement finds it gone at once) and, where it serves the door, the door.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/store.hpp"
#include "rendezvous/tcp_store.hpp"
#include "runtime/comm/comm.hpp"

namespace co2 {

// How long a rank's membership endpoint may take to answer before the rank counts as gone.
constexpr std::chrono::milliseconds kMembershipProbeTimeout{2000};
// How often a rank's watcher asks its ring successor's endpoint whether it is there: the silence
// it reports after a failure is short of the truth by at most this much.
constexpr std::chrono::milliseconds kHeartbeatInterval{250};
// How long one heartbeat question (and the connection it may need first) waits for its answer;
// it bounds how long the watcher thread keeps the Membership's destructor waiting. A question not
// answered by then stays unanswered: the silence grows until an answer comes.
constexpr std::chrono::milliseconds kHeartbeatDeadline{250};
// How long a short question to a missing rank's endpoint waits, asked while the silence its ring
// predecessor saw is not known yet: it tells a refusal (gone) or an answer (alive) from silence,
// and counts nothing toward the probe (which then asks once for what the heartbeat did not see).
// Also the deadline for reading that silence at the predecessor's endpoint. Short: a silent
// answer decides nothing by itself (a live rank that answers late is asked again, for the whole
// rest of the probe, once the report is in), while every question to a stopped rank holds up the
// coordinator, or a survivor looking for one, for all of it. A live endpoint answers within a
// few milliseconds even on a loaded machine (its own thread, three round trips).
constexpr std::chrono::milliseconds kProbeSlice{50};
// How long the successor must have left the heartbeat unanswered before a failed transport's
// abort stops waiting for it to hear of the abort (four intervals; a live endpoint answers within
// milliseconds, and a stopped one never hears it).
constexpr std::chrono::milliseconds kUnresponsiveSilence{1000};

class SuccessorWatch;

// Forms the transport of a changed group: every member (and joiner) calls it with the same store
// and prefix, its rank and the group's size. Chosen with the group's transport when the group
// forms (runtime/group/group.cpp): UCX, or NCCL on this process's CUDA device, so that the
// membership knows no transport.
using ConnectGroup =
    std::function<GroupTransport(store::Store& store, const std::string& prefix, int rank, int size)>;

// Where a launched group's door is: the address of the store it formed at, and, in the process
// that serves it, the server itself (kept up as long as the membership lives).
struct Door {
  store::TcpStoreOptions where;
  std::shared_ptr<store::TcpStoreServer> served_here;  // null in every other process
  // The launcher serves it (co2run --elastic): it stays open whichever rank goes, and whoever is
  // rank 0 keeps it. Otherwise only the process that serves it does, and it closes with it.
  bool served_by_launcher = false;
};

class Membership final : public MembershipChanges {
 public:
  // Collective over the ranks forming a group at `store` (keys under `prefix`): starts this
  // rank's endpoint and learns every rank's; rank 0 opens the door. `options.elastic_min_ranks`:
  // the fewest ranks a re-formed group may have; `options.timeout`: the longest the ranks wait
  // for each other.
  static std::shared_ptr<Membership> publish(store::Store& store, const std::string& prefix, int rank, int size,
                                             const CommOptions& options, Door door, ConnectGroup connect);
  // Whether a running elastic group's door is open at `door` (then a new process joins).
  static bool door_open(store::Store& door);
  // A new process: asks to join the group behind `door` and waits (up to options.timeout) until
  // the members admit it. Returns its membership and its transport to the grown group, formed by
  // `connect` (the kind the group runs over).
  static std::pair<std::shared_ptr<Membership>, GroupTransport> join(const store::TcpStoreOptions& door,
                                                                     const CommOptions& options, ConnectGroup connect);
  ~Membership() override;

  // MembershipChanges
  GroupTransport survivors(const std::string& cause) override;
  std::vector<int> previous_ranks() const override { return previous_; }
  int64_t join_requests() override;
  int64_t admitted() const override { return admitted_; }
  GroupTransport admit(int64_t join_requests) override;
  GroupTransport release(int leaving) override;
  std::vector<int> unresponsive() const override;
  void report_failures_to(FailureSink fail) override;

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
  // How long rank `watcher`'s heartbeat last saw the endpoint at `watched` silent, as it keeps it
  // at its endpoint (nothing when it does not answer within kProbeSlice).
  std::optional<std::chrono::milliseconds> kept_silence(int watcher, const store::TcpStoreOptions& watched) const;

  // Starts this process's endpoint and its watcher; the endpoint's address as the members
  // exchange it.
  std::string start_endpoint();
  // Points the watcher at this rank's ring successor in the current membership.
  void watch_successor();
  // Records at this rank's own endpoint that it agreed on the current generation.
  void record_generation();
  // The transport of the group agreed at `store` under `prefix`.
  GroupTransport connect(store::Store& store, const std::string& prefix) const;

  std::unique_ptr<store::TcpStoreServer> server_;
  ConnectGroup connect_group_;
  std::vector<store::TcpStoreOptions> endpoints_;  // every member's, by rank
  int rank_ = 0;
  int min_ranks_ = 1;
  std::chrono::milliseconds timeout_{0};
  uint64_t generation_ = 0;
  int64_t admitted_ = 0;  // join requests admitted so far (the door's count, on every member)
  std::vector<int> previous_;  // after survivors(): each member's rank in the group before
  // The door's client of the rank that keeps it (the serving process, or, where the launcher
  // serves it, rank 0 of the moment: connected when this rank becomes rank 0).
  std::shared_ptr<store::Store> door_keeper();
  Door door_;
  std::shared_ptr<store::Store> door_store_;
  bool door_unreachable_ = false;  // said once: a keeper that cannot reach the door admits nobody
  std::unique_ptr<SuccessorWatch> watch_;  // last: its thread stops before the rest goes
};

}  // namespace co2

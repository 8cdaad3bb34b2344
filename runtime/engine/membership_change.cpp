// Elastic membership, the engine's part (docs/algorithm.md, "Losing a rank" and "Joining"): after
// a lost peer failed a call, the survivors re-form the communicator (runtime/group/membership.hpp)
// and restart the round from one agreed outer state; when processes ask to join, the members
// synchronize at an agreed boundary, grow the communicator and hand the joiners the same state.
//
// What the survivors agree on: the donor is the rank that applied the most outer updates (the
// lowest such rank), since a rank may have applied the average of a round whose all-reduce
// finished on it just before another rank saw the failure; everyone takes its anchor, momentum
// and gap history bit for bit (the replicated checkpoint, broadcast), and its step and round
// counts. The average in flight is dropped on every rank: the all-reduce that failed cannot be
// completed without the lost rank's delta, and one that completed on some ranks only would give
// different anchors. Each rank's parameters become the anchor, so the round that was under way
// (its local steps) is dropped too. With the new W the average's divisor, an automatic beta,
// the eager share and the wire's layout are the commit's, as for a group formed at that size.
#include <cstring>
#include <string>
#include <vector>

#include "runtime/base/log.hpp"
#include "runtime/engine/engine_state.hpp"

namespace co2 {
namespace {

// Collective over the new communicator: `blob` of rank `root` on every rank.
std::vector<char> broadcast_blob(Engine::State& s, int root, std::vector<char> blob) {
  int64_t size = int64_t(blob.size());
  auto sized = s.comm->broadcast(&size, 1, DataType::I64, root, s.id(Purpose::Membership));
  if (sized->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  // Whole 32-bit words travel; the blob is cut back to its size after.
  std::vector<int32_t> words((size_t(size) + 3) / 4, 0);
  if (s.comm->rank() == root) std::memcpy(words.data(), blob.data(), blob.size());
  auto sent = s.comm->broadcast(words.data(), words.size(), DataType::I32, root, s.id(Purpose::Membership));
  if (sent->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
  blob.resize(size_t(size));
  std::memcpy(blob.data(), words.data(), blob.size());
  return blob;
}

// On a freshly re-formed group: one outer state on every rank. Returns the donor's new rank.
// Throws when the new group fails too (another rank lost meanwhile); the outer state and its
// counters then still belong together, so the next try starts from a consistent state.
int restart_from_donor(Engine::State& s) {
  s.pending.reset();
  s.average_ready = false;
  s.prepared = PreparedUpdate{};
  s.arrival = ArrivalAgreement{};

  // The donor: most outer updates applied, then the lowest rank.
  const std::vector<int64_t> counts = gathered_from_every_rank(
      s, *s.comm, s.id(Purpose::Membership),
      {int64_t(s.stats.outer_updates), int64_t(s.stats.steps), int64_t(s.stats.rounds)});
  int donor = 0;
  for (int r = 1; r < s.comm->size(); ++r)
    if (counts[size_t(3 * r)] > counts[size_t(3 * donor)]) donor = r;
  std::vector<char> blob;
  if (s.comm->rank() == donor && s.has_anchor()) blob = outer_state_blob(s);

  // A fresh backend over the new group: commit's agreements, sizes and rank 0's parameters.
  s.backend = make_host_backend(s);
  s.committed = false;
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;
  commit_layout(s);
  if (s.has_anchor()) {
    load_outer_state_blob(s, broadcast_blob(s, donor, std::move(blob)));
    // The donor's own per-rank state belongs to the dropped round: every rank starts from the anchor.
    for (FloatBuffer* own : {&s.eager_offset, &s.residual})
      if (!own->empty()) std::memset(own->data(), 0, own->size() * sizeof(float));
    s.backend->set_parameters_to_anchor();
  }
  s.stats.outer_updates = uint64_t(counts[size_t(3 * donor)]);
  s.stats.steps = uint64_t(counts[size_t(3 * donor + 1)]);
  s.stats.rounds = uint64_t(counts[size_t(3 * donor + 2)]);
  s.stats.world_size = s.comm->size();
  s.stats.resolved_outer_momentum = s.beta;
  check_anchor(s);
  return donor;
}

}  // namespace

void continue_with_survivors(Engine::State& s, const std::string& cause) {
  const int old_rank = s.comm->rank();
  const int old_size = s.comm->size();
  // A rank lost while the survivors re-form fails the new group as well: re-form again, as long
  // as the membership allows (it fails with PEER_LOST once too few remain).
  int donor = 0;
  for (;;) {
    s.backend->drain();
    // The old collectives are finished (failed) and their transport goes. Throws PEER_LOST when
    // this rank was left out or too few remain: that is final.
    s.comm->reform();
    try {
      donor = restart_from_donor(s);
      break;
    } catch (const Error& e) {
      if (!s.comm->can_reform()) throw;
      log::warn(std::string("membership: the group failed again while it re-formed: ") + e.what());
    }
  }
  log::warn("membership: rank " + std::to_string(old_rank) + " of " + std::to_string(old_size) + " goes on as rank " +
            std::to_string(s.comm->rank()) + " of " + std::to_string(s.comm->size()) + " from step " +
            std::to_string(s.stats.steps) + " (the outer state of rank " + std::to_string(donor) +
            " of the new group; the round in flight was dropped) after: " + cause);
}

bool joiners_agreed(const Engine::State& s) {
  return s.comm->elastic() && s.observer.agreed_join_requests > s.comm->admitted();
}

int admit_joiners(Engine::State& s) {
  const int old_size = s.comm->size();
  // Every member finishes the round in flight and applies it: the joiners then receive a state
  // with no average in flight and every member's parameters equal to the anchor.
  synchronize_ranks(s, /*finalizing=*/false);
  s.backend->drain();
  try {
    s.comm->admit(s.observer.agreed_join_requests);
  } catch (const std::exception& e) {
    // A joiner that died or never connected: the members go on without it, as after a loss.
    s.comm->fail_with(Status::PeerLost, std::string("admitting the joining processes failed: ") + e.what());
    fail(Status::PeerLost, s.comm->error_message());
  }
  const int joined = s.comm->size() - old_size;
  if (joined == 0) return 0;  // the processes that asked were gone: the group is as it was
  restart_from_donor(s);
  log::info("membership: rank " + std::to_string(s.comm->rank()) + " goes on in a group of " +
            std::to_string(s.comm->size()) + " after " + std::to_string(joined) + " process(es) joined, from step " +
            std::to_string(s.stats.steps));
  return joined;
}

void join_running_group(Engine::State& s) {
  // The members run restart_from_donor at the boundary that admitted this process; here it is
  // this engine's commit.
  restart_from_donor(s);
  s.comm->set_joining(false);
  log::info("membership: rank " + std::to_string(s.comm->rank()) + " of " + std::to_string(s.comm->size()) +
            " joined the running group at step " + std::to_string(s.stats.steps) +
            " with its outer state (parameters = its anchor)");
}

}  // namespace co2

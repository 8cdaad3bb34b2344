// Elastic membership, the engine's part (docs/algorithm.md, "Losing a rank" and "Joining"): after
// a lost peer failed a call, the survivors re-form the communicator (runtime/group/membership.hpp)
// and restart the round from one agreed outer state; when processes ask to join, the members
// synchronize at an agreed boundary, grow the communicator and hand the joiners the same state.
//
// What the survivors agree on: the donor is the rank that applied the most outer updates (the
// lowest such rank), since a rank may have applied the average of a round whose all-reduce
// finished on it just before another rank saw the failure; everyone takes its anchor, momentum
// and gap history bit for bit (broadcast in place), and its step and round counts. The average
// in flight is dropped on every rank: the all-reduce that failed cannot be completed without the
// lost rank's delta, and one that completed on some ranks only would give different anchors.
// Each rank's parameters become the anchor, so the round that was under way (its local steps) is
// dropped too. With the new W the average's divisor, an automatic beta, the eager share and the
// wire's layout are the commit's, as for a group formed at that size.
//
// Where the state lives does not change the steps: a device backend stages its outer state out to
// the host buffers first (Backend::stage_out) and in after; outer state sharded over the ranks is
// first assembled whole on every rank from each shard's holder (Backend::assemble_outer_state, a
// lost shard rebuilt from the ranks' parameters), so that all ranks then hold the same state and
// only the donor's counters travel.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "runtime/base/log.hpp"
#include "runtime/engine/arrival.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/engine/observe.hpp"

namespace co2 {
namespace {

// 0, 1, ..., size - 1: where every rank of a group is when the group keeps its order.
std::vector<int> same_ranks(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// Collective over the new communicator: `buffer` of rank `root` on every rank.
void broadcast_from(Engine::State& s, int root, void* buffer, size_t count, DataType dtype) {
  auto request = s.comm->broadcast(buffer, count, dtype, root, s.id(Purpose::Membership));
  if (request->wait_status() != Status::Ok) fail(s.comm->error_status(), s.comm->error_message());
}

// The outer state as it stood before the new group's commit replaced the buffers. The donor sends
// its anchor and momentum from here; on every rank it goes back into the engine when the new
// group fails before the transfer completed, so that the next try starts from it.
struct OuterStateBefore {
  Engine::State& s;
  FloatBuffer anchor, momentum;
  std::vector<GapHistory> history;
  uint32_t round_tau, steps_in_round;
  bool transferred = false;

  explicit OuterStateBefore(Engine::State& state)
      : s(state),
        anchor(std::move(state.anchor)),
        momentum(std::move(state.momentum)),
        history(state.history),
        round_tau(state.round_tau),
        steps_in_round(state.steps_in_round) {}
  ~OuterStateBefore() {
    if (transferred) return;
    s.anchor = std::move(anchor);
    s.momentum = std::move(momentum);
    s.history = std::move(history);
    s.round_tau = round_tau;
    s.steps_in_round = steps_in_round;
  }
};

// After the new group's commit: the donor's anchor, momentum, gap history and round position on
// every rank, sent where they live (no checkpoint blob: nothing is serialised or copied twice).
// Every rank's per-rank state (eager offsets and momentum, the residual) is the commit's zeros:
// the round it belonged to was dropped, or (a join) averaged in by the synchronize before.
// `assembled`: every rank holds the same whole state already (sharded: assemble_outer_state), so
// only the donor's counters and history travel.
void take_outer_state(Engine::State& s, int donor, OuterStateBefore& before, bool assembled) {
  const bool is_donor = s.comm->rank() == donor;
  // Round position, whether the donor has momentum, and per segment its gap history.
  std::vector<int64_t> small(3 + 3 * s.segments.size(), 0);
  if (is_donor) {
    // A joiner has no outer state yet; it is never the donor (it applied no update).
    require(before.anchor.size() == s.state_count && before.history.size() == s.segments.size(), Status::Internal,
            "membership: the donor has no outer state of this layout");
    small[0] = before.round_tau;
    small[1] = before.steps_in_round;
    small[2] = before.momentum.empty() ? 0 : 1;
    for (size_t i = 0; i < s.segments.size(); ++i) {
      std::memcpy(&small[3 + 3 * i], &before.history[i].last_step_norm, sizeof(int64_t));
      std::memcpy(&small[4 + 3 * i], &before.history[i].gap_sum, sizeof(int64_t));
      small[5 + 3 * i] = int64_t(before.history[i].updates);
    }
  }
  broadcast_from(s, donor, small.data(), small.size(), DataType::I64);
  const bool has_momentum = small[2] != 0;
  // The donor sends from its own buffers and keeps them. The others receive the anchor into the
  // comm buffer (the commit kept its pages) and give the comm buffer the old anchor's, so that no
  // rank but a joiner maps fresh memory; the old buffers stay untouched until all has arrived.
  FloatBuffer momentum;
  if (assembled) {
    s.anchor = std::move(before.anchor);
    momentum = std::move(before.momentum);
  } else if (is_donor) {
    broadcast_from(s, donor, before.anchor.data(), s.state_count, DataType::F32);
    if (has_momentum) broadcast_from(s, donor, before.momentum.data(), s.state_count, DataType::F32);
    s.anchor = std::move(before.anchor);
    momentum = std::move(before.momentum);
  } else {
    if (s.comm_buffer.size() != s.state_count) s.comm_buffer = FloatBuffer(s.state_count);  // a device backend's
    broadcast_from(s, donor, s.comm_buffer.data(), s.state_count, DataType::F32);
    if (has_momentum) {
      momentum = FloatBuffer(s.state_count);
      broadcast_from(s, donor, momentum.data(), s.state_count, DataType::F32);
    }
    s.anchor = std::move(s.comm_buffer);
    s.comm_buffer = std::move(before.anchor);
    s.comm_buffer.reset(s.state_count);  // zeroed (a joiner had no anchor: allocated)
  }
  before.transferred = true;
  // The donor's momentum where it had one (beta 0 at the new W keeps it, as a checkpoint does);
  // zeros where the new W needs one and the donor had none.
  if (has_momentum) s.momentum = std::move(momentum);
  else s.momentum = FloatBuffer(s.momentum_needed() ? s.state_count : 0);
  s.round_tau = uint32_t(small[0]);
  s.steps_in_round = uint32_t(small[1]);
  for (size_t i = 0; i < s.segments.size(); ++i) {
    std::memcpy(&s.history[i].last_step_norm, &small[3 + 3 * i], sizeof(double));
    std::memcpy(&s.history[i].gap_sum, &small[4 + 3 * i], sizeof(double));
    s.history[i].updates = uint64_t(small[5 + 3 * i]);
  }
  s.prepared.settings = outer_settings_of(s);
  begin_arrival_round(s);
  s.backend->stage_in();  // parameters = anchor (the eager offsets are zero)
}

// This rank's outer state in the host buffers the hand-over reads (a device backend copies it
// there once), and the statistics of every boundary it finished, by which the donor is chosen.
// A joiner has none yet; sharded outer state is assembled from every rank's shard instead.
void stage_outer_state_out(Engine::State& s) {
  if (s.outer_state_staged || !s.committed || s.sharded()) return;
  s.backend->stage_out();
  count_finished_work(s, /*wait=*/true);
  s.outer_state_staged = true;
}

// On a freshly re-formed group: one outer state on every rank. Returns the donor's new rank.
// Throws when the new group fails too (another rank lost meanwhile); the outer state and its
// counters then still belong together, so the next try starts from a consistent state.
// holders: sharded outer state, for every rank of the group before, its rank now (-1: lost); see
// Backend::assemble_outer_state.
int restart_from_donor(Engine::State& s, const std::vector<int>& holders = {}) {
  stage_outer_state_out(s);
  s.pending.reset();
  s.average_ready = false;
  s.prepared = PreparedUpdate{};
  s.arrival = ArrivalAgreement{};
  forget_agreements(s);

  // The donor: most outer updates applied, then the lowest rank.
  const std::vector<int64_t> counts = gathered_from_every_rank(
      s, *s.comm, s.id(Purpose::Membership),
      {int64_t(s.stats.outer_updates), int64_t(s.stats.steps), int64_t(s.stats.rounds)});
  int donor = 0;
  for (int r = 1; r < s.comm->size(); ++r)
    if (counts[size_t(3 * r)] > counts[size_t(3 * donor)]) donor = r;

  // The backend committed again over the new group: commit's agreements and sizes (and, without
  // an anchor to take from the donor, rank 0's parameters). Every rank's own state (the eager
  // offsets and their momentum) starts from the commit's zeros (the host backend's stage_in relies
  // on it: it does not read them while the outer state follows the commit).
  OuterStateBefore before(s);
  s.eager_offset = FloatBuffer();
  s.eager_momentum = FloatBuffer();
  s.backend->begin_new_group();
  s.committed = false;
  s.steps_in_round = 0;
  s.round_tau = s.config.tau;
  s.outer_state_follows = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{s.outer_state_follows};
  commit_layout(s);
  const bool assembled = s.sharded() && s.has_anchor();
  if (assembled && !s.outer_state_staged) {
    s.backend->assemble_outer_state(holders);
    s.outer_state_staged = true;
    before.anchor = std::move(s.anchor);
    before.momentum = std::move(s.momentum);
  }
  if (s.has_anchor()) take_outer_state(s, donor, before, assembled);
  s.backend->release_staged();  // a device backend's host copies
  s.outer_state_staged = false;
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
  // Sharded outer state: where each rank of the group before is now (-1: lost), across retries.
  std::vector<int> holders = same_ranks(old_size);
  for (;;) {
    s.backend->drain();
    // The old collectives are finished (failed) and their transport goes. Throws PEER_LOST when
    // this rank was left out or too few remain: that is final.
    s.comm->reform();
    const std::vector<int> previous = s.comm->previous_ranks();
    for (int& now : holders) {
      const auto found = std::find(previous.begin(), previous.end(), now);
      now = now < 0 || found == previous.end() ? -1 : int(found - previous.begin());
    }
    try {
      donor = restart_from_donor(s, holders);
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
  restart_from_donor(s, same_ranks(old_size));  // the members keep their ranks; joiners come after
  log::info("membership: rank " + std::to_string(s.comm->rank()) + " goes on in a group of " +
            std::to_string(s.comm->size()) + " after " + std::to_string(joined) + " process(es) joined, from step " +
            std::to_string(s.stats.steps));
  return joined;
}

bool leave_agreed(const Engine::State& s) { return s.comm->elastic() && s.observer.agreed_leaver > 0; }

void release_leaver(Engine::State& s) {
  // As for a join: every rank finishes the round in flight and averages in the steps since, so
  // the leaving rank's work is in the anchor and nobody's steps are dropped.
  synchronize_ranks(s, /*finalizing=*/false);
  s.backend->drain();
  // Read after the synchronize: it adopted every agreement in flight, and the highest rank that
  // asked is the one let go now.
  const int leaver = int(s.observer.agreed_leaver - 1);
  const int old_rank = s.comm->rank();
  const int old_size = s.comm->size();
  if (s.sharded() && s.has_anchor()) {
    // The leaver's shard goes with it: every rank takes the whole state first, over the old group.
    s.backend->assemble_outer_state(same_ranks(old_size));
    s.outer_state_staged = true;
  }
  try {
    s.comm->release(leaver);
  } catch (const std::exception& e) {
    // A member lost meanwhile: the survivors re-form as after any loss (the leaver among them,
    // still asking to go).
    s.comm->fail_with(Status::PeerLost, std::string("letting rank ") + std::to_string(leaver) + " go failed: " + e.what());
    fail(Status::PeerLost, s.comm->error_message());
  }
  if (old_rank == leaver) {
    s.left = true;
    fail(Status::Left, "rank " + std::to_string(old_rank) + " of " + std::to_string(old_size) +
                           " left the group as it asked, at step " + std::to_string(s.stats.steps) +
                           ": its parameters are the group's anchor after its last round; destroy the engine "
                           "and the communicator");
  }
  restart_from_donor(s);
  fail(Status::MembershipChanged,
       "rank " + std::to_string(leaver) + " left the group as it asked: this is rank " + std::to_string(s.comm->rank()) +
           " of " + std::to_string(s.comm->size()) + " now; the group synchronized (every rank's parameters are the "
           "anchor, no round was dropped) and the engine's step count is " + std::to_string(s.stats.steps) +
           " on every rank: re-shard the data and go on from there (docs/capi.md, \"Elastic membership\")");
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

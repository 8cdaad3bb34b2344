// Forming a group: which transport connects the ranks, and the rendezvous that gets them there.
// capi's co2_comm_create / co2_comm_create_with_id / co2_get_unique_id are thin shims over this.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "rendezvous/launch_environment.hpp"
#include "rendezvous/store.hpp"

namespace co2 {

enum class TransportKind : int { Auto = 0, Local = 1, Ucx = 2, Nccl = 3 };

const char* transport_name(TransportKind kind);

struct TransportChoice {
  TransportKind kind;
  std::string reason;  // one sentence for the log: why this transport
};

// The decision alone, free of side effects so that it can be tested. `requested` is the
// config's transport; CO2_TRANSPORT (`environment_override`, "" when unset) applies only when
// the config says Auto. Auto picks UCX when a launcher says this process is one of several
// (`launched.present` with world_size > 1), else the in-process local transport.
TransportChoice choose_transport(TransportKind requested, const std::string& environment_override,
                                 const store::LaunchEnvironment& launched, int world_size, bool ucx_built);

struct GroupRequest {
  TransportKind transport = TransportKind::Auto;
  int rank = 0;
  int world_size = 1;
  // True when rank/world_size are the config's defaults (0, 1): a launcher's RANK/WORLD_SIZE
  // then fill them in.
  bool rank_is_default = true;
  std::string group_name;  // co2_comm_create: ranks with equal names form one group
  std::string unique_id;   // co2_comm_create_with_id: the id's text ("" otherwise)
  // CUDA device of an NCCL transport; -1: the launcher's local rank, else the current device.
  int device_index = -1;
  CommOptions options;
};

// Forms the group (blocking up to options.timeout) and returns its communicator.
std::shared_ptr<Communicator> form_group(const GroupRequest& request);

// Collective over `parent`: the ranks with equal `color` (>= 0) form a communicator, ranked by
// (key, parent rank); color < 0 joins none (nullptr). `request` gives the transport (Auto: the
// parent's kind; NCCL stays NCCL on the parent's device) and options; its rank, world size and
// group fields are filled in here. Each group's first rank makes an id (make_unique_id) that
// travels through two all-gathers on the parent.
std::shared_ptr<Communicator> split_group(Communicator& parent, int color, int key, GroupRequest request);

// A rank's place among the nodes of a communicator, as split_nodes computes it.
struct NodePlace {
  int node = 0;        // node index: nodes numbered in the order of their lowest parent rank
  int local = 0;       // index among the ranks of its node, in parent-rank order
  int nodes = 1;       // how many nodes
  int per_node = 1;    // ranks on every node
};

// Where each rank of a communicator is, from every rank's node name (index = parent rank; the
// same on every rank, so every rank reaches the same verdict). Throws co2::Error
// (InvalidArgument) when the nodes hold different numbers of ranks, naming the node sizes; when
// some ranks name their node by an id and others only by their host name; or when a rank could
// not tell its node (id kNodeUnresolved, the reason in `source`).
constexpr int64_t kNodeUnresolved = -2;
NodePlace place_on_nodes(const std::vector<store::NodeName>& names, int me);

// Collective over `parent`: this rank's node is `node_id` if >= 0, else store::read_node_name()
// (a failure there travels to every rank, which then all fail with it, instead of leaving the
// others waiting). All-gathers every rank's node name, places the ranks (place_on_nodes: a
// refusal happens on every rank, before any group forms), then forms the node's group (color
// node, key local) and the group of this local index across nodes (color local, key node) with
// split_group. Returns {intra_node, inter_node}.
std::pair<std::shared_ptr<Communicator>, std::shared_ptr<Communicator>> split_nodes(Communicator& parent, int node_id,
                                                                                   const GroupRequest& request);

// NCCL-style id: starts a rendezvous store server in this process (kept until a group formed
// from the id has met here, or until the process exits) and returns text naming it. Fits in
// CO2_UNIQUE_ID_BYTES - 1 bytes.
std::string make_unique_id();

bool ucx_built();

// Claims `rank` at a group's store for `process` (an identity unique to one process). The
// first claim of a rank by a process counts; a second process claiming the same rank throws
// transport::RendezvousError "rank R joined twice". A process may claim its rank again (a group
// formed anew from the same store).
void claim_rank(store::Store& store, int rank, const std::string& process);

}  // namespace co2

// Forming a group: which transport connects the ranks, and the rendezvous that gets them there.
// capi's co2_comm_create / co2_comm_create_with_id / co2_get_unique_id are thin shims over this.
#pragma once

#include <memory>
#include <string>

#include "runtime/comm.hpp"
#include "runtime/store/launch_environment.hpp"
#include "runtime/store/store.hpp"

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

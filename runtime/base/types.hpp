// The vocabulary the collectives and the communicator share: element types, reduction ops and
// what a collective is for. It sits below both, so that the collective algorithms never include
// the communicator that drives them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace co2 {

enum class DataType : int { F32 = 0, F64 = 3, I32 = 4, I64 = 5 };
enum class ReduceOp : int { Sum = 0, Avg = 1, Min = 2, Max = 3 };

size_t dtype_size(DataType dtype);

// What a collective is for. Part of its identity: two ranks' collectives pair only if their
// purposes (and owners, and per-purpose sequence numbers) are equal. Values are on the wire.
enum class Purpose : uint8_t {
  User = 0,              // a raw co2_allreduce / co2_broadcast on the communicator
  OuterAverage = 1,      // an engine's round all-reduce of deltas (co2, diloco)
  ParameterAverage = 2,  // an engine's blocking average of parameters (localsgd, sync)
  Consensus = 3,         // co2_engine_consensus(LOCAL_AVERAGE)
  AnchorCheck = 4,       // the periodic all-gather of anchor checksums
  LayoutHash = 5,        // the all-gather of layout digests at commit
  InitialBroadcast = 6,  // rank 0's parameters at commit
  GradientAverage = 7,   // co2_engine_reduce_gradients (sync)
  Split = 8,             // co2_comm_split's exchange of colors, keys and group ids
  AdvisorAgreement = 9,  // the ranks' tau-advisor inputs, combined at a boundary
  Membership = 10,       // a re-formed elastic group's choice of donor and its outer state
};
const char* purpose_name(Purpose purpose);

// Who issued a collective and why. `owner` 0 is the communicator's user; engines take an id
// from Communicator::register_owner(), which every rank hands out in the same order.
struct CollectiveId {
  uint32_t owner = 0;
  Purpose purpose = Purpose::User;
};

// Purposes whose messages travel on the control lane whatever their size: they are small and
// something waits on them. Any other collective of at most kControlLaneBytes does too.
bool is_control_purpose(Purpose purpose);
constexpr size_t kControlLaneBytes = size_t(64) << 10;

}  // namespace co2

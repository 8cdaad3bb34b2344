// Collective algorithms over a point-to-point transport, written as non-blocking state machines
// so that one progress thread can drive many of them at once.
//
// All three run on the ring rank -> rank+1. Each starts by sending a small descriptor of itself
// (sequence, kind, op, dtype, count, root) to its successor and checking the one its predecessor
// sent: ranks that issue different collectives fail with CollectiveMismatch instead of hanging or
// exchanging garbage. No data is posted before that check passed, so a mismatched collective
// never writes into the caller's buffer.
//
// - all-reduce: ring reduce-scatter followed by ring all-gather. The buffer is cut into W
//   contiguous shards (shard_range); segment c is chunk c (at most chunk_bytes) of every shard,
//   one block per shard. Segments advance independently through their 2(W-1) steps, with a
//   bounded number in flight. Block b of every segment is reduced exactly once, by rank b, in
//   ring order starting at rank b+1 ((x_{b+1} + x_{b+2}) + ... + x_b), and then copied, so the
//   result is bit-identical on every rank, and rank r reduces exactly shard r.
// - reduce-scatter and shard all-gather: the two halves of that all-reduce, run alone (the same
//   blocks, order of operands and messages), so reduce_scatter followed by allgather_shards gives
//   the all-reduce's result bit for bit.
// - broadcast: chunks flow down the chain root -> root+1 -> ... -> root-1, pipelined.
// - all-gather: ring, per chunk of every rank's block.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/base/status.hpp"
#include "runtime/base/types.hpp"
#include "runtime/outer/wire_format.hpp"
#include "transports/collective.hpp"
#include "transports/transport.hpp"

namespace co2::collectives {

enum class Kind : uint8_t {
  AllReduce = 1,
  Broadcast = 2,
  AllGather = 3,
  ReduceScatter = 4,   // count: the whole buffer; op and wire as an all-reduce's
  AllGatherShards = 5, // count: the whole buffer
};

using transport::ShardRange;
using transport::shard_range;
using transport::shard_size;

// What the peers compare before exchanging data. Fields that do not apply to a kind are zero
// (op Sum, root 0) so that equal collectives have equal descriptors.
struct Descriptor {
  uint64_t sequence = 0;          // issue order on the communicator: only matches messages
  // The identity (docs/capi.md, "Collective identity"): equal on every rank or a mismatch.
  uint32_t owner = 0;
  Purpose purpose = Purpose::User;
  uint64_t purpose_sequence = 0;
  Kind kind = Kind::AllReduce;
  ReduceOp op = ReduceOp::Sum;    // all-reduce and reduce-scatter only
  DataType dtype = DataType::F32;
  uint64_t count = 0;             // elements of the buffer; per rank for all-gather
  int32_t root = 0;               // broadcast only
  WireFormat wire = WireFormat::F32;  // (all-)reduce(-scatter) only: how blocks travel (below)

  bool operator==(const Descriptor& other) const;
  bool operator!=(const Descriptor& other) const { return !(*this == other); }
  // e.g. "#7 consensus #2 of owner 1: allreduce(avg, f32, count 1000)"
  std::string to_string() const;
  // Whether its data travels on the control lane (see kControlLaneBytes).
  bool control_lane() const;
};

// The descriptor on the wire: a fixed little-endian layout, so that ranks built by different
// compilers (or a stranger on the tag) are recognised.
constexpr size_t kDescriptorBytes = 48;
using DescriptorWire = std::array<std::byte, kDescriptorBytes>;
DescriptorWire encode(const Descriptor& descriptor);
std::optional<Descriptor> decode(const DescriptorWire& wire);
// What a collective gated on an earlier request (a chain's all-gather after its reduce-scatter)
// says when that request failed: `collective` was not started, and the first failure's cause
// (not the chain of "not started" in between).
std::string chain_stopped_message(const std::string& collective, const std::string& cause);
// The message that names both sides of a mismatch; `ours` was issued on rank `rank`.
std::string mismatch_message(int rank, const Descriptor& ours, const std::string& who,
                             const std::optional<Descriptor>& theirs);

struct Tuning {
  // Largest message; every message carries at most this many bytes (and at least one element).
  size_t chunk_bytes = size_t(1) << 20;
  // Segments (all-reduce) or chunks (broadcast, all-gather) in flight per collective. Bounds
  // the all-reduce's scratch memory to this many blocks.
  size_t max_chunks_in_flight = 4;
};

// Tags (transport::kTagBits = 48 bits): lane (1 bit: transport::kControlLaneTag) | sequence
// (16 bits, wrapping) | step (12 bits) | chunk (19 bits, wrapping). Wrapping is safe because a
// rank never runs more than a few chunks ahead of its neighbours. The descriptor uses a step
// value that no data message uses, and always travels on the control lane: ranks whose
// collectives would use different lanes still meet at the descriptor and see the mismatch.
constexpr int kMaxRanks = 2048;  // 2(W-1) data steps must fit below the descriptor's step
uint64_t data_tag(uint64_t sequence, uint32_t step, uint64_t chunk, bool control_lane);
uint64_t descriptor_tag(uint64_t sequence);

// Peers that learn of a mismatch through the abort it caused (they did not compare the two
// descriptors themselves) recognise it by this prefix of the abort reason.
constexpr const char* kMismatchPrefix = "collective mismatch: ";

// Status a transport outcome maps to (Done and Pending map to Ok).
Status status_of(transport::Outcome outcome);

class Collective {
 public:
  virtual ~Collective() = default;

  // Posts and tests whatever it can without blocking. Returns true if a message completed.
  virtual bool advance() = 0;
  // After a failure (its own or the communicator's, once the transport is aborted): tests the
  // messages still posted, once each. True when none is left, i.e. the transport will no longer
  // touch this collective's or the caller's buffers.
  virtual bool release_transfers() = 0;

  bool finished() const { return state_ == State::Finished; }
  bool failed() const { return state_ == State::Failed; }
  Status status() const { return status_; }
  const std::string& message() const { return message_; }
  const Descriptor& descriptor() const { return descriptor_; }

 protected:
  explicit Collective(const Descriptor& descriptor) : descriptor_(descriptor) {}
  void mark_finished() { state_ = State::Finished; }
  void mark_failed(Status status, std::string message);

 private:
  enum class State { Running, Finished, Failed };
  const Descriptor descriptor_;
  State state_ = State::Running;
  Status status_ = Status::Ok;
  std::string message_;
};

// The transport must outlive the collective; buffers must stay valid until it finished, or
// failed and released its transfers. `descriptor.kind` must match the factory.
//
// With descriptor.wire other than F32 (f32 data, Sum or Avg) the all-reduce is compressed: the
// same ring, but every message is a block encoded in that format. A rank decodes the partial sum
// it receives, adds its own fp32 values (partial + own, as uncompressed), and encodes the new
// partial sum for its successor; the block's owner divides (Avg), encodes the result once, and
// that message is forwarded unchanged around the ring while every rank, the owner included,
// decodes it into `buffer`: the result is bit-identical on every rank. Each rank encodes every
// element exactly once per all-reduce. If `residual` is not null it receives, per element, what
// this rank's encoding dropped, in units of the sum (the owner's drop from the average times W):
// sum_r input_r - sum_r residual_r = W * result (Avg) or result (Sum), up to fp32 rounding.
// A single rank sends nothing and encodes nothing: the result is its input bit for bit and the
// residual is zero. `segments`: where int8 groups must start (wire_format.hpp, SegmentStarts).
std::unique_ptr<Collective> make_allreduce(transport::PointToPoint& transport,
                                           const Descriptor& descriptor, void* buffer,
                                           const Tuning& tuning, float* residual = nullptr,
                                           const SegmentStarts& segments = {});

// The all-reduce's first half: in place on `count` elements of `buffer`; afterwards this rank's
// shard_range(count, W, rank) holds exactly what the all-reduce would have left there (the same
// wire format rules, the owner's Avg division and final encoding included), and `residual` (if
// any, `count` floats) exactly what the all-reduce would have written into all of it. The rest
// of `buffer` holds partial sums: unspecified.
std::unique_ptr<Collective> make_reduce_scatter(transport::PointToPoint& transport,
                                                const Descriptor& descriptor, void* buffer,
                                                const Tuning& tuning, float* residual = nullptr,
                                                const SegmentStarts& segments = {});
// The all-reduce's second half: in place, every rank's shard_range of `buffer` goes to every
// other rank, as it is (fp32 on the wire: descriptor.wire must be F32). After a compressed
// reduce-scatter the owner's shard already holds the decoded values, so the result is still the
// compressed all-reduce's bit for bit; only its all-gather half moves 4 bytes per value.
std::unique_ptr<Collective> make_allgather_shards(transport::PointToPoint& transport,
                                                  const Descriptor& descriptor, void* buffer,
                                                  const Tuning& tuning);

// Bytes rank `rank` of `ranks` sends in an all-reduce of `count` f32 elements in `format`
// (payload only, without the descriptor), and in each of its halves run alone.
uint64_t allreduce_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                              const Tuning& tuning, const SegmentStarts& segments = {});
uint64_t reduce_scatter_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                                   const Tuning& tuning, const SegmentStarts& segments = {});
uint64_t allgather_shards_wire_bytes(int rank, int ranks, uint64_t count, const Tuning& tuning);

// The compressed all-reduce over a collective-kind transport (gathered_allreduce.cpp): each rank's
// values encoded once, shard by shard (shard_range of W), into a block of words_per_rank int64
// words; the blocks all-gathered; each shard decoded from every block in rank order. The result
// is the same on every rank (not the ring's bits), and `residual` takes this rank's drops, so
// that, as with the ring, sum_r input_r - sum_r residual_r = W * result (Avg) up to rounding.
struct GatheredWire {
  GatheredWire(WireFormat format, size_t count, int ranks, const SegmentStarts& segments);
  // block <- this rank's encoding of values[0, count); residual (may be null) <- its drops.
  void encode(const float* values, float* residual, std::byte* block) const;
  // values' shard `shard` <- the sum (average) of every rank's encoding of it; `blocks`: the
  // all-gathered blocks, in rank order.
  void decode(const std::byte* blocks, int shard, bool average, float* values) const;

  WireFormat format;
  size_t count;
  int ranks;
  SegmentStarts segments;
  std::vector<size_t> shard_offsets;  // bytes into a block
  size_t words_per_rank = 0;
};
// Bytes a rank sends in one (a ring all-gather of the blocks).
uint64_t gathered_allreduce_wire_bytes(int ranks, uint64_t count, WireFormat format, const SegmentStarts& segments = {});

std::unique_ptr<Collective> make_broadcast(transport::PointToPoint& transport,
                                           const Descriptor& descriptor, void* buffer,
                                           const Tuning& tuning);
std::unique_ptr<Collective> make_allgather(transport::PointToPoint& transport,
                                           const Descriptor& descriptor, const void* send,
                                           void* recv, const Tuning& tuning);

}  // namespace co2::collectives

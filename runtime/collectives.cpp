#include "runtime/collectives.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <optional>
#include <type_traits>
#include <vector>

namespace co2::collectives {

namespace {

using transport::Handle;
using transport::Outcome;
using transport::PointToPoint;

constexpr uint32_t kDescriptorMagic = 0x44324f43;  // "CO2D"
constexpr uint8_t kDescriptorVersion = 2;

void put_le(DescriptorWire& wire, size_t offset, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) wire[offset + i] = std::byte((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const DescriptorWire& wire, size_t offset, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t(wire[offset + i]) << (8 * i);
  return value;
}

}  // namespace

DescriptorWire encode(const Descriptor& descriptor) {
  DescriptorWire wire{};
  put_le(wire, 0, kDescriptorMagic, 4);
  put_le(wire, 4, kDescriptorVersion, 1);
  put_le(wire, 5, uint64_t(descriptor.kind), 1);
  put_le(wire, 6, uint64_t(descriptor.op), 1);
  put_le(wire, 7, uint64_t(descriptor.dtype), 1);
  put_le(wire, 8, descriptor.sequence, 8);
  put_le(wire, 16, descriptor.count, 8);
  put_le(wire, 24, uint32_t(descriptor.root), 4);
  put_le(wire, 28, descriptor.owner, 4);
  put_le(wire, 32, descriptor.purpose_sequence, 8);
  put_le(wire, 40, uint64_t(descriptor.purpose), 1);
  put_le(wire, 41, uint64_t(descriptor.wire), 1);  // 0 (fp32) where older builds left zeros
  return wire;
}

std::optional<Descriptor> decode(const DescriptorWire& wire) {
  if (get_le(wire, 0, 4) != kDescriptorMagic || get_le(wire, 4, 1) != kDescriptorVersion)
    return std::nullopt;
  Descriptor descriptor;
  descriptor.kind = Kind(get_le(wire, 5, 1));
  descriptor.op = ReduceOp(get_le(wire, 6, 1));
  descriptor.dtype = DataType(get_le(wire, 7, 1));
  descriptor.sequence = get_le(wire, 8, 8);
  descriptor.count = get_le(wire, 16, 8);
  descriptor.root = int32_t(uint32_t(get_le(wire, 24, 4)));
  descriptor.owner = uint32_t(get_le(wire, 28, 4));
  descriptor.purpose_sequence = get_le(wire, 32, 8);
  descriptor.purpose = Purpose(get_le(wire, 40, 1));
  descriptor.wire = WireFormat(get_le(wire, 41, 1));
  return descriptor;
}

std::string mismatch_message(int rank, const Descriptor& ours, const std::string& who,
                             const std::optional<Descriptor>& theirs) {
  return kMismatchPrefix + std::string("rank ") + std::to_string(rank) + " issued " +
         ours.to_string() + " but " + who +
         (theirs ? " issued " + theirs->to_string() : std::string(" sent a malformed descriptor"));
}

namespace {

std::string kind_name(Kind kind) {
  switch (kind) {
    case Kind::AllReduce: return "allreduce";
    case Kind::Broadcast: return "broadcast";
    case Kind::AllGather: return "allgather";
    case Kind::ReduceScatter: return "reduce_scatter";
    case Kind::AllGatherShards: return "allgather_shards";
  }
  return "kind " + std::to_string(int(kind));
}

std::string op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
  }
  return "op " + std::to_string(int(op));
}

std::string dtype_name(DataType dtype) {
  switch (dtype) {
    case DataType::F32: return "f32";
    case DataType::F64: return "f64";
    case DataType::I32: return "i32";
    case DataType::I64: return "i64";
  }
  return "dtype " + std::to_string(int(dtype));
}

// ---------------------------------------------------------------------------------------------
// Element-wise reduction. `partial` arrived from the ring predecessor and already combines the
// ranks before this one; the order of operands is therefore fixed by ring position alone.

template <typename T>
T add(T partial, T own) {
  if constexpr (std::is_integral_v<T>) {
    // Wrap around instead of overflowing (undefined for signed types).
    using Unsigned = std::make_unsigned_t<T>;
    return T(Unsigned(partial) + Unsigned(own));
  } else {
    return partial + own;
  }
}

template <typename T>
void combine_typed(ReduceOp op, T* own, const T* partial, size_t count) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      for (size_t i = 0; i < count; ++i) own[i] = add(partial[i], own[i]);
      return;
    case ReduceOp::Min:
      for (size_t i = 0; i < count; ++i) own[i] = own[i] < partial[i] ? own[i] : partial[i];
      return;
    case ReduceOp::Max:
      for (size_t i = 0; i < count; ++i) own[i] = partial[i] < own[i] ? own[i] : partial[i];
      return;
  }
}

// Avg = Sum, then scaled once by the block's owner: by 1/W for floats, integer division for ints.
template <typename T>
void divide_typed(T* values, size_t count, int ranks) {
  if constexpr (std::is_integral_v<T>) {
    for (size_t i = 0; i < count; ++i) values[i] = T(values[i] / T(ranks));
  } else {
    const T scale = T(1) / T(ranks);
    for (size_t i = 0; i < count; ++i) values[i] *= scale;
  }
}

template <template <typename> class Body, typename... Args>
void dispatch(DataType dtype, Args&&... args) {
  switch (dtype) {
    case DataType::F32: return Body<float>::run(std::forward<Args>(args)...);
    case DataType::F64: return Body<double>::run(std::forward<Args>(args)...);
    case DataType::I32: return Body<int32_t>::run(std::forward<Args>(args)...);
    case DataType::I64: return Body<int64_t>::run(std::forward<Args>(args)...);
  }
}

template <typename T>
struct Combine {
  static void run(ReduceOp op, std::byte* own, const std::byte* partial, size_t count) {
    combine_typed(op, reinterpret_cast<T*>(own), reinterpret_cast<const T*>(partial), count);
  }
};

template <typename T>
struct Divide {
  static void run(std::byte* values, size_t count, int ranks) {
    divide_typed(reinterpret_cast<T*>(values), count, ranks);
  }
};

// ---------------------------------------------------------------------------------------------
// A schedule says what one rank sends and receives in each step of each chunk; RingCollective
// runs it. Sends go to the ring successor, receives come from the predecessor; the two messages
// of a step are posted together and the step ends when both completed.

struct StepTransfers {
  const std::byte* send = nullptr;
  size_t send_bytes = 0;
  bool has_send = false;
  std::byte* recv = nullptr;
  size_t recv_bytes = 0;
  bool has_recv = false;
  uint32_t tag_step = 0;  // the sender's and the receiver's step must agree on it
};

class RingSchedule {
 public:
  virtual ~RingSchedule() = default;
  virtual size_t chunk_count() const = 0;
  virtual int steps_per_chunk() const = 0;
  // Scratch needed by one chunk in flight.
  virtual size_t scratch_bytes() const { return 0; }
  // Local work before the first chunk, once the peers agreed on the collective.
  virtual void start() {}
  virtual StepTransfers transfers(size_t chunk, int step, std::byte* scratch) = 0;
  // Local work after a step's messages completed.
  virtual void finish_step(size_t /*chunk*/, int /*step*/, std::byte* /*scratch*/) {}
};

bool is_failure(Outcome outcome) { return outcome != Outcome::Pending && outcome != Outcome::Done; }

int ring_index(long long index, int ranks) {
  const long long wrapped = index % ranks;
  return int(wrapped < 0 ? wrapped + ranks : wrapped);
}

// Elements per message: chunk_bytes worth, at least one, at most what there is.
size_t chunk_elements(const Tuning& tuning, size_t element_bytes, size_t total_elements) {
  const size_t elements = std::max<size_t>(1, tuning.chunk_bytes / element_bytes);
  return std::min(elements, std::max<size_t>(1, total_elements));
}

size_t ceil_div(size_t value, size_t divisor) { return value / divisor + (value % divisor != 0); }

struct Block {
  size_t offset;
  size_t count;
};

// Block `index` of segment `chunk`: chunk `chunk` of shard `index`, at most `block_elements`
// long. Shards differ in length only at the end (shard_range), so the trailing shards' blocks
// run out first and are empty in the last segments.
Block segment_block(size_t count, size_t block_elements, int ranks, size_t chunk, int index) {
  const ShardRange shard = shard_range(count, ranks, index);
  const size_t first = std::min(shard.end, shard.begin + chunk * block_elements);
  const size_t last = std::min(shard.end, first + block_elements);
  return {first, last - first};
}

// Segments of an all-reduce: enough for the largest shard.
size_t segment_count(size_t count, int ranks, size_t block_elements) {
  return ceil_div(shard_size(count, ranks), block_elements);
}

// The block rank `rank` sends in step `step` of an all-reduce (AllReduceSchedule's ring); it
// receives the block before it. Block b starts its reduction at rank b+1 so that its last step
// (W-2) ends at rank b: rank r owns shard r.
int allreduce_send_block(int rank, int ranks, int step) {
  return step < ranks - 1 ? ring_index(rank - 1 - step, ranks)
                          : ring_index(rank - (step - (ranks - 1)), ranks);
}

int allreduce_recv_block(int rank, int ranks, int step) {
  return ring_index(allreduce_send_block(rank, ranks, step) - 1, ranks);
}

// Which steps of the all-reduce's ring a schedule runs: all 2(W-1), the reduce-scatter
// (0..W-2) or the all-gather (W-1..2W-3).
enum class Phases { Both, ReduceScatter, AllGather };

int first_step(Phases phases, int ranks) { return phases == Phases::AllGather ? ranks - 1 : 0; }
int step_count(Phases phases, int ranks) {
  return phases == Phases::Both ? 2 * (ranks - 1) : ranks - 1;
}

// Segment c of the buffer holds W blocks of at most chunk_elements each. Steps 0..W-2 are the
// reduce-scatter (after them rank r owns block r of every segment), W-1..2W-3 the all-gather.
class AllReduceSchedule final : public RingSchedule {
 public:
  AllReduceSchedule(int rank, int ranks, const Descriptor& descriptor, void* buffer,
                    const Tuning& tuning, Phases phases)
      : rank_(rank),
        ranks_(ranks),
        op_(descriptor.op),
        dtype_(descriptor.dtype),
        element_bytes_(dtype_size(descriptor.dtype)),
        count_(descriptor.count),
        buffer_(static_cast<std::byte*>(buffer)),
        block_elements_(chunk_elements(tuning, element_bytes_, ceil_div(count_, size_t(ranks)))),
        first_step_(first_step(phases, ranks)),
        steps_(step_count(phases, ranks)) {}

  size_t chunk_count() const override { return segment_count(count_, ranks_, block_elements_); }
  int steps_per_chunk() const override { return steps_; }
  size_t scratch_bytes() const override {
    return first_step_ < ranks_ - 1 ? block_elements_ * element_bytes_ : 0;
  }

  StepTransfers transfers(size_t chunk, int local_step, std::byte* scratch) override {
    const int step = first_step_ + local_step;
    StepTransfers io;
    io.tag_step = uint32_t(step);
    io.has_send = io.has_recv = true;
    const bool reducing = step < ranks_ - 1;
    const Block sent = block(chunk, allreduce_send_block(rank_, ranks_, step));
    const Block received = block(chunk, allreduce_recv_block(rank_, ranks_, step));
    io.send = buffer_ + sent.offset * element_bytes_;
    io.send_bytes = sent.count * element_bytes_;
    io.recv = reducing ? scratch : buffer_ + received.offset * element_bytes_;
    io.recv_bytes = received.count * element_bytes_;
    return io;
  }

  void finish_step(size_t chunk, int local_step, std::byte* scratch) override {
    const int step = first_step_ + local_step;
    if (step >= ranks_ - 1) return;  // all-gather: the block arrived in place
    const Block reduced = block(chunk, allreduce_recv_block(rank_, ranks_, step));
    std::byte* own = buffer_ + reduced.offset * element_bytes_;
    dispatch<Combine>(dtype_, op_, own, scratch, reduced.count);
    const bool block_complete = step == ranks_ - 2;  // this rank owns it now
    if (block_complete && op_ == ReduceOp::Avg) dispatch<Divide>(dtype_, own, reduced.count, ranks_);
  }

 private:
  Block block(size_t chunk, int index) const {
    return segment_block(count_, block_elements_, ranks_, chunk, index);
  }

  const int rank_;
  const int ranks_;
  const ReduceOp op_;
  const DataType dtype_;
  const size_t element_bytes_;
  const size_t count_;
  std::byte* const buffer_;
  const size_t block_elements_;
  const int first_step_;
  const int steps_;
};

// The compressed all-reduce (make_allreduce with a wire format): the ring and blocks of
// AllReduceSchedule, every message encoded. A slot's scratch holds two encoded blocks; step s
// sends the one at parity s % 2 and receives into the other, which the step's end decodes and
// (reduce-scatter) re-encodes in place: the next step sends exactly the bytes that were
// written, and the all-gather forwards the bytes it received unchanged. Phases Both or
// ReduceScatter only: the all-gather alone has no encoded message to forward
// (make_allgather_shards sends fp32).
class CompressedAllReduceSchedule final : public RingSchedule {
 public:
  CompressedAllReduceSchedule(int rank, int ranks, const Descriptor& descriptor, void* buffer,
                              float* residual, const SegmentStarts& segments, const Tuning& tuning,
                              Phases phases)
      : rank_(rank),
        ranks_(ranks),
        average_(descriptor.op == ReduceOp::Avg),
        wire_(descriptor.wire),
        count_(descriptor.count),
        buffer_(static_cast<float*>(buffer)),
        residual_(residual),
        segments_(segments),
        block_elements_(chunk_elements(tuning, wire_element_bytes(wire_),
                                       ceil_div(count_, size_t(ranks)))),
        encoded_bytes_(wire_bytes_bound(wire_, block_elements_, segments_)),
        steps_(step_count(phases, ranks)) {}

  size_t chunk_count() const override { return segment_count(count_, ranks_, block_elements_); }
  int steps_per_chunk() const override { return steps_; }
  size_t scratch_bytes() const override { return 2 * encoded_bytes_; }

  // One rank has nothing to send: its sum and its average are its input, exactly, and no
  // encoding drops anything (quantizing there would only add error).
  void start() override {
    if (ranks_ == 1 && residual_) std::fill(residual_, residual_ + count_, 0.0f);
  }

  StepTransfers transfers(size_t chunk, int step, std::byte* scratch) override {
    StepTransfers io;
    io.tag_step = uint32_t(step);
    io.has_send = io.has_recv = true;
    const Block sent = block(chunk, allreduce_send_block(rank_, ranks_, step));
    const Block received = block(chunk, allreduce_recv_block(rank_, ranks_, step));
    std::byte* outgoing = half(scratch, step);
    if (step == 0) encode(sent.offset, sent.count, outgoing, /*owner=*/false);  // own values
    io.send = outgoing;
    io.send_bytes = wire_bytes(wire_, sent.count, segments_, sent.offset);
    io.recv = half(scratch, step + 1);
    io.recv_bytes = wire_bytes(wire_, received.count, segments_, received.offset);
    return io;
  }

  void finish_step(size_t chunk, int step, std::byte* scratch) override {
    const Block got = block(chunk, allreduce_recv_block(rank_, ranks_, step));
    std::byte* message = half(scratch, step + 1);
    float* values = buffer_ + got.offset;
    if (step >= ranks_ - 1) {  // all-gather: the owner's bytes, forwarded next step as they are
      wire_decode(wire_, message, got.count, values, /*accumulate=*/false, segments_, got.offset);
      return;
    }
    wire_decode(wire_, message, got.count, values, /*accumulate=*/true, segments_, got.offset);  // partial + own
    encode(got.offset, got.count, message, /*owner=*/step == ranks_ - 2);
  }

 private:
  Block block(size_t chunk, int index) const {
    return segment_block(count_, block_elements_, ranks_, chunk, index);
  }
  std::byte* half(std::byte* scratch, int parity) const {
    return scratch + size_t(parity % 2) * encoded_bytes_;
  }

  // Encodes buffer[offset, offset + count) into `out` and records what the encoding dropped,
  // in units of the sum. The owner first completes the reduction (Avg: divides the sum once) and
  // then takes the decoded result, so that it holds what every other rank will.
  void encode(size_t offset, size_t count, std::byte* out, bool owner) {
    float* values = buffer_ + offset;
    if (owner && average_) divide_typed(values, count, ranks_);
    const float scale = owner && average_ ? float(ranks_) : 1.0f;
    wire_encode(wire_, values, count, out, residual_ ? residual_ + offset : nullptr, scale,
                owner ? values : nullptr, segments_, offset);
  }

  const int rank_;
  const int ranks_;
  const bool average_;
  const WireFormat wire_;
  const size_t count_;
  float* const buffer_;
  float* const residual_;
  const SegmentStarts segments_;
  const size_t block_elements_;
  const size_t encoded_bytes_;
  const int steps_;  // the reduce-scatter alone, or with the all-gather
};

// A chain from the root: step 0 receives chunk c from the predecessor, step 1 forwards it.
class BroadcastSchedule final : public RingSchedule {
 public:
  BroadcastSchedule(int rank, int ranks, const Descriptor& descriptor, void* buffer,
                    const Tuning& tuning)
      : position_(ring_index(rank - descriptor.root, ranks)),
        ranks_(ranks),
        element_bytes_(dtype_size(descriptor.dtype)),
        count_(descriptor.count),
        buffer_(static_cast<std::byte*>(buffer)),
        chunk_elements_(chunk_elements(tuning, element_bytes_, count_)) {}

  size_t chunk_count() const override { return ceil_div(count_, chunk_elements_); }
  int steps_per_chunk() const override { return 2; }

  StepTransfers transfers(size_t chunk, int step, std::byte* /*scratch*/) override {
    StepTransfers io;
    std::byte* data = buffer_ + chunk * chunk_elements_ * element_bytes_;
    const size_t bytes = std::min(chunk_elements_, count_ - chunk * chunk_elements_) * element_bytes_;
    const bool is_first = position_ == 0;
    const bool is_last = position_ == ranks_ - 1;
    if (step == 0 && !is_first) {
      io.has_recv = true;
      io.recv = data;
      io.recv_bytes = bytes;
    } else if (step == 1 && !is_last) {
      io.has_send = true;
      io.send = data;
      io.send_bytes = bytes;
    }
    return io;
  }

 private:
  const int position_;  // along the chain; the root is 0
  const int ranks_;
  const size_t element_bytes_;
  const size_t count_;
  std::byte* const buffer_;
  const size_t chunk_elements_;
};

// Step t of chunk c forwards chunk c of block r-t and receives that of block r-t-1.
class AllGatherSchedule final : public RingSchedule {
 public:
  AllGatherSchedule(int rank, int ranks, const Descriptor& descriptor, const void* send,
                    void* recv, const Tuning& tuning)
      : rank_(rank),
        ranks_(ranks),
        element_bytes_(dtype_size(descriptor.dtype)),
        count_per_rank_(descriptor.count),
        send_(static_cast<const std::byte*>(send)),
        recv_(static_cast<std::byte*>(recv)),
        chunk_elements_(chunk_elements(tuning, element_bytes_, count_per_rank_)) {}

  size_t chunk_count() const override { return ceil_div(count_per_rank_, chunk_elements_); }
  int steps_per_chunk() const override { return ranks_ - 1; }

  void start() override {
    std::byte* own = block_chunk(rank_, 0);
    const size_t bytes = count_per_rank_ * element_bytes_;
    if (bytes > 0 && own != send_) std::memmove(own, send_, bytes);
  }

  StepTransfers transfers(size_t chunk, int step, std::byte* /*scratch*/) override {
    StepTransfers io;
    io.tag_step = uint32_t(step);
    io.has_send = io.has_recv = true;
    const size_t bytes =
        std::min(chunk_elements_, count_per_rank_ - chunk * chunk_elements_) * element_bytes_;
    io.send = block_chunk(ring_index(rank_ - step, ranks_), chunk);
    io.send_bytes = bytes;
    io.recv = block_chunk(ring_index(rank_ - step - 1, ranks_), chunk);
    io.recv_bytes = bytes;
    return io;
  }

 private:
  std::byte* block_chunk(int block, size_t chunk) const {
    return recv_ + (size_t(block) * count_per_rank_ + chunk * chunk_elements_) * element_bytes_;
  }

  const int rank_;
  const int ranks_;
  const size_t element_bytes_;
  const size_t count_per_rank_;
  const std::byte* const send_;
  std::byte* const recv_;
  const size_t chunk_elements_;
};

// ---------------------------------------------------------------------------------------------

class RingCollective final : public Collective {
 public:
  RingCollective(PointToPoint& transport, const Descriptor& descriptor,
                 std::unique_ptr<RingSchedule> schedule, const Tuning& tuning)
      : Collective(descriptor),
        transport_(transport),
        schedule_(std::move(schedule)),
        rank_(transport.rank()),
        ranks_(transport.size()),
        next_(ring_index(rank_ + 1, ranks_)),
        previous_(ring_index(rank_ - 1, ranks_)),
        stage_receives_(transport.receives_may_land_late()),
        descriptor_out_(encode(descriptor)),
        chunks_left_(schedule_->chunk_count()) {
    const size_t slots = std::min(std::max<size_t>(1, tuning.max_chunks_in_flight), chunks_left_);
    const size_t scratch_bytes = schedule_->scratch_bytes();
    if (scratch_bytes > 0 && slots > 0) scratch_.reset(new std::byte[slots * scratch_bytes]);
    slots_.resize(slots);
    for (size_t i = 0; i < slots; ++i)
      slots_[i].scratch = scratch_ ? scratch_.get() + i * scratch_bytes : nullptr;
  }

  bool advance() override;
  bool release_transfers() override;

 private:
  struct Slot {
    bool busy = false;
    size_t chunk = 0;
    int step = 0;
    std::optional<Handle> send;
    std::optional<Handle> recv;
    std::byte* scratch = nullptr;
    // With a transport whose receives may land late: the step's receive lands in `staging`
    // (owned here) and is copied to `recv_target` once it completed.
    std::vector<std::byte> staging;
    std::byte* recv_target = nullptr;
    size_t recv_bytes = 0;
  };

  // Tests `handle` if posted; forgets it once the transport released it. Not posted = Done.
  Outcome poll(std::optional<Handle>& handle, bool& progressed);
  void check_descriptor();
  bool advance_chunks();
  void start_chunk(Slot& slot, size_t chunk);
  void post_step(Slot& slot);
  void fail_transfer(Outcome outcome, const std::string& what);

  PointToPoint& transport_;
  std::unique_ptr<RingSchedule> schedule_;
  const int rank_;
  const int ranks_;
  const int next_;
  const int previous_;

  const bool stage_receives_;
  bool exchange_posted_ = false;
  bool data_started_ = false;
  const DescriptorWire descriptor_out_;
  DescriptorWire descriptor_in_{};
  std::optional<Handle> descriptor_send_;
  std::optional<Handle> descriptor_recv_;

  std::unique_ptr<std::byte[]> scratch_;
  std::vector<Slot> slots_;
  size_t next_chunk_ = 0;
  size_t chunks_left_;
};

Outcome RingCollective::poll(std::optional<Handle>& handle, bool& progressed) {
  if (!handle) return Outcome::Done;
  const Outcome outcome = transport_.test(*handle);
  if (outcome == Outcome::Pending) return outcome;
  handle.reset();
  if (outcome == Outcome::Done) progressed = true;
  return outcome;
}

void RingCollective::fail_transfer(Outcome outcome, const std::string& what) {
  std::string message = descriptor().to_string() + " on rank " + std::to_string(rank_) + ": " + what;
  if (outcome == Outcome::SizeMismatch)
    message = kMismatchPrefix + message + " (the peer issued a different collective)";
  const std::string detail = transport_.error_message();
  // A rank that is not next to the mismatch learns of it through the abort that the ranks
  // which compared the descriptors sent: it reports the mismatch (naming both identities, in
  // the detail) rather than a bare abort.
  Status status = status_of(outcome);
  if (outcome == Outcome::Aborted && detail.find(kMismatchPrefix) != std::string::npos)
    status = Status::CollectiveMismatch;
  mark_failed(status, message + ": " + detail);
}

void RingCollective::check_descriptor() {
  const std::optional<Descriptor> theirs = decode(descriptor_in_);
  if (theirs && *theirs == descriptor()) return;
  mark_failed(Status::CollectiveMismatch,
              mismatch_message(rank_, descriptor(),
                               "its ring predecessor rank " + std::to_string(previous_), theirs));
}

bool RingCollective::advance() {
  if (finished() || failed()) return false;
  if (ranks_ == 1) {
    schedule_->start();
    mark_finished();
    return true;
  }

  bool progressed = false;
  if (!exchange_posted_) {
    exchange_posted_ = true;
    const uint64_t tag = descriptor_tag(descriptor().sequence);
    descriptor_recv_ = transport_.post_recv(previous_, tag, descriptor_in_.data(), kDescriptorBytes);
    descriptor_send_ = transport_.post_send(next_, tag, descriptor_out_.data(), kDescriptorBytes);
  }
  if (descriptor_recv_) {
    const Outcome outcome = poll(descriptor_recv_, progressed);
    if (outcome == Outcome::Done) {
      check_descriptor();
      if (failed()) return progressed;
      schedule_->start();
      data_started_ = true;
    } else if (is_failure(outcome)) {
      fail_transfer(outcome, "receiving the descriptor from rank " + std::to_string(previous_));
      return progressed;
    }
  }
  const Outcome sent = poll(descriptor_send_, progressed);
  if (is_failure(sent)) {
    fail_transfer(sent, "sending the descriptor to rank " + std::to_string(next_));
    return progressed;
  }

  if (data_started_) progressed |= advance_chunks();
  if (!failed() && data_started_ && chunks_left_ == 0 && !descriptor_send_) mark_finished();
  return progressed;
}

bool RingCollective::advance_chunks() {
  bool progressed = false;
  for (Slot& slot : slots_) {
    if (!slot.busy && next_chunk_ < schedule_->chunk_count()) start_chunk(slot, next_chunk_++);
    while (slot.busy) {
      const Outcome sent = poll(slot.send, progressed);
      const Outcome received = poll(slot.recv, progressed);
      const auto where = [&] {
        return " (chunk " + std::to_string(slot.chunk) + ", step " + std::to_string(slot.step) + ")";
      };
      if (is_failure(sent)) {
        fail_transfer(sent, "sending to rank " + std::to_string(next_) + where());
        return progressed;
      }
      if (is_failure(received)) {
        fail_transfer(received, "receiving from rank " + std::to_string(previous_) + where());
        return progressed;
      }
      if (slot.send || slot.recv) break;  // still in flight

      if (slot.recv_target) {
        std::memcpy(slot.recv_target, slot.staging.data(), slot.recv_bytes);
        slot.recv_target = nullptr;
      }
      schedule_->finish_step(slot.chunk, slot.step, slot.scratch);
      if (++slot.step < schedule_->steps_per_chunk()) {
        post_step(slot);
        continue;
      }
      --chunks_left_;
      slot.busy = false;
      if (next_chunk_ < schedule_->chunk_count()) start_chunk(slot, next_chunk_++);
    }
  }
  return progressed;
}

void RingCollective::start_chunk(Slot& slot, size_t chunk) {
  slot.busy = true;
  slot.chunk = chunk;
  slot.step = 0;
  post_step(slot);
}

void RingCollective::post_step(Slot& slot) {
  const StepTransfers io = schedule_->transfers(slot.chunk, slot.step, slot.scratch);
  const uint64_t tag =
      data_tag(descriptor().sequence, io.tag_step, slot.chunk, descriptor().control_lane());
  std::byte* recv = io.recv;
  const std::less_equal<const std::byte*> not_after;
  const bool into_scratch = slot.scratch != nullptr && not_after(slot.scratch, io.recv) &&
                            !not_after(slot.scratch + schedule_->scratch_bytes(), io.recv);
  const bool into_callers_memory = io.recv_bytes > 0 && !into_scratch;
  if (io.has_recv && stage_receives_ && into_callers_memory) {
    if (slot.staging.size() < io.recv_bytes) slot.staging.resize(io.recv_bytes);
    slot.recv_target = io.recv;
    slot.recv_bytes = io.recv_bytes;
    recv = slot.staging.data();
  }
  if (io.has_recv) slot.recv = transport_.post_recv(previous_, tag, recv, io.recv_bytes);
  if (io.has_send) slot.send = transport_.post_send(next_, tag, io.send, io.send_bytes);
}

bool RingCollective::release_transfers() {
  bool ignored = false;
  bool all_released = true;
  auto release = [&](std::optional<Handle>& handle) {
    poll(handle, ignored);
    all_released = all_released && !handle;
  };
  release(descriptor_send_);
  release(descriptor_recv_);
  for (Slot& slot : slots_) {
    release(slot.send);
    release(slot.recv);
  }
  return all_released;
}

Descriptor normalised(Descriptor descriptor, Kind kind) {
  descriptor.kind = kind;
  if (kind != Kind::AllReduce && kind != Kind::ReduceScatter) descriptor.op = ReduceOp::Sum;
  if (kind != Kind::Broadcast) descriptor.root = 0;
  return descriptor;
}

void check_common(const PointToPoint& transport, const Descriptor& descriptor,
                  size_t total_elements_factor) {
  require(transport.size() <= kMaxRanks, Status::Unsupported,
          "collectives support at most " + std::to_string(kMaxRanks) + " ranks, not " +
              std::to_string(transport.size()));
  const size_t element_bytes = dtype_size(descriptor.dtype);
  require(descriptor.count <= SIZE_MAX / element_bytes / total_elements_factor,
          Status::InvalidArgument,
          descriptor.to_string() + ": the buffer size overflows size_t");
}

}  // namespace

// ---------------------------------------------------------------------------------------------

bool Descriptor::operator==(const Descriptor& other) const {
  return sequence == other.sequence && owner == other.owner && purpose == other.purpose &&
         purpose_sequence == other.purpose_sequence && kind == other.kind && op == other.op &&
         dtype == other.dtype && count == other.count && root == other.root && wire == other.wire;
}

bool Descriptor::control_lane() const {
  if (is_control_purpose(purpose)) return true;
  const size_t element_bytes = dtype_size(dtype);
  return count <= kControlLaneBytes / element_bytes;
}

std::string Descriptor::to_string() const {
  std::string text = "#" + std::to_string(sequence) + " " + purpose_name(purpose) + " #" +
                     std::to_string(purpose_sequence) + " of owner " + std::to_string(owner) +
                     ": " + kind_name(kind) + "(";
  if (kind == Kind::AllReduce || kind == Kind::ReduceScatter) text += op_name(op) + ", ";
  text += dtype_name(dtype) + ", count " + std::to_string(count);
  if (wire != WireFormat::F32) text += std::string(", wire ") + wire_format_name(wire);
  if (kind == Kind::Broadcast) text += ", root " + std::to_string(root);
  return text + ")";
}

namespace {
constexpr unsigned kChunkBits = 19;
constexpr unsigned kStepBits = 12;
constexpr unsigned kSequenceBits = transport::kTagBits - 1 - kStepBits - kChunkBits;
static_assert(transport::kControlLaneTag >> (kSequenceBits + kStepBits + kChunkBits) == 1,
              "the lane bit sits above the sequence");
static_assert(kSequenceBits >= 16, "sequence numbers must not wrap among collectives in flight");
constexpr uint64_t kDescriptorStep = (uint64_t(1) << kStepBits) - 1;
static_assert(2 * (kMaxRanks - 1) < kDescriptorStep, "data steps must not reach the descriptor's");

uint64_t make_tag(uint64_t sequence, uint64_t step, uint64_t chunk) {
  const uint64_t sequence_field = sequence & ((uint64_t(1) << kSequenceBits) - 1);
  const uint64_t step_field = step & kDescriptorStep;
  const uint64_t chunk_field = chunk & ((uint64_t(1) << kChunkBits) - 1);
  return (sequence_field << (kStepBits + kChunkBits)) | (step_field << kChunkBits) | chunk_field;
}
}  // namespace

uint64_t data_tag(uint64_t sequence, uint32_t step, uint64_t chunk, bool control_lane) {
  // Schedules use fewer than kDescriptorStep steps (kMaxRanks is checked at construction).
  return make_tag(sequence, step, chunk) | (control_lane ? transport::kControlLaneTag : 0);
}

uint64_t descriptor_tag(uint64_t sequence) {
  return make_tag(sequence, kDescriptorStep, 0) | transport::kControlLaneTag;
}

Status status_of(transport::Outcome outcome) {
  switch (outcome) {
    case Outcome::Pending:
    case Outcome::Done: return Status::Ok;
    case Outcome::PeerLost: return Status::PeerLost;
    case Outcome::SizeMismatch: return Status::CollectiveMismatch;
    case Outcome::Aborted: return Status::Aborted;
    case Outcome::Failed: return Status::Transport;
  }
  return Status::Internal;
}

void Collective::mark_failed(Status status, std::string message) {
  state_ = State::Failed;
  status_ = status;
  message_ = std::move(message);
}

namespace {

// The all-reduce, or one of its halves (`agreed.kind` says which; its wire format decides the
// schedule).
std::unique_ptr<Collective> make_reduction(PointToPoint& transport, const Descriptor& agreed,
                                           void* buffer, const Tuning& tuning, float* residual,
                                           const SegmentStarts& segments, Phases phases) {
  check_common(transport, agreed, 1);
  if (agreed.wire == WireFormat::F32) {
    require(residual == nullptr, Status::InvalidArgument,
            agreed.to_string() + ": an fp32 reduction drops nothing, it takes no residual");
    auto schedule = std::make_unique<AllReduceSchedule>(transport.rank(), transport.size(), agreed,
                                                        buffer, tuning, phases);
    return std::make_unique<RingCollective>(transport, agreed, std::move(schedule), tuning);
  }
  wire_format_of(int(agreed.wire));
  require(agreed.dtype == DataType::F32 &&
              (agreed.op == ReduceOp::Sum || agreed.op == ReduceOp::Avg),
          Status::InvalidArgument,
          agreed.to_string() + ": a compressed reduction takes f32 data and sum or avg");
  auto schedule = std::make_unique<CompressedAllReduceSchedule>(
      transport.rank(), transport.size(), agreed, buffer, residual, segments, tuning, phases);
  return std::make_unique<RingCollective>(transport, agreed, std::move(schedule), tuning);
}

// Bytes `rank` sends in the steps of `phases`, every block in `format`.
uint64_t ring_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                         const Tuning& tuning, Phases phases, const SegmentStarts& segments = {}) {
  if (ranks <= 1 || count == 0) return 0;
  const size_t block_elements =
      chunk_elements(tuning, wire_element_bytes(format), ceil_div(count, size_t(ranks)));
  const int first = first_step(phases, ranks);
  uint64_t bytes = 0;
  for (size_t chunk = 0; chunk < segment_count(count, ranks, block_elements); ++chunk)
    for (int step = first; step < first + step_count(phases, ranks); ++step) {
      const Block sent = segment_block(count, block_elements, ranks, chunk, allreduce_send_block(rank, ranks, step));
      bytes += wire_bytes(format, sent.count, segments, sent.offset);
    }
  return bytes;
}

}  // namespace

std::unique_ptr<Collective> make_allreduce(PointToPoint& transport, const Descriptor& descriptor,
                                           void* buffer, const Tuning& tuning, float* residual,
                                           const SegmentStarts& segments) {
  return make_reduction(transport, normalised(descriptor, Kind::AllReduce), buffer, tuning,
                        residual, segments, Phases::Both);
}

std::unique_ptr<Collective> make_reduce_scatter(PointToPoint& transport,
                                                const Descriptor& descriptor, void* buffer,
                                                const Tuning& tuning, float* residual,
                                                const SegmentStarts& segments) {
  return make_reduction(transport, normalised(descriptor, Kind::ReduceScatter), buffer, tuning,
                        residual, segments, Phases::ReduceScatter);
}

std::unique_ptr<Collective> make_allgather_shards(PointToPoint& transport,
                                                  const Descriptor& descriptor, void* buffer,
                                                  const Tuning& tuning) {
  const Descriptor agreed = normalised(descriptor, Kind::AllGatherShards);
  require(agreed.wire == WireFormat::F32, Status::Unsupported,
          agreed.to_string() + ": the shard all-gather sends fp32 only (the owner's shard "
                               "already holds the decoded values of a compressed reduce-scatter)");
  return make_reduction(transport, agreed, buffer, tuning, nullptr, {}, Phases::AllGather);
}

uint64_t allreduce_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                              const Tuning& tuning, const SegmentStarts& segments) {
  return ring_wire_bytes(rank, ranks, count, format, tuning, Phases::Both, segments);
}

uint64_t reduce_scatter_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                                   const Tuning& tuning, const SegmentStarts& segments) {
  return ring_wire_bytes(rank, ranks, count, format, tuning, Phases::ReduceScatter, segments);
}

uint64_t allgather_shards_wire_bytes(int rank, int ranks, uint64_t count, const Tuning& tuning) {
  return ring_wire_bytes(rank, ranks, count, WireFormat::F32, tuning, Phases::AllGather);
}

std::unique_ptr<Collective> make_broadcast(PointToPoint& transport, const Descriptor& descriptor,
                                           void* buffer, const Tuning& tuning) {
  const Descriptor agreed = normalised(descriptor, Kind::Broadcast);
  check_common(transport, agreed, 1);
  require(agreed.root >= 0 && agreed.root < transport.size(), Status::InvalidArgument,
          agreed.to_string() + ": root out of range for " + std::to_string(transport.size()) +
              " ranks");
  auto schedule = std::make_unique<BroadcastSchedule>(transport.rank(), transport.size(), agreed,
                                                      buffer, tuning);
  return std::make_unique<RingCollective>(transport, agreed, std::move(schedule), tuning);
}

std::unique_ptr<Collective> make_allgather(PointToPoint& transport, const Descriptor& descriptor,
                                           const void* send, void* recv, const Tuning& tuning) {
  const Descriptor agreed = normalised(descriptor, Kind::AllGather);
  check_common(transport, agreed, size_t(transport.size()));
  auto schedule = std::make_unique<AllGatherSchedule>(transport.rank(), transport.size(), agreed,
                                                      send, recv, tuning);
  return std::make_unique<RingCollective>(transport, agreed, std::move(schedule), tuning);
}

}  // namespace co2::collectives

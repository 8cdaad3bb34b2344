// The ring all-reduce (reduce-scatter then all-gather of the shards), and each half alone.
#include <type_traits>

#include "runtime/collectives/ring.hpp"

namespace co2::collectives {

namespace {

using transport::Handle;
using transport::Outcome;
using transport::PointToPoint;

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
    return run_ring(transport, agreed, std::move(schedule), tuning);
  }
  wire_format_of(int(agreed.wire));
  require(agreed.dtype == DataType::F32 &&
              (agreed.op == ReduceOp::Sum || agreed.op == ReduceOp::Avg),
          Status::InvalidArgument,
          agreed.to_string() + ": a compressed reduction takes f32 data and sum or avg");
  auto schedule = make_compressed_allreduce_schedule(transport.rank(), transport.size(), agreed, buffer,
                                                    residual, segments, tuning, phases);
  return run_ring(transport, agreed, std::move(schedule), tuning);
}

// Bytes `rank` sends in the steps of `phases`, every block in `format`.
uint64_t ring_wire_bytes(int rank, int ranks, uint64_t count, WireFormat format,
                         const Tuning& tuning, Phases phases, const SegmentStarts& segments = {}) {
  if (ranks <= 1 || count == 0) return 0;
  const size_t block_elements =
      wire_chunk_elements(tuning, format, ceil_div(count, size_t(ranks)));
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

}  // namespace co2::collectives

// The compressed all-reduce: the all-reduce's ring with every message encoded in a wire format.
#include <cstring>
#include <vector>

#include "runtime/collectives/ring.hpp"
#include "runtime/outer/wire_format.hpp"

namespace co2::collectives {

namespace {

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
        block_elements_(wire_chunk_elements(tuning, wire_, ceil_div(count_, size_t(ranks)))),
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

}  // namespace

std::unique_ptr<RingSchedule> make_compressed_allreduce_schedule(int rank, int ranks, const Descriptor& descriptor,
                                                                 void* buffer, float* residual,
                                                                 const SegmentStarts& segments,
                                                                 const Tuning& tuning, Phases phases) {
  return std::make_unique<CompressedAllReduceSchedule>(rank, ranks, descriptor, buffer, residual, segments,
                                                       tuning, phases);
}

}  // namespace co2::collectives

// The broadcast: chunks flow down the chain root -> root+1 -> ... -> root-1, pipelined.
#include "runtime/collectives/ring.hpp"

namespace co2::collectives {

namespace {

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

}  // namespace

std::unique_ptr<Collective> make_broadcast(transport::PointToPoint& transport, const Descriptor& descriptor,
                                           void* buffer, const Tuning& tuning) {
  const Descriptor agreed = normalised(descriptor, Kind::Broadcast);
  check_common(transport, agreed, 1);
  require(agreed.root >= 0 && agreed.root < transport.size(), Status::InvalidArgument,
          agreed.to_string() + ": root out of range for " + std::to_string(transport.size()) +
              " ranks");
  auto schedule = std::make_unique<BroadcastSchedule>(transport.rank(), transport.size(), agreed,
                                                      buffer, tuning);
  return run_ring(transport, agreed, std::move(schedule), tuning);
}

}  // namespace co2::collectives

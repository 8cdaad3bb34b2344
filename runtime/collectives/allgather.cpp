// The all-gather: a ring, per chunk of every rank's block.
#include <cstring>

#include "runtime/collectives/ring.hpp"

namespace co2::collectives {

namespace {

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

}  // namespace

std::unique_ptr<Collective> make_allgather(transport::PointToPoint& transport, const Descriptor& descriptor,
                                           const void* send, void* recv, const Tuning& tuning) {
  const Descriptor agreed = normalised(descriptor, Kind::AllGather);
  check_common(transport, agreed, size_t(transport.size()));
  auto schedule = std::make_unique<AllGatherSchedule>(transport.rank(), transport.size(), agreed,
                                                      send, recv, tuning);
  return run_ring(transport, agreed, std::move(schedule), tuning);
}

}  // namespace co2::collectives

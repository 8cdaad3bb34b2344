// The ring every collective of collectives.hpp runs on, shared by their files: a schedule says
// what one rank sends to its successor and receives from its predecessor in each step of each
// chunk, run_ring drives it (ring.cpp), and the block layout of the all-reduce's ring that the
// reduction, its halves and the compressed all-reduce have in common.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "runtime/collectives/collectives.hpp"
#include "runtime/outer/wire_format.hpp"

namespace co2::collectives {

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

inline int ring_index(long long index, int ranks) {
  const long long wrapped = index % ranks;
  return int(wrapped < 0 ? wrapped + ranks : wrapped);
}

// Elements per message: chunk_bytes worth, at least one, at most what there is.
inline size_t chunk_elements(const Tuning& tuning, size_t element_bytes, size_t total_elements) {
  const size_t elements = std::max<size_t>(1, tuning.chunk_bytes / element_bytes);
  return std::min(elements, std::max<size_t>(1, total_elements));
}

// The same for values of `format` on the wire (a chunk budget counts message bytes).
inline size_t wire_chunk_elements(const Tuning& tuning, WireFormat format, size_t total_elements) {
  const size_t elements = std::max<size_t>(1, tuning.chunk_bytes * 8 / wire_element_bits(format));
  return std::min(elements, std::max<size_t>(1, total_elements));
}

inline size_t ceil_div(size_t value, size_t divisor) { return value / divisor + (value % divisor != 0); }

struct Block {
  size_t offset;
  size_t count;
};

// Block `index` of segment `chunk`: chunk `chunk` of shard `index`, at most `block_elements`
// long. Shards differ in length only at the end (shard_range), so the trailing shards' blocks
// run out first and are empty in the last segments.
inline Block segment_block(size_t count, size_t block_elements, int ranks, size_t chunk, int index) {
  const ShardRange shard = shard_range(count, ranks, index);
  const size_t first = std::min(shard.end, shard.begin + chunk * block_elements);
  const size_t last = std::min(shard.end, first + block_elements);
  return {first, last - first};
}

// Segments of an all-reduce: enough for the largest shard.
inline size_t segment_count(size_t count, int ranks, size_t block_elements) {
  return ceil_div(shard_size(count, ranks), block_elements);
}

// The block rank `rank` sends in step `step` of an all-reduce (AllReduceSchedule's ring); it
// receives the block before it. Block b starts its reduction at rank b+1 so that its last step
// (W-2) ends at rank b: rank r owns shard r.
inline int allreduce_send_block(int rank, int ranks, int step) {
  return step < ranks - 1 ? ring_index(rank - 1 - step, ranks)
                          : ring_index(rank - (step - (ranks - 1)), ranks);
}

inline int allreduce_recv_block(int rank, int ranks, int step) {
  return ring_index(allreduce_send_block(rank, ranks, step) - 1, ranks);
}

// Which steps of the all-reduce's ring a schedule runs: all 2(W-1), the reduce-scatter
// (0..W-2) or the all-gather (W-1..2W-3).
enum class Phases { Both, ReduceScatter, AllGather };

inline int first_step(Phases phases, int ranks) { return phases == Phases::AllGather ? ranks - 1 : 0; }
inline int step_count(Phases phases, int ranks) {
  return phases == Phases::Both ? 2 * (ranks - 1) : ranks - 1;
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

// Runs `schedule` for `descriptor` on the ring of `transport`: descriptor exchange first, then
// the chunks, at most tuning.max_chunks_in_flight at a time (ring.cpp).
std::unique_ptr<Collective> run_ring(transport::PointToPoint& transport, const Descriptor& descriptor,
                                     std::unique_ptr<RingSchedule> schedule, const Tuning& tuning);

// The descriptor of a `kind` collective, with the fields that do not apply to it zeroed.
Descriptor normalised(Descriptor descriptor, Kind kind);
// What every collective checks before it starts: the rank count, and that count elements (times
// total_elements_factor) fit in size_t.
void check_common(const transport::PointToPoint& transport, const Descriptor& descriptor,
                  size_t total_elements_factor);

// The compressed all-reduce's schedule (compressed_allreduce.cpp), for make_reduction.
std::unique_ptr<RingSchedule> make_compressed_allreduce_schedule(int rank, int ranks, const Descriptor& descriptor,
                                                                 void* buffer, float* residual,
                                                                 const SegmentStarts& segments,
                                                                 const Tuning& tuning, Phases phases);

}  // namespace co2::collectives

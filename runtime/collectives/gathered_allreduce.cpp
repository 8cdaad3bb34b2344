// The compressed all-reduce over a collective-kind transport (NCCL), which carries collectives and
// no point-to-point messages, so the ring that re-encodes partial sums hop by hop cannot run on it:
// every rank encodes its own values once, the encodings are all-gathered, and every rank decodes
// all of them in rank order. The same bytes decoded in the same order give every rank the same
// result; the cost is that each rank receives W - 1 encodings of the whole buffer (the ring: about
// two), so it moves fewer bytes than an fp32 ring only while W - 1 < 8 / (bits per value).
#include <cstring>

#include "runtime/collectives/collectives.hpp"
#include "runtime/collectives/ring.hpp"
#include "transports/collective.hpp"

namespace co2::collectives {

GatheredWire::GatheredWire(WireFormat wire_format, size_t element_count, int rank_count, const SegmentStarts& starts)
    : format(wire_format), count(element_count), ranks(rank_count), segments(starts) {
  size_t bytes = 0;
  for (int shard = 0; shard < ranks; ++shard) {
    shard_offsets.push_back(bytes);
    const transport::ShardRange range = transport::shard_range(count, ranks, shard);
    bytes += wire_bytes(format, range.count(), segments, range.begin);
  }
  words_per_rank = (bytes + sizeof(int64_t) - 1) / sizeof(int64_t);
}

void GatheredWire::encode(const float* values, float* residual, std::byte* block) const {
  for (int shard = 0; shard < ranks; ++shard) {
    const transport::ShardRange range = transport::shard_range(count, ranks, shard);
    if (range.count() == 0) continue;
    wire_encode(format, values + range.begin, range.count(), block + shard_offsets[size_t(shard)],
                residual ? residual + range.begin : nullptr, 1.0f, nullptr, segments, range.begin);
  }
}

void GatheredWire::decode(const std::byte* blocks, int shard, bool average, float* values) const {
  const transport::ShardRange range = transport::shard_range(count, ranks, shard);
  if (range.count() == 0) return;
  const size_t block_bytes = words_per_rank * sizeof(int64_t);
  for (int rank = 0; rank < ranks; ++rank)
    wire_decode(format, blocks + size_t(rank) * block_bytes + shard_offsets[size_t(shard)], range.count(),
                values + range.begin, /*accumulate=*/rank > 0, segments, range.begin);
  if (average) divide_typed(values + range.begin, range.count(), ranks);
}

uint64_t gathered_allreduce_wire_bytes(int ranks, uint64_t count, WireFormat format, const SegmentStarts& segments) {
  if (ranks <= 1) return 0;
  const GatheredWire wire(format, size_t(count), ranks, segments);
  return uint64_t(ranks - 1) * wire.words_per_rank * sizeof(int64_t);  // a ring all-gather forwards W - 1 blocks
}

}  // namespace co2::collectives

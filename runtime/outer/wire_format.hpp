// Wire formats of a compressed fp32 all-reduce: how a block of fp32 values travels between
// ranks (docs/algorithm.md, "Compressed outer all-reduce"). Arithmetic is always fp32; only the
// messages are narrower. Decoding is a pure function of the bytes, so every rank that decodes the
// same message gets the same floats.
//
// - F32: the floats as they are (4 bytes each).
// - BF16: the upper half of each float, rounded to nearest even (2 bytes each).
// - Int8: groups of at most kInt8Group values share one fp32 scale s = max|x| / 127 and travel
//   as round(x / s) in [-127, 127]: the group's scales first, then one byte per value
//   (1 + 4 / kInt8Group bytes each, plus one scale per segment start inside the range). A group
//   holding NaN or Inf has scale NaN and decodes to NaN, so a non-finite contribution still
//   makes the result non-finite. Groups never straddle a segment (SegmentStarts): a tensor with
//   small values is not quantized with the scale of a neighbour with large ones.
// - Fp4: as Int8 with groups of at most kFp4Group values, scale s = max|x| / 6, and each value
//   an FP4 E2M1 code (elements.hpp, fp4_code: sign and 0, 0.5, 1, 1.5, 2, 3, 4, 6), two per
//   byte, value i of the range in nibble i (4 + 32 / kFp4Group bits each).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace co2 {

enum class WireFormat : uint8_t { F32 = 0, BF16 = 1, Int8 = 2, Fp4 = 3 };
constexpr int kWireFormats = 4;

constexpr size_t kInt8Group = 128;
// Smaller than int8's: a 4-bit code has 15 levels, so one outlier costs its group more; 64
// keeps the scales at 0.5 bit per value (7.1x fewer bytes than fp32).
constexpr size_t kFp4Group = 64;

const char* wire_format_name(WireFormat format);
// Throws UnknownEnum for a value that is not a WireFormat.
WireFormat wire_format_of(int value);

// Where the segments (tensors) of a reduced buffer begin: int8 and fp4 groups start at every
// one of them, at the first element of every encoded range, and a group size (kInt8Group,
// kFp4Group) after the previous group start, so that no group (and no scale) is shared by two segments. `starts` ascend, in
// positions of the whole state: element i of the reduced buffer is position origin + i (a
// collective over a sub-range of the state passes that range's start). Empty: groups of
// the group size from each range's start. Every rank of a collective must pass the same starts
// (the engine's layout hash guarantees it); they decide the message sizes.
struct SegmentStarts {
  const size_t* starts = nullptr;
  size_t count = 0;
  size_t origin = 0;
};

// Bytes of the `count` values at element `offset` of the reduced buffer in `format`.
size_t wire_bytes(WireFormat format, size_t count, const SegmentStarts& segments = {}, size_t offset = 0);
// The most bytes any range of `count` values can take (a message buffer's size).
size_t wire_bytes_bound(WireFormat format, size_t count, const SegmentStarts& segments = {});
// Bits per value, without the scales (what a chunk budget in bytes is divided by).
size_t wire_element_bits(WireFormat format);

// out <- the wire form of in[0..count), the values at element `offset` of the reduced buffer.
// In the same pass, where not null: dropped[i] <- (in[i] - decoded value i) * dropped_scale,
// decoded[i] <- decoded value i (bit for bit what wire_decode of `out` gives; `decoded` may be
// `in`).
void wire_encode(WireFormat format, const float* in, size_t count, std::byte* out,
                 float* dropped = nullptr, float dropped_scale = 1.0f, float* decoded = nullptr,
                 const SegmentStarts& segments = {}, size_t offset = 0);
// out[i] <- decoded value i (accumulate: out[i] <- decoded + out[i], in that operand order);
// `segments` and `offset` as the encoding's.
void wire_decode(WireFormat format, const std::byte* in, size_t count, float* out, bool accumulate,
                 const SegmentStarts& segments = {}, size_t offset = 0);

}  // namespace co2

// Wire formats of a compressed fp32 all-reduce: how a block of fp32 values travels between
// ranks (docs/algorithm.md, "Compressed outer all-reduce"). Arithmetic is always fp32; only the
// messages are narrower. Decoding is a pure function of the bytes, so every rank that decodes the
// same message gets the same floats.
//
// - F32: the floats as they are (4 bytes each).
// - BF16: the upper half of each float, rounded to nearest even (2 bytes each).
// - Int8: groups of kInt8Group values share one fp32 scale s = max|x| / 127 and travel as
//   round(x / s) in [-127, 127]: the group's scales first, then one byte per value
//   (1 + 4 / kInt8Group bytes each). A group holding NaN or Inf has scale NaN and decodes to
//   NaN, so a non-finite contribution still makes the result non-finite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace co2 {

enum class WireFormat : uint8_t { F32 = 0, BF16 = 1, Int8 = 2 };
constexpr int kWireFormats = 3;

constexpr size_t kInt8Group = 128;

const char* wire_format_name(WireFormat format);
// Throws UnknownEnum for a value that is not a WireFormat.
WireFormat wire_format_of(int value);

// Bytes of `count` values in `format`.
size_t wire_bytes(WireFormat format, size_t count);
// Bytes per value, rounded down (the message size a chunk budget is divided by).
size_t wire_element_bytes(WireFormat format);

// out <- the wire form of in[0..count). In the same pass, where not null: dropped[i] <-
// (in[i] - decoded value i) * dropped_scale, decoded[i] <- decoded value i (bit for bit what
// wire_decode of `out` gives; `decoded` may be `in`).
void wire_encode(WireFormat format, const float* in, size_t count, std::byte* out,
                 float* dropped = nullptr, float dropped_scale = 1.0f, float* decoded = nullptr);
// out[i] <- decoded value i (accumulate: out[i] <- decoded + out[i], in that operand order).
void wire_decode(WireFormat format, const std::byte* in, size_t count, float* out, bool accumulate);

}  // namespace co2

#include "runtime/outer/wire_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/outer/elements.hpp"
#include "runtime/outer/param_types.hpp"
#include "runtime/base/status.hpp"

namespace co2 {

const char* wire_format_name(WireFormat format) {
  switch (format) {
    case WireFormat::F32: return "fp32";
    case WireFormat::BF16: return "bf16";
    case WireFormat::Int8: return "int8";
    case WireFormat::Fp4: return "fp4";
  }
  return "unknown";
}

WireFormat wire_format_of(int value) {
  require(value >= 0 && value < kWireFormats, Status::UnknownEnum,
          "unknown wire format " + std::to_string(value) +
              " (expected CO2_WIRE_FP32, CO2_WIRE_BF16, CO2_WIRE_INT8 or CO2_WIRE_FP4)");
  return WireFormat(value);
}

namespace {

// group(index, begin, end) for the groups of at most `size` of the `count` values at element
// `offset` of the reduced buffer, in order (see SegmentStarts).
template <typename Group>
void for_each_group(size_t size, size_t count, const SegmentStarts& segments, size_t offset, Group&& group) {
  const size_t position = segments.origin + offset;
  const size_t* const last = segments.starts + segments.count;
  // The first segment start after the range's first element (so *cut - position >= 1).
  const size_t* cut = segments.count ? std::upper_bound(segments.starts, last, position) : last;
  size_t index = 0;
  for (size_t begin = 0; begin < count; ++index) {
    while (cut != last && *cut - position <= begin) ++cut;
    size_t end = std::min(count, begin + size);
    if (cut != last) end = std::min(end, *cut - position);
    group(index, begin, end);
    begin = end;
  }
}

size_t groups(size_t size, size_t count, const SegmentStarts& segments, size_t offset) {
  if (segments.count == 0) return count / size + (count % size != 0);
  size_t n = 0;
  for_each_group(size, count, segments, offset, [&](size_t, size_t, size_t) { ++n; });
  return n;
}

// A group's scale from the largest magnitude through the bits: for non-negative floats their
// order is the integers' (an integer max vectorises, a float one does not without
// -ffast-math), and any NaN or Inf is at least 0x7f800000.
GroupScale scale_of_group(const float* in, size_t n, float top) {
  uint32_t bits[kInt8Group];
  std::memcpy(bits, in, n * sizeof(float));
  uint32_t largest = 0;
  for (size_t i = 0; i < n; ++i) largest = std::max(largest, bits[i] & 0x7fffffffu);
  float absmax;
  std::memcpy(&absmax, &largest, sizeof absmax);
  return group_scale_of(absmax, largest < 0x7f800000u, top);
}

// Chunks through a local array: the loops over it vectorise, and the byte buffers (whose blocks
// need not be aligned) are touched only by memcpy.
constexpr size_t kChunk = 256;

// What the encoding of x as `sent` dropped, and what every rank will decode (see wire_encode).
struct Drops {
  float* dropped;
  float scale;
  float* decoded;
  void record(size_t i, float x, float sent) const {
    if (dropped) dropped[i] = wire_dropped(x, sent, scale);
    if (decoded) decoded[i] = sent;
  }
  bool any() const { return dropped || decoded; }
};

void encode_bf16(const float* in, size_t count, std::byte* out, const Drops& drops) {
  uint16_t halves[kChunk];
  float values[kChunk], sent[kChunk];
  for (size_t begin = 0; begin < count; begin += kChunk) {
    const size_t n = std::min(kChunk, count - begin);
    std::memcpy(values, in + begin, n * sizeof(float));
    // The parameters' rounding (nearest even, a NaN stays a quiet NaN): one definition.
    for (size_t i = 0; i < n; ++i) halves[i] = narrow<Bf16>(values[i]).bits;
    std::memcpy(out + begin * sizeof(uint16_t), halves, n * sizeof(uint16_t));
    if (!drops.any()) continue;
    for (size_t i = 0; i < n; ++i) sent[i] = widen(Bf16{halves[i]});
    for (size_t i = 0; i < n; ++i) drops.record(begin + i, values[i], sent[i]);
  }
}

void decode_bf16(const std::byte* in, size_t count, float* out, bool accumulate) {
  uint16_t halves[kChunk];
  float values[kChunk];
  for (size_t begin = 0; begin < count; begin += kChunk) {
    const size_t n = std::min(kChunk, count - begin);
    std::memcpy(halves, in + begin * sizeof(uint16_t), n * sizeof(uint16_t));
    for (size_t i = 0; i < n; ++i) values[i] = widen(Bf16{halves[i]});
    float* o = out + begin;
    if (accumulate) {
      for (size_t i = 0; i < n; ++i) o[i] = values[i] + o[i];
    } else {
      std::memcpy(o, values, n * sizeof(float));
    }
  }
}

// A grouped message: the groups' fp32 scales first, then the codes.
size_t scales_bytes(size_t group, size_t count, const SegmentStarts& segments, size_t offset) {
  return groups(group, count, segments, offset) * sizeof(float);
}
void put_scale(std::byte* message, size_t g, float scale) { std::memcpy(message + g * sizeof(float), &scale, sizeof scale); }
float scale_at(const std::byte* message, size_t g) {
  float scale;
  std::memcpy(&scale, message + g * sizeof(float), sizeof scale);
  return scale;
}

void encode_int8(const float* in, size_t count, std::byte* out, const Drops& drops, const SegmentStarts& segments,
                 size_t offset) {
  std::byte* codes = out + scales_bytes(kInt8Group, count, segments, offset);
  for_each_group(kInt8Group, count, segments, offset, [&](size_t g, size_t begin, size_t end) {
    const GroupScale group = scale_of_group(in + begin, end - begin, kInt8Top);
    put_scale(out, g, group.scale);
    if (group.inverse == 0.0f) {  // zeros, or a non-finite group (its NaN scale makes it NaN)
      std::memset(codes + begin, 0, end - begin);
      for (size_t i = begin; drops.any() && i < end; ++i) drops.record(i, in[i], 0.0f * group.scale);
      return;
    }
    int8_t q[kInt8Group];
    for (size_t i = begin; i < end; ++i) q[i - begin] = int8_code(in[i], group.inverse);
    std::memcpy(codes + begin, q, end - begin);
    for (size_t i = begin; drops.any() && i < end; ++i) drops.record(i, in[i], int8_value(q[i - begin], group.scale));
  });
}

void decode_int8(const std::byte* in, size_t count, float* out, bool accumulate, const SegmentStarts& segments,
                 size_t offset) {
  const std::byte* codes = in + scales_bytes(kInt8Group, count, segments, offset);
  for_each_group(kInt8Group, count, segments, offset, [&](size_t g, size_t begin, size_t end) {
    const float scale = scale_at(in, g);
    int8_t q[kInt8Group];
    std::memcpy(q, codes + begin, end - begin);
    float* o = out + begin;
    if (accumulate) {
      for (size_t i = 0; i < end - begin; ++i) o[i] = int8_value(q[i], scale) + o[i];
    } else {
      for (size_t i = 0; i < end - begin; ++i) o[i] = int8_value(q[i], scale);
    }
  });
}

// Value i of a range is nibble i of its codes: the low half of byte i / 2 when i is even. A
// group may begin at an odd value (a segment start), so groups share bytes but not nibbles.
uint8_t nibble(const std::byte* codes, size_t i) {
  return uint8_t((std::to_integer<uint8_t>(codes[i / 2]) >> (i % 2 * 4)) & 0xfu);
}

void encode_fp4(const float* in, size_t count, std::byte* out, const Drops& drops, const SegmentStarts& segments,
                size_t offset) {
  std::byte* codes = out + scales_bytes(kFp4Group, count, segments, offset);
  std::memset(codes, 0, (count + 1) / 2);
  for_each_group(kFp4Group, count, segments, offset, [&](size_t g, size_t begin, size_t end) {
    const GroupScale group = scale_of_group(in + begin, end - begin, kFp4Top);
    put_scale(out, g, group.scale);
    // A zero or non-finite group: inverse 0 codes every value as +0 (a NaN scale decodes NaN).
    for (size_t i = begin; i < end; ++i) {
      const uint8_t code = fp4_code(in[i], group.inverse);
      codes[i / 2] |= std::byte(code << (i % 2 * 4));
      if (drops.any()) drops.record(i, in[i], fp4_value(code, group.scale));
    }
  });
}

void decode_fp4(const std::byte* in, size_t count, float* out, bool accumulate, const SegmentStarts& segments,
                size_t offset) {
  const std::byte* codes = in + scales_bytes(kFp4Group, count, segments, offset);
  for_each_group(kFp4Group, count, segments, offset, [&](size_t g, size_t begin, size_t end) {
    const float scale = scale_at(in, g);
    for (size_t i = begin; i < end; ++i) {
      const float value = fp4_value(nibble(codes, i), scale);
      out[i] = accumulate ? value + out[i] : value;
    }
  });
}

}  // namespace

size_t wire_bytes(WireFormat format, size_t count, const SegmentStarts& segments, size_t offset) {
  switch (format) {
    case WireFormat::F32: return count * sizeof(float);
    case WireFormat::BF16: return count * sizeof(uint16_t);
    case WireFormat::Int8: return count + groups(kInt8Group, count, segments, offset) * sizeof(float);
    case WireFormat::Fp4: return (count + 1) / 2 + groups(kFp4Group, count, segments, offset) * sizeof(float);
  }
  return 0;
}

size_t wire_bytes_bound(WireFormat format, size_t count, const SegmentStarts& segments) {
  // Each segment start inside a range adds at most one group to the aligned ones.
  const bool grouped = format == WireFormat::Int8 || format == WireFormat::Fp4;
  const size_t extra_scales = grouped ? segments.count * sizeof(float) : 0;
  return wire_bytes(format, count) + extra_scales;
}

size_t wire_element_bits(WireFormat format) {
  switch (format) {
    case WireFormat::F32: return 32;
    case WireFormat::BF16: return 16;
    case WireFormat::Int8: return 8;
    case WireFormat::Fp4: return 4;
  }
  return 32;
}

void wire_encode(WireFormat format, const float* in, size_t count, std::byte* out, float* dropped,
                 float dropped_scale, float* decoded, const SegmentStarts& segments, size_t offset) {
  const Drops drops{dropped, dropped_scale, decoded};
  switch (format) {
    case WireFormat::F32:
      if (count) std::memcpy(out, in, count * sizeof(float));
      for (size_t i = 0; drops.any() && i < count; ++i) drops.record(i, in[i], in[i]);
      return;
    case WireFormat::BF16:
      return encode_bf16(in, count, out, drops);
    case WireFormat::Int8:
      return encode_int8(in, count, out, drops, segments, offset);
    case WireFormat::Fp4:
      return encode_fp4(in, count, out, drops, segments, offset);
  }
}

void wire_decode(WireFormat format, const std::byte* in, size_t count, float* out, bool accumulate,
                 const SegmentStarts& segments, size_t offset) {
  switch (format) {
    case WireFormat::F32:
      if (!accumulate) {
        if (count) std::memcpy(out, in, count * sizeof(float));
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        float value;
        std::memcpy(&value, in + i * sizeof value, sizeof value);
        out[i] = value + out[i];
      }
      return;
    case WireFormat::BF16:
      return decode_bf16(in, count, out, accumulate);
    case WireFormat::Int8:
      return decode_int8(in, count, out, accumulate, segments, offset);
    case WireFormat::Fp4:
      return decode_fp4(in, count, out, accumulate, segments, offset);
  }
}

}  // namespace co2

#include "runtime/outer/wire_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "runtime/outer/codec_isa.hpp"
#include "runtime/outer/elements.hpp"
#include "runtime/outer/param_types.hpp"
#include "runtime/base/status.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#define CO2_CODEC_X86 1
#else
#define CO2_CODEC_X86 0
#endif

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

// The codec's loops, once per instruction set (wire_codec.inc, codec_isa.hpp). AVX-512 implies
// FMA in GCC, and the library is built with -ffp-contract=off (meson.build): no instruction set
// fuses a multiply and an add that the generic code rounds twice.
namespace generic_codec {
#include "runtime/outer/wire_codec.inc"
}  // namespace generic_codec
#if CO2_CODEC_X86
#pragma GCC push_options
#pragma GCC target("avx2")
namespace avx2_codec {
#include "runtime/outer/wire_codec.inc"
}  // namespace avx2_codec
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl")
namespace avx512_codec {
#include "runtime/outer/wire_codec.inc"
}  // namespace avx512_codec
#pragma GCC pop_options
#endif

// fp4's one-code-per-byte scratch, per thread (progress threads encode concurrently).
uint8_t* nibble_scratch(WireFormat format, size_t count) {
  if (format != WireFormat::Fp4) return nullptr;
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < count) scratch.resize(count);
  return scratch.data();
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
  uint8_t* const nibbles = nibble_scratch(format, count);
  switch (codec_isa()) {
#if CO2_CODEC_X86
    case CodecIsa::Avx512:
      return avx512_codec::encode(format, in, count, out, {dropped, dropped_scale, decoded}, segments, offset, nibbles);
    case CodecIsa::Avx2:
      return avx2_codec::encode(format, in, count, out, {dropped, dropped_scale, decoded}, segments, offset, nibbles);
#endif
    default:
      return generic_codec::encode(format, in, count, out, {dropped, dropped_scale, decoded}, segments, offset, nibbles);
  }
}

void wire_decode(WireFormat format, const std::byte* in, size_t count, float* out, bool accumulate,
                 const SegmentStarts& segments, size_t offset) {
  uint8_t* const nibbles = nibble_scratch(format, count);
  switch (codec_isa()) {
#if CO2_CODEC_X86
    case CodecIsa::Avx512:
      return avx512_codec::decode(format, in, count, out, accumulate, segments, offset, nibbles);
    case CodecIsa::Avx2:
      return avx2_codec::decode(format, in, count, out, accumulate, segments, offset, nibbles);
#endif
    default:
      return generic_codec::decode(format, in, count, out, accumulate, segments, offset, nibbles);
  }
}

}  // namespace co2

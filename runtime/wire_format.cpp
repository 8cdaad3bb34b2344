#include "runtime/wire_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/status.hpp"

namespace co2 {

const char* wire_format_name(WireFormat format) {
  switch (format) {
    case WireFormat::F32: return "fp32";
    case WireFormat::BF16: return "bf16";
    case WireFormat::Int8: return "int8";
  }
  return "unknown";
}

WireFormat wire_format_of(int value) {
  require(value >= 0 && value < kWireFormats, Status::UnknownEnum,
          "unknown wire format " + std::to_string(value) +
              " (expected CO2_WIRE_FP32, CO2_WIRE_BF16 or CO2_WIRE_INT8)");
  return WireFormat(value);
}

namespace {

size_t groups(size_t count) { return count / kInt8Group + (count % kInt8Group != 0); }

uint16_t bf16_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return uint16_t((bits >> 16) | 0x40);  // stays a (quiet) NaN
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return uint16_t((bits + rounding) >> 16);
}

float float_of_bf16(uint16_t half) {
  const uint32_t bits = uint32_t(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

void encode_int8(const float* in, size_t count, std::byte* out) {
  const size_t n_groups = groups(count);
  std::byte* codes = out + n_groups * sizeof(float);
  for (size_t g = 0; g < n_groups; ++g) {
    const size_t begin = g * kInt8Group, end = std::min(count, begin + kInt8Group);
    // Branch-free passes (they vectorise): x * 0 is 0 for finite x and NaN for NaN or Inf.
    float absmax = 0.0f, probe = 0.0f;
    for (size_t i = begin; i < end; ++i) {
      absmax = std::max(absmax, std::fabs(in[i]));
      probe += in[i] * 0.0f;
    }
    const bool finite = probe == 0.0f;
    float scale = finite ? absmax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    float inverse = finite && absmax > 0.0f ? 127.0f / absmax : 0.0f;
    // A group so small that its scale or inverse leaves the float range (absmax below about
    // 1e-36) travels as zeros; error feedback keeps it.
    if (finite && !(scale > 0.0f && inverse <= std::numeric_limits<float>::max())) scale = inverse = 0.0f;
    std::memcpy(out + g * sizeof(float), &scale, sizeof scale);
    for (size_t i = begin; i < end; ++i) {
      // Any rounding is correct (error feedback keeps what it drops); half away from zero is
      // the cheapest. |x| * 127 / absmax <= 127 up to one rounding: the clamp keeps it a byte.
      const float r = in[i] * inverse;
      const int q = int(r + (r >= 0.0f ? 0.5f : -0.5f));
      codes[i] = std::byte(uint8_t(int8_t(std::clamp(q, -127, 127))));
    }
  }
}

void decode_int8(const std::byte* in, size_t count, float* out, bool accumulate) {
  const size_t n_groups = groups(count);
  const std::byte* codes = in + n_groups * sizeof(float);
  for (size_t g = 0; g < n_groups; ++g) {
    float scale;
    std::memcpy(&scale, in + g * sizeof(float), sizeof scale);
    const size_t begin = g * kInt8Group, end = std::min(count, begin + kInt8Group);
    for (size_t i = begin; i < end; ++i) {
      const float value = float(int8_t(uint8_t(codes[i]))) * scale;
      out[i] = accumulate ? value + out[i] : value;
    }
  }
}

}  // namespace

size_t wire_bytes(WireFormat format, size_t count) {
  switch (format) {
    case WireFormat::F32: return count * sizeof(float);
    case WireFormat::BF16: return count * sizeof(uint16_t);
    case WireFormat::Int8: return count + groups(count) * sizeof(float);
  }
  return 0;
}

size_t wire_element_bytes(WireFormat format) {
  switch (format) {
    case WireFormat::F32: return 4;
    case WireFormat::BF16: return 2;
    case WireFormat::Int8: return 1;
  }
  return 4;
}

void wire_encode(WireFormat format, const float* in, size_t count, std::byte* out) {
  switch (format) {
    case WireFormat::F32:
      if (count) std::memcpy(out, in, count * sizeof(float));
      return;
    case WireFormat::BF16:
      for (size_t i = 0; i < count; ++i) {
        const uint16_t half = bf16_of(in[i]);
        std::memcpy(out + i * sizeof half, &half, sizeof half);
      }
      return;
    case WireFormat::Int8:
      return encode_int8(in, count, out);
  }
}

void wire_decode(WireFormat format, const std::byte* in, size_t count, float* out, bool accumulate) {
  switch (format) {
    case WireFormat::F32:
      for (size_t i = 0; i < count; ++i) {
        float value;
        std::memcpy(&value, in + i * sizeof value, sizeof value);
        out[i] = accumulate ? value + out[i] : value;
      }
      return;
    case WireFormat::BF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t half;
        std::memcpy(&half, in + i * sizeof half, sizeof half);
        const float value = float_of_bf16(half);
        out[i] = accumulate ? value + out[i] : value;
      }
      return;
    case WireFormat::Int8:
      return decode_int8(in, count, out, accumulate);
  }
}

}  // namespace co2

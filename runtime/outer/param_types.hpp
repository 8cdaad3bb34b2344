// The storage types of parameters (docs/algorithm.md, "Mixed precision"): fp32, bf16 and fp16.
// The outer state is fp32 whatever the parameters are; the host pass reads a parameter widened
// to fp32 (exact) and writes it back rounded to nearest, ties to even. The pass is a template
// over the parameter type, so that fp32 parameters run the same code as before (widen and
// narrow are the identity there) and no element pays for a dtype branch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/base/host_device.hpp"

namespace co2 {

struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

namespace param_detail {
CO2_HOST_DEVICE inline uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
CO2_HOST_DEVICE inline float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
}  // namespace param_detail

CO2_HOST_DEVICE inline float widen(float x) { return x; }

CO2_HOST_DEVICE inline float widen(Bf16 x) { return param_detail::float_of(uint32_t(x.bits) << 16); }

CO2_HOST_DEVICE inline float widen(Fp16 x) {
  using namespace param_detail;
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t magnitude = x.bits & 0x7fffu;
  const uint32_t exponent = magnitude >> 10;
  // Normal numbers: rebias the exponent (15 -> 127) by adding 112 to the field.
  uint32_t out = (magnitude << 13) + (112u << 23);
  // Inf and NaN (exponent 31): the fp32 exponent must be 255, another 128 - 16 on top.
  out = exponent == 31 ? out + (112u << 23) : out;
  // Subnormals (exponent 0): mantissa * 2^-24, computed exactly in fp32 by placing the
  // mantissa under the exponent of 2^-14 and subtracting that power.
  const float subnormal = float_of((magnitude << 13) + (113u << 23)) - float_of(113u << 23);
  out = exponent == 0 ? bits_of(subnormal) : out;
  return float_of(out | sign);
}

template <typename P>
CO2_HOST_DEVICE P narrow(float x);

template <>
CO2_HOST_DEVICE inline float narrow<float>(float x) {
  return x;
}

// Round to nearest even on the upper 16 bits; a NaN stays a NaN (quiet bit set: rounding the
// payload away could otherwise make it an infinity).
template <>
CO2_HOST_DEVICE inline Bf16 narrow<Bf16>(float x) {
  const uint32_t u = param_detail::bits_of(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return Bf16{uint16_t(nan ? (u >> 16) | 0x40u : rounded)};
}

// Round to nearest even; beyond the largest half (65504, with its rounding half-ulp) gives
// infinity, tiny values become subnormals or zero, NaN stays NaN.
template <>
CO2_HOST_DEVICE inline Fp16 narrow<Fp16>(float x) {
  using namespace param_detail;
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal range: rebias the exponent (127 -> 15), then round the 13 dropped bits to even.
  const uint32_t rebased = a - (112u << 23);
  const uint32_t normal = (rebased + 0xfffu + ((rebased >> 13) & 1u)) >> 13;
  // Below 2^-14 the result is subnormal: adding 0.5 (as an fp32 whose ulp is 2^-24, the
  // subnormal step) lets the fp32 adder do the rounding, ties to even included.
  const uint32_t subnormal = bits_of(float_of(a) + 0.5f) - bits_of(0.5f);
  uint32_t out = a < (113u << 23) ? subnormal : normal;
  // 65520 = 65504 + half an ulp and above rounds to infinity (the normal path would carry
  // into the exponent 31 with a wrong mantissa beyond it).
  out = a >= 0x477ff000u ? 0x7c00u : out;
  out = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : out;
  return Fp16{uint16_t(out | sign)};
}

// R(x) widened: the value a P parameter holds once it is set to x. A round's deltas are taken
// from it, the start the rank really trained from (a master copy's delta, docs/algorithm.md,
// "Mixed precision"), never from the fp32 x itself. The identity for fp32.
template <typename P>
CO2_HOST_DEVICE inline float stored_value(float x) {
  return widen(narrow<P>(x));
}

// dst[i] = widen(src[i]); for fp32 a copy.
template <typename P>
void widen_into(const P* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = widen(src[i]);
}
template <>
inline void widen_into<float>(const float* src, float* dst, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

// dst[i] = narrow(src[i]); for fp32 a copy.
template <typename P>
void narrow_into(const float* src, P* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = narrow<P>(src[i]);
}
template <>
inline void narrow_into<float>(const float* src, float* dst, size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}

}  // namespace co2

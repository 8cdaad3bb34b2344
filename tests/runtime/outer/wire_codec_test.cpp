// The wire codec on every instruction set this CPU has (runtime/outer/codec_isa.hpp): the same
// bytes, residuals and decoded floats as the generic code, on values chosen to reach every
// branch of the formats (zero, tiny and non-finite groups, ties, signed zeros, groups cut at odd
// segment starts). Ranks on different CPUs must stay bitwise equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/base/status.hpp"
#include "runtime/outer/codec_isa.hpp"
#include "runtime/outer/elements.hpp"
#include "runtime/outer/wire_format.hpp"

namespace {

using co2::CodecIsa;
using co2::WireFormat;

std::vector<float> awkward_values(size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::student_t_distribution<float> heavy(3.0f);
  std::uniform_int_distribution<int> kind(0, 39);
  std::vector<float> values(count);
  for (size_t i = 0; i < count; ++i) {
    switch (kind(random)) {
      case 0: values[i] = std::numeric_limits<float>::quiet_NaN(); break;
      case 1: values[i] = -std::numeric_limits<float>::infinity(); break;
      case 2: values[i] = 1e-41f; break;  // subnormal
      case 3: values[i] = -0.0f; break;
      case 4: values[i] = 0.75f; break;   // a tie of fp4 when it is the group's 1/6 of 4.5
      default: values[i] = 1e-3f * heavy(random);
    }
  }
  // Whole groups of zeros, of tiny values, and one with an exact fp4 tie pattern.
  for (size_t i = 0; i < std::min<size_t>(count, 200); ++i) values[i] = 0.0f;
  for (size_t i = 200; i < std::min<size_t>(count, 330); ++i) values[i] = 1e-39f;
  for (size_t i = 330; i < std::min<size_t>(count, 394); ++i) values[i] = 0.25f * float(i % 25);
  return values;
}

struct Encoded {
  std::vector<std::byte> message;
  std::vector<float> dropped, decoded, accumulated;
};

Encoded run_codec(WireFormat format, const std::vector<float>& values, const co2::SegmentStarts& segments,
                  size_t offset, bool feedback) {
  Encoded out;
  const size_t count = values.size();
  out.message.assign(co2::wire_bytes(format, count, segments, offset), std::byte{0x5a});
  out.dropped.assign(count, 7.0f);
  out.decoded = values;  // decoded in place, as the owner's step does
  co2::wire_encode(format, values.data(), count, out.message.data(), feedback ? out.dropped.data() : nullptr, 3.0f,
                   feedback ? out.decoded.data() : nullptr, segments, offset);
  out.accumulated.assign(count, 0.5f);
  co2::wire_decode(format, out.message.data(), count, out.accumulated.data(), /*accumulate=*/true, segments, offset);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class IsaGuard {
 public:
  IsaGuard() : saved_(co2::codec_isa()) {}
  ~IsaGuard() { co2::force_codec_isa(saved_); }

 private:
  CodecIsa saved_;
};

TEST(WireCodec, EveryInstructionSetGivesTheGenericBytesAndFloats) {
  IsaGuard guard;
  const std::vector<CodecIsa> isas = co2::available_codec_isas();
  ASSERT_EQ(isas.front(), CodecIsa::Generic);
  std::printf("instruction sets: ");
  for (CodecIsa isa : isas) std::printf("%s ", co2::codec_isa_name(isa));
  std::printf("\n");
  const std::vector<size_t> starts = {0, 5, 17, 18, 301, 302, 999, 1000, 4097, 9001};
  for (const WireFormat format : {WireFormat::F32, WireFormat::BF16, WireFormat::Int8, WireFormat::Fp4}) {
    for (const size_t count : {size_t(0), size_t(1), size_t(2), size_t(63), size_t(65), size_t(129),
                               size_t(1001), size_t(20011)}) {
      for (const size_t offset : {size_t(0), size_t(3)}) {
        for (const bool feedback : {false, true}) {
          const std::vector<float> values = awkward_values(count, uint32_t(count * 7 + offset));
          const co2::SegmentStarts segments{starts.data(), starts.size(), 1};
          co2::force_codec_isa(CodecIsa::Generic);
          const Encoded reference = run_codec(format, values, segments, offset, feedback);
          for (CodecIsa isa : isas) {
            co2::force_codec_isa(isa);
            const Encoded got = run_codec(format, values, segments, offset, feedback);
            const std::string where = std::string(co2::wire_format_name(format)) + " " + co2::codec_isa_name(isa) +
                                      " count " + std::to_string(count) + " offset " + std::to_string(offset) +
                                      (feedback ? " with feedback" : "");
            ASSERT_EQ(got.message, reference.message) << where;
            ASSERT_TRUE(same_bits(got.dropped, reference.dropped)) << where;
            ASSERT_TRUE(same_bits(got.decoded, reference.decoded)) << where;
            ASSERT_TRUE(same_bits(got.accumulated, reference.accumulated)) << where;
          }
        }
      }
    }
  }
}

// The decoded owner's values are what every rank decodes from the message, on every ISA.
TEST(WireCodec, EncodedDecodedValuesAreWhatDecodingGives) {
  IsaGuard guard;
  const std::vector<float> values = awkward_values(5000, 11);
  for (CodecIsa isa : co2::available_codec_isas()) {
    co2::force_codec_isa(isa);
    for (const WireFormat format : {WireFormat::BF16, WireFormat::Int8, WireFormat::Fp4}) {
      std::vector<std::byte> message(co2::wire_bytes(format, values.size()));
      std::vector<float> decoded(values.size()), fresh(values.size());
      co2::wire_encode(format, values.data(), values.size(), message.data(), nullptr, 1.0f, decoded.data());
      co2::wire_decode(format, message.data(), values.size(), fresh.data(), /*accumulate=*/false);
      EXPECT_TRUE(same_bits(decoded, fresh)) << co2::wire_format_name(format) << " " << co2::codec_isa_name(isa);
    }
  }
}

// fp4_value spells E2M1 through float bits: every code against the format's table.
TEST(WireCodec, Fp4ValuesAreTheE2M1Table) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    const float expected = (code & 8u ? -magnitudes[code & 7u] : magnitudes[code & 7u]) * 0.375f;
    const float got = co2::fp4_value(code, 0.375f);
    EXPECT_EQ(std::signbit(got), bool(code & 8u)) << int(code);
    EXPECT_EQ(got, expected) << int(code);
  }
}

TEST(WireCodec, TheVariableNamesAnInstructionSetOrFails) {
  EXPECT_EQ(co2::parse_codec_isa("generic"), CodecIsa::Generic);
  try {
    co2::parse_codec_isa("avx3");
    FAIL() << "avx3 was accepted";
  } catch (const co2::Error& e) {
    EXPECT_EQ(e.status(), co2::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("CO2_WIRE_CODEC=avx3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("generic, avx2 or avx512"), std::string::npos) << e.what();
  }
  const std::vector<CodecIsa> isas = co2::available_codec_isas();
  for (CodecIsa isa : {CodecIsa::Avx2, CodecIsa::Avx512}) {
    const bool available = std::find(isas.begin(), isas.end(), isa) != isas.end();
    if (available) {
      EXPECT_EQ(co2::parse_codec_isa(co2::codec_isa_name(isa)), isa);
    } else {
      EXPECT_THROW(co2::parse_codec_isa(co2::codec_isa_name(isa)), co2::Error);
    }
  }
}

}  // namespace

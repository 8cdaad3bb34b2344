// Benchmark: the wire codec's throughput on one core, per format and instruction set, in GB/s of
// fp32 values (4 bytes per value) through encode and through decode (docs/benchmarks.md).
//
//   build/bench/codec [--millions 4] [--repeats 7]
//
// "encode" is the all-reduce's step: encode with error feedback (the residual and, for the
// owner, the decoded values written back); "decode" accumulates into fp32 values, as a
// reduce-scatter step does; "round trip" is one of each, what a ring step costs the core per
// value it forwards. Every instruction set the CPU has is run, and each must give the scalar
// code's bytes (the program exits 1 otherwise).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/outer/codec_isa.hpp"
#include "runtime/outer/wire_format.hpp"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double best_seconds(int repeats, F&& f) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t millions = 4;
  int repeats = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--millions") millions = std::strtoul(argv[i + 1], nullptr, 10);
    else if (flag == "--repeats") repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: codec [--millions N] [--repeats R]\n");
      return 2;
    }
  }
  const size_t count = millions << 20;
  std::mt19937 random(7);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> values(count);
  for (float& v : values) v = 1e-3f * heavy(random);
  // Segment starts every 3001 values: groups cut at odd positions, as a real layout's are.
  std::vector<size_t> starts;
  for (size_t s = 0; s < count; s += 3001) starts.push_back(s);
  const co2::SegmentStarts segments{starts.data(), starts.size(), 0};

  std::printf("# wire codec, one core, %zu Mi values (GB/s of fp32 values)\n", millions);
  std::printf("%-6s %-8s %10s %10s %12s\n", "format", "isa", "encode", "decode", "round trip");
  int failures = 0;
  for (const co2::WireFormat format : {co2::WireFormat::BF16, co2::WireFormat::Int8, co2::WireFormat::Fp4}) {
    std::vector<std::byte> reference;
    for (const co2::CodecIsa isa : co2::available_codec_isas()) {
      co2::force_codec_isa(isa);
      std::vector<std::byte> message(co2::wire_bytes_bound(format, count, segments));
      std::vector<float> residual(count), decoded(count), sum(count, 0.0f);
      const double encode = best_seconds(repeats, [&] {
        co2::wire_encode(format, values.data(), count, message.data(), residual.data(), 2.0f,
                         decoded.data(), segments, 0);
      });
      const double decode = best_seconds(repeats, [&] {
        co2::wire_decode(format, message.data(), count, sum.data(), /*accumulate=*/true, segments, 0);
      });
      const size_t bytes = co2::wire_bytes(format, count, segments, 0);
      if (reference.empty()) {
        reference.assign(message.begin(), message.begin() + bytes);
      } else if (std::memcmp(reference.data(), message.data(), bytes) != 0) {
        std::printf("%-6s %-8s differs from the scalar codec's bytes\n", co2::wire_format_name(format),
                    co2::codec_isa_name(isa));
        ++failures;
      }
      const double gb = double(count) * sizeof(float) / 1e9;
      std::printf("%-6s %-8s %10.2f %10.2f %12.2f\n", co2::wire_format_name(format), co2::codec_isa_name(isa),
                  gb / encode, gb / decode, gb / (encode + decode));
    }
  }
  co2::force_codec_isa(co2::available_codec_isas().back());
  return failures ? 1 : 0;
}

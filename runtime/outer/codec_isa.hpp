// Which instruction set the wire codec (wire_format.cpp) runs: the best this CPU has, unless
// CO2_WIRE_CODEC names another. Every one gives the same bytes and the same floats (the codec's
// element math has no fused multiply-add and no reassociation, so a wider vector changes how
// many values one instruction handles, never a result): ranks on different CPUs stay bitwise
// equal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace co2 {

// generic: compiled for the build's baseline (SSE2 on x86-64, what any other CPU has).
enum class CodecIsa : uint8_t { Generic = 0, Avx2 = 1, Avx512 = 2 };

const char* codec_isa_name(CodecIsa isa);

// The instruction sets this CPU (and this build) can run, Generic first, the best last.
std::vector<CodecIsa> available_codec_isas();

// The codec's instruction set, chosen at first use: CO2_WIRE_CODEC (generic, avx2, avx512)
// where set, else the best available. Throws InvalidArgument for a value that is not one of
// those or that this CPU cannot run (the communicator's creation calls it, so a typo fails there
// and not on the progress thread).
CodecIsa codec_isa();

// For tests and benchmarks: run `isa` from now on (it must be available).
void force_codec_isa(CodecIsa isa);

// CO2_WIRE_CODEC's text to an instruction set; throws InvalidArgument naming the choices.
CodecIsa parse_codec_isa(const std::string& text);

}  // namespace co2

#include "runtime/outer/codec_isa.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "runtime/base/status.hpp"

namespace co2 {

namespace {

constexpr const char* kVariable = "CO2_WIRE_CODEC";

bool cpu_has(CodecIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (isa) {
    case CodecIsa::Generic: return true;
    case CodecIsa::Avx2: return __builtin_cpu_supports("avx2");
    case CodecIsa::Avx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  }
  return false;
#else
  return isa == CodecIsa::Generic;
#endif
}

// -1: not chosen yet.
std::atomic<int> chosen{-1};

}  // namespace

const char* codec_isa_name(CodecIsa isa) {
  switch (isa) {
    case CodecIsa::Generic: return "generic";
    case CodecIsa::Avx2: return "avx2";
    case CodecIsa::Avx512: return "avx512";
  }
  return "unknown";
}

std::vector<CodecIsa> available_codec_isas() {
  std::vector<CodecIsa> isas;
  for (CodecIsa isa : {CodecIsa::Generic, CodecIsa::Avx2, CodecIsa::Avx512})
    if (cpu_has(isa)) isas.push_back(isa);
  return isas;
}

CodecIsa parse_codec_isa(const std::string& text) {
  for (CodecIsa isa : {CodecIsa::Generic, CodecIsa::Avx2, CodecIsa::Avx512}) {
    if (text != codec_isa_name(isa)) continue;
    require(cpu_has(isa), Status::InvalidArgument,
            std::string(kVariable) + "=" + text + ": this CPU (or build) cannot run it; available: " +
                codec_isa_name(available_codec_isas().back()) + " and below");
    return isa;
  }
  fail(Status::InvalidArgument,
       std::string(kVariable) + "=" + text + ": expected generic, avx2 or avx512 (or unset: the best this CPU has)");
}

CodecIsa codec_isa() {
  const int known = chosen.load(std::memory_order_acquire);
  if (known >= 0) return CodecIsa(known);
  const char* text = std::getenv(kVariable);
  const CodecIsa isa = text && *text ? parse_codec_isa(text) : available_codec_isas().back();
  chosen.store(int(isa), std::memory_order_release);
  return isa;
}

void force_codec_isa(CodecIsa isa) {
  require(cpu_has(isa), Status::InvalidArgument,
          std::string("codec instruction set ") + codec_isa_name(isa) + " is not available on this CPU");
  chosen.store(int(isa), std::memory_order_release);
}

}  // namespace co2

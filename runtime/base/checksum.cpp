#include "runtime/base/checksum.hpp"

#include <zlib.h>

#include <cstring>

namespace co2 {

void WordHasher::update(const float* x, size_t n) {
  constexpr uint64_t kPrime = 0x100000001b3ull;  // odd: multiplication is a bijection mod 2^64
  for (size_t i = 0; i < n; ++i) {
    uint32_t word;
    std::memcpy(&word, x + i, sizeof word);
    uint64_t& lane = lane_[words_++ & 3];
    lane = (lane ^ word) * kPrime;
  }
}

uint64_t WordHasher::digest() const {
  uint64_t h = words_;
  for (uint64_t lane : lane_) {
    h ^= lane + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h;
}

void ByteHasher::update(const void* data, size_t length) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < length; ++i) {
    state_ ^= bytes[i];
    state_ *= 0x100000001b3ull;
  }
}

void ByteHasher::update_string(const std::string& s) {
  update_u64(s.size());
  update(s.data(), s.size());
}

uint32_t crc32_update(uint32_t crc, const void* data, size_t length) {
  // zlib takes uInt lengths: feed a longer buffer in pieces.
  const auto* bytes = static_cast<const Bytef*>(data);
  while (length > 0) {
    const uInt piece = length > (1u << 30) ? uInt(1u << 30) : uInt(length);
    crc = uint32_t(::crc32(crc, bytes, piece));
    bytes += piece;
    length -= piece;
  }
  return crc;
}

}  // namespace co2

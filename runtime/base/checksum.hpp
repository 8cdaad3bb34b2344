// Hashes the engine compares across ranks (anchor checksum, layout hash) and the CRC-32 that
// protects checkpoints.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace co2 {

// 64-bit hash over 32-bit words in four interleaved lanes (each step is a bijection of the lane
// state, so a change of a single word, e.g. 1 ulp of one float, always changes the result).
class WordHasher {
 public:
  void update(const float* x, size_t n);
  uint64_t digest() const;

 private:
  uint64_t lane_[4] = {0x9e3779b97f4a7c15ull, 0xbf58476d1ce4e5b9ull, 0x94d049bb133111ebull,
                       0x2545f4914f6cdd1dull};
  uint64_t words_ = 0;
};

// FNV-1a over bytes, for the layout description.
class ByteHasher {
 public:
  void update(const void* data, size_t length);
  void update_string(const std::string& s);
  void update_u64(uint64_t v) { update(&v, sizeof v); }
  uint64_t digest() const { return state_; }

 private:
  uint64_t state_ = 0xcbf29ce484222325ull;
};

// CRC-32 (IEEE 802.3, reflected; zlib's crc32), incremental: crc = crc32_update(crc, data, length),
// starting from 0.
uint32_t crc32_update(uint32_t crc, const void* data, size_t length);

}  // namespace co2

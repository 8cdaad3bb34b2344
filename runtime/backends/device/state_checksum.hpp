// The anchor check's hash on the device: a sum, modulo 2^64, of one mixed term per element (its
// fp32 bits and its index). Addition is associative and commutative, so the GPU's blocks may
// add their partial sums in any order and every rank still gets the same value: no copy of the
// state to the host, no single CPU thread over N elements. Only ranks on the device backend
// compare it (the placement is part of the layout hash), so it need not equal the host's
// WordHasher. The term is shared by the kernel and the host reference its tests use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "runtime/outer/boundary_pass.hpp"  // CO2_HOST_DEVICE

namespace co2::device {

// splitmix64's finaliser over (index, bits): a swapped pair, a flipped bit or a shifted segment
// all change the sum.
CO2_HOST_DEVICE inline uint64_t checksum_term(uint32_t bits, uint64_t index) {
  uint64_t x = (index << 32) ^ (index >> 32) ^ bits;
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Host reference (tests): the sum over data[0, n) in index order.
inline uint64_t state_checksum(const float* data, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    sum += checksum_term(bits, i);
  }
  return sum;
}

}  // namespace co2::device

// The device anchor check's hash (runtime/backends/device/state_checksum.hpp), through its host reference:
// the kernel adds the same terms in an order the GPU chooses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/backends/device/state_checksum.hpp"

namespace co2::device {
namespace {

std::vector<float> random_state(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

TEST(StateChecksum, DoesNotDependOnTheOrderTheTermsAreAdded) {
  const auto x = random_state(10007, 1);
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::shuffle(order.begin(), order.end(), std::mt19937(2));
  uint64_t shuffled = 0;
  for (size_t i : order) shuffled += checksum_term(bits_of(x[i]), i);
  EXPECT_EQ(shuffled, state_checksum(x.data(), x.size()));
}

TEST(StateChecksum, ChangesWithAnyBitAnySwapAndAnyShift) {
  const auto x = random_state(4096, 3);
  const uint64_t base = state_checksum(x.data(), x.size());
  for (size_t i : {size_t(0), size_t(17), size_t(4095)})
    for (int bit : {0, 1, 22, 31}) {
      auto y = x;
      uint32_t b = bits_of(y[i]) ^ (1u << bit);
      std::memcpy(&y[i], &b, sizeof b);
      EXPECT_NE(state_checksum(y.data(), y.size()), base) << "element " << i << " bit " << bit;
    }
  auto swapped = x;
  std::swap(swapped[5], swapped[6]);
  EXPECT_NE(state_checksum(swapped.data(), swapped.size()), base);
  // A segment registered one element later: the same values at other indices.
  std::vector<float> shifted(x.size() + 1, 0.0f);
  std::copy(x.begin(), x.end(), shifted.begin() + 1);
  std::vector<float> padded(x.begin(), x.end());
  padded.push_back(0.0f);
  EXPECT_NE(state_checksum(shifted.data(), shifted.size()), state_checksum(padded.data(), padded.size()));
  // -0 and +0 are different bits: a rank whose anchor holds -0 where others hold +0 is noticed.
  std::vector<float> zeros(8, 0.0f), negative = zeros;
  negative[3] = -0.0f;
  EXPECT_NE(state_checksum(zeros.data(), 8), state_checksum(negative.data(), 8));
}

}  // namespace
}  // namespace co2::device

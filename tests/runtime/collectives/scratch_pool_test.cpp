// The collectives' scratch pool: reuse, no double lease, the idle cap.
#include <gtest/gtest.h>

#include <vector>

#include "runtime/collectives/scratch_pool.hpp"

namespace co2::collectives {
namespace {

TEST(ScratchPool, ReturnsAReleasedBufferToTheNextLeaseOfASimilarSize) {
  std::byte* first = nullptr;
  {
    ScratchLease lease = lease_scratch(1000);
    ASSERT_NE(lease.data(), nullptr);
    EXPECT_GE(lease.size(), 1000u);
    first = lease.data();
  }
  EXPECT_GE(scratch_pool_idle_bytes(), 1000u);
  ScratchLease again = lease_scratch(900);
  EXPECT_EQ(again.data(), first) << "a warm buffer was not reused";
}

TEST(ScratchPool, NeverHandsOutABufferThatIsLeased) {
  ScratchLease a = lease_scratch(4096);
  ScratchLease b = lease_scratch(4096);
  EXPECT_NE(a.data(), b.data());
  std::byte* const held = a.data();
  ScratchLease moved = std::move(a);
  EXPECT_EQ(moved.data(), held);
  EXPECT_EQ(a.data(), nullptr);
  ScratchLease c = lease_scratch(4096);
  EXPECT_NE(c.data(), held);
  EXPECT_NE(c.data(), b.data());
}

TEST(ScratchPool, DoesNotHandAFarLargerBufferToASmallRequest) {
  std::byte* large = nullptr;
  {
    ScratchLease lease = lease_scratch(1 << 20);
    large = lease.data();
  }
  ScratchLease small = lease_scratch(1000);
  EXPECT_NE(small.data(), large);
  EXPECT_LT(small.size(), size_t(1) << 20);
}

TEST(ScratchPool, KeepsNoMoreThanItsIdleCap) {
  std::vector<ScratchLease> leases;
  const size_t piece = kScratchPoolIdleBytes / 8;
  for (int i = 0; i < 16; ++i) leases.push_back(lease_scratch(piece));
  leases.clear();
  EXPECT_LE(scratch_pool_idle_bytes(), kScratchPoolIdleBytes);
  EXPECT_GE(scratch_pool_idle_bytes(), kScratchPoolIdleBytes - piece);
}

}  // namespace
}  // namespace co2::collectives

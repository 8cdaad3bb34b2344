// Scratch memory of the ring collectives (reduction blocks, encoded messages, staged receives),
// kept between collectives. A fresh allocation per collective faults its pages in (and a vector
// zero-fills them) on every round, on the progress thread's core: reused buffers are warm.
#pragma once

#include <cstddef>
#include <memory>

namespace co2::collectives {

// Idle buffers kept for reuse, in bytes over all communicators of the process; what is freed
// beyond it goes back to the allocator. Enough for a few collectives' slots at the default
// chunk size (a slot holds one or two chunks).
inline constexpr size_t kScratchPoolIdleBytes = size_t(64) << 20;

// A buffer of at least the asked size, uninitialised, returned to the pool when the lease ends.
// A collective whose receives may still land after it failed is kept alive with its leases, so
// memory the transport may write is never handed out again.
class ScratchLease {
 public:
  ScratchLease() = default;
  ScratchLease(ScratchLease&& other) noexcept;
  ScratchLease& operator=(ScratchLease&& other) noexcept;
  ScratchLease(const ScratchLease&) = delete;
  ScratchLease& operator=(const ScratchLease&) = delete;
  ~ScratchLease();

  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  friend ScratchLease lease_scratch(size_t bytes);
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
};

// The smallest idle buffer that holds `bytes` and wastes at most as much again, or a new one.
ScratchLease lease_scratch(size_t bytes);

// Bytes idle in the pool now (for tests).
size_t scratch_pool_idle_bytes();

}  // namespace co2::collectives

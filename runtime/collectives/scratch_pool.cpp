#include "runtime/collectives/scratch_pool.hpp"

#include <mutex>
#include <utility>
#include <vector>

namespace co2::collectives {

namespace {

struct IdleBuffer {
  std::unique_ptr<std::byte[]> data;
  size_t size;
};

struct Pool {
  std::mutex mutex;
  std::vector<IdleBuffer> idle;
  size_t idle_bytes = 0;
};

// Never destroyed: leases of communicators that outlive static destruction still return here.
Pool& pool() {
  static Pool* const instance = new Pool;
  return *instance;
}

void give_back(std::unique_ptr<std::byte[]> data, size_t size) {
  if (!data) return;
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  if (p.idle_bytes + size > kScratchPoolIdleBytes) return;  // `data` is freed on return
  p.idle_bytes += size;
  p.idle.push_back({std::move(data), size});
}

}  // namespace

ScratchLease::ScratchLease(ScratchLease&& other) noexcept
    : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}

ScratchLease& ScratchLease::operator=(ScratchLease&& other) noexcept {
  if (this != &other) {
    give_back(std::move(data_), size_);
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ScratchLease::~ScratchLease() { give_back(std::move(data_), size_); }

ScratchLease lease_scratch(size_t bytes) {
  ScratchLease lease;
  if (bytes == 0) return lease;
  {
    Pool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    size_t best = p.idle.size();
    for (size_t i = 0; i < p.idle.size(); ++i) {
      const size_t size = p.idle[i].size;
      if (size >= bytes && size / 2 <= bytes && (best == p.idle.size() || size < p.idle[best].size)) best = i;
    }
    if (best < p.idle.size()) {
      lease.data_ = std::move(p.idle[best].data);
      lease.size_ = p.idle[best].size;
      p.idle_bytes -= lease.size_;
      p.idle[best] = std::move(p.idle.back());
      p.idle.pop_back();
      return lease;
    }
  }
  lease.data_.reset(new std::byte[bytes]);  // uninitialised: every user writes before it reads
  lease.size_ = bytes;
  return lease;
}

size_t scratch_pool_idle_bytes() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.idle_bytes;
}

}  // namespace co2::collectives

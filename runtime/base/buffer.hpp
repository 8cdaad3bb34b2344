// Engine-owned fp32 host memory, 64-byte aligned and zero-initialised.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace co2 {

class FloatBuffer {
 public:
  FloatBuffer() = default;
  explicit FloatBuffer(size_t count) : count_(count) {
    if (count == 0) return;
    const size_t bytes = bytes_of(count);
    if (bytes >= kMappedBytes) {
      // Straight from the kernel: the pages are zero already and map on first touch, so a
      // buffer written before it is read (a receive, the next pass) never pays for zeroing;
      // transparent huge pages where the kernel allows them (a fault per 2 MiB, not per 4 KiB).
      void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
      madvise(mapped, bytes, MADV_HUGEPAGE);  // advice: refused where THP is off, which is fine
#endif
      data_ = static_cast<float*>(mapped);
    } else {
      data_ = static_cast<float*>(std::aligned_alloc(64, bytes));
      if (!data_) throw std::bad_alloc();
      std::memset(data_, 0, bytes);
    }
    account(count_);
  }
  ~FloatBuffer() {
    if (!data_) return;
    account(-count_);
    if (bytes_of(count_) >= kMappedBytes)
      munmap(data_, bytes_of(count_));
    else
      std::free(data_);
  }
  FloatBuffer(FloatBuffer&& other) noexcept { swap(other); }
  FloatBuffer& operator=(FloatBuffer&& other) noexcept {
    FloatBuffer moved(std::move(other));
    swap(moved);
    return *this;
  }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;

  // As *this = FloatBuffer(count), but a buffer of that size already keeps its memory, whose
  // pages are mapped: fresh ones fault in one by one, seconds per GiB on a virtual machine.
  void reset(size_t count) {
    if (count != count_) {
      *this = FloatBuffer(count);
      return;
    }
    if (data_) std::memset(data_, 0, bytes_of(count));
  }

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }

  // Floats held by every FloatBuffer of the process, and the most held at once since
  // reset_peak(): what the memory tests measure a save or a load by (tests/runtime).
  static size_t floats_in_use() { return in_use().load(); }
  static size_t peak_floats() { return peak().load(); }
  static void reset_peak() { peak().store(in_use().load()); }

 private:
  static constexpr size_t kMappedBytes = size_t(1) << 20;  // from here on: mmap, not the heap
  static size_t bytes_of(size_t count) { return (count * sizeof(float) + 63) / 64 * 64; }

  static std::atomic<size_t>& in_use() {
    static std::atomic<size_t> floats{0};
    return floats;
  }
  static std::atomic<size_t>& peak() {
    static std::atomic<size_t> floats{0};
    return floats;
  }
  static void account(size_t delta) {  // delta wraps around for a release
    const size_t now = in_use().fetch_add(delta) + delta;
    size_t seen = peak().load();
    while (now > seen && !peak().compare_exchange_weak(seen, now)) {
    }
  }
  void swap(FloatBuffer& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(count_, other.count_);
  }
  float* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace co2

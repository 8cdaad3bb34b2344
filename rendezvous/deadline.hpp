// Deadlines for the stores' blocking calls.
#pragma once

#include <algorithm>
#include <chrono>

namespace co2::store {

using Clock = std::chrono::steady_clock;

// now + timeout, saturating: a timeout of "forever" (milliseconds::max()) must not overflow the
// clock; a negative one is zero.
inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout.count() <= 0) return now;
  constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24 * 365);  // "forever" for a rendezvous
  return now + std::min(timeout, kLongest);
}

// Milliseconds left until `deadline`, for poll(): never negative, at most a day, rounded up so
// that a poll does not wake just before its deadline and spin.
inline int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  constexpr long long kDay = 24LL * 3600 * 1000;
  return int(std::min<long long>(left + 1, kDay));
}

}  // namespace co2::store

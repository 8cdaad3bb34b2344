// add() on every store: the counter is kept as decimal text, so set() and get() see it too.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "transports/transport.hpp"

namespace co2::store {

// The value of `stored` (nullptr: absent = 0) plus `delta`. Throws transport::RendezvousError
// when the stored text is not an integer or the sum overflows.
inline int64_t add_to_stored_integer(const std::string& store_name, const std::string& key, const std::string* stored,
                                     int64_t delta) {
  int64_t current = 0;
  if (stored != nullptr) {
    errno = 0;
    char* end = nullptr;
    const long long parsed = std::strtoll(stored->c_str(), &end, 10);
    if (stored->empty() || errno != 0 || end != stored->c_str() + stored->size())
      throw transport::RendezvousError(store_name + ": add('" + key + "'): the value there is not an integer");
    current = parsed;
  }
  if ((delta > 0 && current > std::numeric_limits<int64_t>::max() - delta) ||
      (delta < 0 && current < std::numeric_limits<int64_t>::min() - delta))
    throw transport::RendezvousError(store_name + ": add('" + key + "'): the result overflows 64 bits");
  return current + delta;
}

}  // namespace co2::store

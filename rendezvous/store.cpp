#include "rendezvous/store.hpp"

#include <algorithm>

#include "rendezvous/deadline.hpp"

namespace co2::store {

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  for (const auto& key : keys)
    get(key, std::max(std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()),
                      std::chrono::milliseconds(0)));
}

}  // namespace co2::store

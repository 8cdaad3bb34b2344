#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/deadline.hpp"
#include "rendezvous/store.hpp"
#include "rendezvous/stored_integer.hpp"

namespace co2::store {
namespace {

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!changed_.wait_until(lock, deadline_after(timeout), [&] { return values_.count(key) > 0; }))
      throw transport::RendezvousError("store: key '" + key + "' did not appear within " +
                                       std::to_string(timeout.count()) + " ms");
    return values_.at(key);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = values_.find(key);
      result = add_to_stored_integer("memory store", key, it == values_.end() ? nullptr : &it->second, delta);
      values_[key] = std::to_string(result);
    }
    changed_.notify_all();
    return result;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() { return std::make_shared<MemoryStore>(); }

}  // namespace co2::store

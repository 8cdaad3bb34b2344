// Test helper: runs one lambda per rank on W threads of this process, each rank holding a
// communicator of the `local` transport in a group of its own (a unique group name per call).
//
// Failure propagation: gtest records EXPECT/ASSERT failures from any thread into the running
// test (gtest is thread-safe on pthreads). An ASSERT only returns from the rank's lambda, so the
// other ranks could then block forever in a collective that the failed rank never joins. To
// avoid hangs, when a rank's lambda returns while the test has a fatal failure (or throws), the
// helper aborts that rank's communicator: co2_comm_abort fails every pending and future
// operation here and at the peers with CO2_ERR_ABORTED, so the others fail fast too. The
// communicators are also created with a short no-progress timeout (60 s) as a last resort.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "co2/co2.h"

// Asserts that a co2 call returned CO2_OK and prints the status and the thread-local message.
#define CO2_ASSERT_OK(expr)                                                                   \
  do {                                                                                        \
    const co2_status_t co2_s_ = (expr);                                                       \
    ASSERT_EQ(co2_s_, CO2_OK) << #expr << " -> " << co2_s_ << " (" << co2_status_string(co2_s_) \
                              << "): " << co2_last_error_message();                          \
  } while (0)
#define CO2_EXPECT_OK(expr)                                                                   \
  do {                                                                                        \
    const co2_status_t co2_s_ = (expr);                                                       \
    EXPECT_EQ(co2_s_, CO2_OK) << #expr << " -> " << co2_s_ << " (" << co2_status_string(co2_s_) \
                              << "): " << co2_last_error_message();                          \
  } while (0)
#define CO2_EXPECT_STATUS(expected, expr)                                                     \
  do {                                                                                        \
    const co2_status_t co2_s_ = (expr);                                                       \
    EXPECT_EQ(co2_s_, (expected)) << #expr << " -> " << co2_s_ << " ("                       \
                                  << co2_status_string(co2_s_)                                \
                                  << "): " << co2_last_error_message();                      \
  } while (0)

namespace co2test {

struct CommOptions {
  uint32_t timeout_ms = 60000;  // no-progress timeout: a hung test fails within a minute
  uint64_t chunk_bytes = 0;     // 0: the library default
  int ranks_per_node = 0;       // > 0: rank r names node r / ranks_per_node (node_id); 0: AUTO
  int elastic_min_ranks = 0;
};

// A group name that no other call in this process uses: test name + a process-wide counter.
inline std::string unique_group_name(const std::string& tag = "") {
  static std::atomic<uint64_t> counter{0};
  std::ostringstream name;
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  if (info != nullptr) name << info->test_suite_name() << "." << info->name();
  name << "#" << counter.fetch_add(1);
  if (!tag.empty()) name << "." << tag;
  return name.str();
}

inline co2_status_t create_comm(const std::string& group, int rank, int world_size,
                                co2_comm_t* out, const CommOptions& options = {}) {
  co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
  config.transport = CO2_TRANSPORT_LOCAL;
  config.rank = rank;
  config.world_size = world_size;
  config.group_name = group.c_str();
  config.timeout_ms = options.timeout_ms;
  if (options.chunk_bytes != 0) config.chunk_bytes = options.chunk_bytes;
  if (options.ranks_per_node > 0) config.node_id = rank / options.ranks_per_node;
  config.elastic_min_ranks = options.elastic_min_ranks;
  return co2_comm_create(&config, out);
}

// Runs fn(rank) on `world_size` threads and joins them. Exceptions become test failures.
inline void run_threads(int world_size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([r, &fn] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << " threw: " << e.what();
      } catch (...) {
        ADD_FAILURE() << "rank " << r << " threw a non-std exception";
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Runs fn(rank, comm) on `world_size` threads; every rank creates its communicator (transport
// LOCAL, group `group` or a fresh unique name) before fn and destroys it after fn. fn must
// destroy the engines it created.
inline void run_ranks(int world_size, const std::function<void(int, co2_comm_t)>& fn,
                      const CommOptions& options = {}, std::string group = "") {
  if (group.empty()) group = unique_group_name();
  run_threads(world_size, [&](int rank) {
    co2_comm_t comm = nullptr;
    const co2_status_t s = create_comm(group, rank, world_size, &comm, options);
    if (s != CO2_OK) {
      ADD_FAILURE() << "rank " << rank << ": co2_comm_create(" << group << ") -> " << s << " ("
                    << co2_status_string(s) << "): " << co2_last_error_message();
      return;
    }
    bool threw = false;
    try {
      fn(rank, comm);
    } catch (const std::exception& e) {
      threw = true;
      ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
    } catch (...) {
      threw = true;
      ADD_FAILURE() << "rank " << rank << " threw a non-std exception";
    }
    // A rank that bailed out (ASSERT) must not leave its peers blocked in a collective.
    if (threw || ::testing::Test::HasFatalFailure()) co2_comm_abort(comm);
    co2_comm_destroy(comm);
  });
}

// A reusable barrier for rank threads, with a timeout so a failed rank cannot hang the others.
// Sets an environment variable for its lifetime (the CO2_LOCAL_TEST_* link models, CO2_TRACE).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  // Returns false (and records a failure) if the others did not arrive within `timeout`.
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(60000)) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    if (!cv_.wait_for(lock, timeout, [&] { return generation_ != generation; })) {
      ADD_FAILURE() << "barrier timed out";
      return false;
    }
    return true;
  }

 private:
  const int n_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
};

// A one-shot event with a timed wait.
class Event {
 public:
  void set() {
    std::lock_guard<std::mutex> lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  bool is_set() {
    std::lock_guard<std::mutex> lock(mutex_);
    return set_;
  }
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return set_; });
  }

 private:
  bool set_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace co2test

// One suite over every store: memory, file, TCP. "Clients" are what separate ranks would hold:
// the same object (memory), separate objects on one directory (file), separate connections to
// one server (TCP).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>

#include "rendezvous/store.hpp"
#include "rendezvous/tcp_store.hpp"

namespace co2::store {
namespace {

using namespace std::chrono_literals;
using transport::RendezvousError;

// Generous: a call that has not returned by then hangs.
constexpr auto kHangDeadline = 60s;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::shared_ptr<Store> client() = 0;
};

class MemoryBackend final : public Backend {
 public:
  std::shared_ptr<Store> client() override { return store_; }

 private:
  std::shared_ptr<Store> store_ = make_memory_store();
};

class FileBackend final : public Backend {
 public:
  FileBackend() {
    char pattern[] = "/tmp/co2_file_store_XXXXXX";
    directory_ = ::mkdtemp(pattern);
  }
  ~FileBackend() override { std::system(("rm -rf '" + directory_ + "'").c_str()); }
  std::shared_ptr<Store> client() override { return open_file_store(directory_ + "/store"); }

 private:
  std::string directory_;
};

class TcpBackend final : public Backend {
 public:
  std::shared_ptr<Store> client() override {
    TcpStoreOptions options;
    options.host = "127.0.0.1";
    options.port = server_->port();
    options.auth_token = "conformance";
    options.timeout = 30s;
    return connect_tcp_store(options);
  }

 private:
  std::unique_ptr<TcpStoreServer> server_ = TcpStoreServer::start("127.0.0.1", 0, "conformance");
};

class StoreConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") backend_ = std::make_unique<MemoryBackend>();
    if (GetParam() == "file") backend_ = std::make_unique<FileBackend>();
    if (GetParam() == "tcp") backend_ = std::make_unique<TcpBackend>();
    ASSERT_TRUE(backend_);
  }
  std::shared_ptr<Store> client() { return backend_->client(); }

  std::unique_ptr<Backend> backend_;
};

TEST_P(StoreConformance, SetThenGetFromAnotherClient) {
  auto a = client(), b = client();
  a->set("address/0", "tcp://10.0.0.1:1234");
  EXPECT_EQ(b->get("address/0", 1s), "tcp://10.0.0.1:1234");
  b->set("address/0", "overwritten");
  EXPECT_EQ(a->get("address/0", 1s), "overwritten");
}

TEST_P(StoreConformance, KeysAndValuesAreArbitraryBytes) {
  auto a = client(), b = client();
  const std::string key("k\0e/y\xff\n", 7);
  const std::string value("\0\x01\xfe\xff value", 10);
  a->set(key, value);
  a->set("empty", "");
  EXPECT_EQ(b->get(key, 1s), value);
  EXPECT_EQ(b->get("empty", 1s), "");
  EXPECT_THROW(b->get(std::string("k\0e/y\xff", 6), 0ms), RendezvousError);  // a prefix is another key
}

TEST_P(StoreConformance, LongKeysAndLargeValues) {
  auto a = client(), b = client();
  const std::string long_key(4096, 'k');
  const std::string shorter_key(2048, 'k');  // its file must not collide with the long key's directories
  std::string value(1 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = char(i * 7 + 3);
  a->set(long_key, value);
  a->set(shorter_key, "short");
  EXPECT_EQ(b->get(long_key, 1s), value);
  EXPECT_EQ(b->get(shorter_key, 1s), "short");
}

TEST_P(StoreConformance, GetBlocksUntilAnotherClientSets) {
  auto waiter = client(), setter = client();
  auto pending = std::async(std::launch::async, [&] { return waiter->get("late", 120s); });
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);  // nothing there yet
  setter->set("late", "here");
  ASSERT_EQ(pending.wait_for(kHangDeadline), std::future_status::ready);
  EXPECT_EQ(pending.get(), "here");
}

TEST_P(StoreConformance, GetOfAKeyNobodySetsTimesOut) {
  auto store = client();
  auto pending = std::async(std::launch::async, [&] { return store->get("never", 200ms); });
  ASSERT_EQ(pending.wait_for(kHangDeadline), std::future_status::ready);
  try {
    pending.get();
    FAIL() << "get() of a missing key returned";
  } catch (const RendezvousError& error) {
    EXPECT_NE(std::string(error.what()).find("never"), std::string::npos) << error.what();
  }
  EXPECT_THROW(store->get("never", 0ms), RendezvousError);
  EXPECT_THROW(store->get("never", -5ms), RendezvousError);
}

TEST_P(StoreConformance, ConcurrentAddsFromManyClientsAreAtomic) {
  constexpr int kClients = 6, kAddsEach = 40;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(client());
  std::vector<std::vector<int64_t>> seen(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      for (int n = 0; n < kAddsEach; ++n) seen[i].push_back(clients[i]->add("counter", 1));
    });
  for (auto& thread : threads) thread.join();
  std::set<int64_t> all;
  for (const auto& values : seen) all.insert(values.begin(), values.end());
  ASSERT_EQ(all.size(), size_t(kClients * kAddsEach)) << "two adds returned the same value";
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kClients * kAddsEach);
  EXPECT_EQ(client()->get("counter", 1s), std::to_string(kClients * kAddsEach));
}

TEST_P(StoreConformance, AddArithmeticAndErrors) {
  auto store = client();
  EXPECT_EQ(store->add("n", 5), 5);  // absent = 0
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(store->add("n", 0), -2);
  store->set("text", "not a number");
  EXPECT_THROW(store->add("text", 1), RendezvousError);
  EXPECT_EQ(store->get("text", 1s), "not a number");  // untouched
  store->set("big", std::to_string(INT64_MAX - 1));
  EXPECT_EQ(store->add("big", 1), INT64_MAX);
  EXPECT_THROW(store->add("big", 1), RendezvousError);
  store->set("set_then_add", "41");
  EXPECT_EQ(store->add("set_then_add", 1), 42);
}

TEST_P(StoreConformance, AddWakesAGetter) {
  auto waiter = client(), adder = client();
  auto pending = std::async(std::launch::async, [&] { return waiter->get("arrivals", 120s); });
  adder->add("arrivals", 3);
  ASSERT_EQ(pending.wait_for(kHangDeadline), std::future_status::ready);
  EXPECT_EQ(pending.get(), "3");
}

TEST_P(StoreConformance, WaitForSeveralKeys) {
  auto waiter = client(), setter = client();
  waiter->wait({}, 0ms);  // nothing to wait for
  setter->set("a", "1");
  auto pending = std::async(std::launch::async, [&] { waiter->wait({"a", "b", "c"}, 120s); });
  setter->set("b", "2");
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);  // c is still missing
  setter->set("c", "3");
  ASSERT_EQ(pending.wait_for(kHangDeadline), std::future_status::ready);
  pending.get();
}

TEST_P(StoreConformance, WaitTimesOutNamingAMissingKey) {
  auto store = client();
  store->set("present", "1");
  auto pending = std::async(std::launch::async, [&] { store->wait({"present", "absent"}, 200ms); });
  ASSERT_EQ(pending.wait_for(kHangDeadline), std::future_status::ready);
  try {
    pending.get();
    FAIL() << "wait() for a missing key returned";
  } catch (const RendezvousError& error) {
    EXPECT_NE(std::string(error.what()).find("absent"), std::string::npos) << error.what();
  }
}

TEST_P(StoreConformance, ABarrierOfThreadClients) {
  constexpr int kRanks = 5;
  std::vector<std::thread> ranks;
  std::atomic<int> passed{0};
  for (int rank = 0; rank < kRanks; ++rank)
    ranks.emplace_back([&, rank] {
      auto store = client();
      store->set("rank/" + std::to_string(rank), std::to_string(rank * rank));
      if (store->add("barrier", 1) == kRanks) store->set("barrier/open", "");
      store->get("barrier/open", 60s);
      for (int peer = 0; peer < kRanks; ++peer)
        if (store->get("rank/" + std::to_string(peer), 0ms) != std::to_string(peer * peer)) return;
      ++passed;
    });
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(passed.load(), kRanks);
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreConformance, ::testing::Values("memory", "file", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace co2::store

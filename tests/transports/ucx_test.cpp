// What only the UCX transport has: its connect (arguments, a peer whose address never arrives, a
// peer that never answers the wire-up) and available(). Ranks are threads with their own UCP
// worker; the shared behaviour of every transport is in conformance_test.cpp.
#include "transports/ucx/transport.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "rendezvous/store.hpp"

namespace {

using co2::transport::RendezvousError;
using co2::transport::ucx::connect;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class UcxConnect : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!co2::transport::ucx::available()) GTEST_SKIP() << "UCX cannot be initialised here";
  }
  std::shared_ptr<co2::store::Store> store_ = co2::store::make_memory_store();
};

std::string connect_error(co2::transport::Rendezvous& rendezvous, const std::string& prefix,
                          int rank, int size, milliseconds timeout) {
  try {
    connect(rendezvous, prefix, rank, size, timeout);
  } catch (const RendezvousError& error) {
    return error.what();
  }
  return "";
}

TEST_F(UcxConnect, RejectsArgumentsOutOfRange) {
  EXPECT_NE(connect_error(*store_, "a/", 0, 0, milliseconds(0)).find("size 0"), std::string::npos);
  EXPECT_NE(connect_error(*store_, "a/", 2, 2, milliseconds(0)).find("out of range"),
            std::string::npos);
  EXPECT_NE(connect_error(*store_, "a/", -1, 2, milliseconds(0)).find("out of range"),
            std::string::npos);
  EXPECT_NE(connect_error(*store_, "a/", 0, co2::transport::ucx::kMaxRanks + 1, milliseconds(0))
                .find("must be in 1.."),
            std::string::npos);
  EXPECT_NE(connect_error(*store_, "a/", 0, 2, milliseconds(-1)).find("timeout"), std::string::npos);
}

TEST_F(UcxConnect, RejectsAMalformedSpinSetting) {
  ::setenv("CO2_UCX_SPIN_US", "soon", 1);
  const std::string message = connect_error(*store_, "spin/", 0, 1, milliseconds(1000));
  ::unsetenv("CO2_UCX_SPIN_US");
  EXPECT_NE(message.find("CO2_UCX_SPIN_US"), std::string::npos) << message;
  EXPECT_NE(message.find("'soon'"), std::string::npos) << message;
}

TEST_F(UcxConnect, PeerWhoseAddressNeverArrivesIsARendezvousError) {
  const auto start = Clock::now();
  const std::string message = connect_error(*store_, "lonely/", 0, 3, milliseconds(300));
  EXPECT_GE(Clock::now() - start, milliseconds(300));
  EXPECT_NE(message.find("rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("did not arrive"), std::string::npos) << message;
}

// Hides one key from its user: get() of it waits for a key nobody sets.
class Detour : public co2::transport::Rendezvous {
 public:
  Detour(co2::transport::Rendezvous& inner, std::string hidden)
      : inner_(inner), hidden_(std::move(hidden)) {}
  void set(const std::string& key, const std::string& value) override { inner_.set(key, value); }
  std::string get(const std::string& key, milliseconds timeout) override {
    return inner_.get(key == hidden_ ? "nobody sets this" : key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return inner_.add(key, delta); }

 private:
  co2::transport::Rendezvous& inner_;
  std::string hidden_;
};

TEST_F(UcxConnect, PeerThatNeverAnswersTheWireUpIsARendezvousError) {
  // Rank 1 publishes its address but never sees rank 0's, so it never creates its endpoints
  // nor answers: rank 0 has every address and must still give up at its timeout.
  Detour detour(*store_, "mute/0");
  std::string rank1_message;
  std::thread rank1([&] { rank1_message = connect_error(detour, "mute/", 1, 2, milliseconds(1500)); });
  const auto start = Clock::now();
  const std::string message = connect_error(*store_, "mute/", 0, 2, milliseconds(500));
  const auto waited = Clock::now() - start;
  rank1.join();
  EXPECT_GE(waited, milliseconds(500));
  EXPECT_NE(message.find("wire-up with rank(s) 1"), std::string::npos) << message;
  EXPECT_NE(rank1_message.find("rank 0"), std::string::npos) << rank1_message;
}

TEST_F(UcxConnect, AGroupFormsAndEveryRankKnowsItsPlace) {
  constexpr int kSize = 3;
  std::vector<std::unique_ptr<co2::transport::PointToPoint>> group(kSize);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kSize; ++rank)
    threads.emplace_back([&, rank] { group[size_t(rank)] = connect(*store_, "g/", rank, kSize, milliseconds(20000)); });
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < kSize; ++rank) {
    ASSERT_NE(group[size_t(rank)], nullptr);
    EXPECT_EQ(group[size_t(rank)]->rank(), rank);
    EXPECT_EQ(group[size_t(rank)]->size(), kSize);
  }
  // Each published a worker address under its key.
  for (int rank = 0; rank < kSize; ++rank)
    EXPECT_FALSE(store_->get("g/" + std::to_string(rank), milliseconds(0)).empty());
}

TEST(UcxAvailable, AnswersTheSameEveryTime) {
  const bool first = co2::transport::ucx::available();
  EXPECT_EQ(co2::transport::ucx::available(), first);
}

}  // namespace

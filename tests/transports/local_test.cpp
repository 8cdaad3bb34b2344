// Tests of what only the `local` transport has: its rendezvous by group name and its link
// model (the interface's conformance suite is conformance_test.cpp). Group formation needs one
// thread per rank (join blocks); once formed, the transports are non-blocking, so most tests
// drive every rank from the test thread and are deterministic.
#include "transports/local/transport.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

namespace {

using co2::transport::Handle;
using co2::transport::Outcome;
using co2::transport::PointToPoint;
using co2::transport::RendezvousError;
using co2::transport::local::join;
using co2::transport::local::LinkModel;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Group = std::vector<std::unique_ptr<PointToPoint>>;

std::string unique_name(const std::string& stem) {
  static std::atomic<int> counter{0};
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(test->name()) + "/" + stem + "/" + std::to_string(counter++);
}

// Joins all `size` ranks of `name`, one thread each.
Group join_all(const std::string& name, int size, const LinkModel& link = {},
               milliseconds timeout = milliseconds(10000)) {
  Group group(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] { group[size_t(rank)] = join(name, rank, size, timeout, link); });
  for (auto& thread : threads) thread.join();
  return group;
}

// Polls until the handle is no longer pending, or `limit` passes (then Pending).
Outcome wait_outcome(PointToPoint& transport, Handle handle, milliseconds limit = milliseconds(10000)) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const Outcome outcome = transport.test(handle);
    if (outcome != Outcome::Pending || Clock::now() >= deadline) return outcome;
    transport.wait_for_activity(std::chrono::microseconds(1000));
  }
}

std::string rendezvous_error(const std::string& name, int rank, int size, milliseconds timeout) {
  try {
    join(name, rank, size, timeout, {});
  } catch (const RendezvousError& error) {
    return error.what();
  }
  return "";
}

// Returns once `rank` of `name` is registered by some other thread: a probe join of that rank
// then fails with "already taken" instead of timing out.
void wait_until_joined(const std::string& name, int rank, int size) {
  const auto deadline = Clock::now() + milliseconds(10000);
  while (rendezvous_error(name, rank, size, milliseconds(0)).find("already taken") ==
         std::string::npos) {
    ASSERT_LT(Clock::now(), deadline) << "rank " << rank << " never joined";
    std::this_thread::sleep_for(milliseconds(1));
  }
}

// ---------------------------------------------------------------------------------------------
// Rendezvous

TEST(LocalRendezvous, FormsAGroupOfAllRanks) {
  Group group = join_all(unique_name("g"), 4);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_NE(group[size_t(rank)], nullptr);
    EXPECT_EQ(group[size_t(rank)]->rank(), rank);
    EXPECT_EQ(group[size_t(rank)]->size(), 4);
  }
}

TEST(LocalRendezvous, SingleRankGroupFormsAtOnce) {
  auto transport = join(unique_name("g"), 0, 1, milliseconds(0), {});
  EXPECT_EQ(transport->size(), 1);
}

TEST(LocalRendezvous, TimesOutWhenPeersNeverArrive) {
  const std::string name = unique_name("g");
  const auto start = Clock::now();
  const std::string message = rendezvous_error(name, 0, 3, milliseconds(100));
  EXPECT_GE(Clock::now() - start, milliseconds(100));
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
  EXPECT_NE(message.find("missing: 1, 2"), std::string::npos) << message;
  // The timed-out rank withdrew, so the name can form a group of another size.
  Group group = join_all(name, 2);
  EXPECT_EQ(group[1]->size(), 2);
}

TEST(LocalRendezvous, RejectsRankOutOfRange) {
  const std::string name = unique_name("g");
  EXPECT_NE(rendezvous_error(name, 2, 2, milliseconds(0)).find("out of range"), std::string::npos);
  EXPECT_NE(rendezvous_error(name, -1, 2, milliseconds(0)).find("out of range"), std::string::npos);
  EXPECT_NE(rendezvous_error(name, 0, 0, milliseconds(0)).find("size"), std::string::npos);
}

TEST(LocalRendezvous, RejectsSizeConflict) {
  const std::string name = unique_name("g");
  std::unique_ptr<PointToPoint> first;
  // The probe in wait_until_joined may briefly hold rank 0 itself: retry until ours.
  std::thread joiner([&] {
    while (!first) {
      try {
        first = join(name, 0, 2, milliseconds(10000), {});
      } catch (const RendezvousError&) {
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
  });
  wait_until_joined(name, 0, 2);
  const std::string message = rendezvous_error(name, 1, 3, milliseconds(1000));
  EXPECT_NE(message.find("size 2"), std::string::npos) << message;
  EXPECT_NE(message.find("size 3"), std::string::npos) << message;
  auto second = join(name, 1, 2, milliseconds(10000), {});
  joiner.join();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(second->rank(), 1);
}

TEST(LocalRendezvous, RejectsRankAlreadyTaken) {
  const std::string name = unique_name("g");
  std::unique_ptr<PointToPoint> first;
  // The probe in wait_until_joined may briefly hold rank 0 itself: retry until ours.
  std::thread joiner([&] {
    while (!first) {
      try {
        first = join(name, 0, 2, milliseconds(10000), {});
      } catch (const RendezvousError&) {
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
  });
  wait_until_joined(name, 0, 2);
  const std::string message = rendezvous_error(name, 0, 2, milliseconds(1000));
  EXPECT_NE(message.find("rank 0 is already taken"), std::string::npos) << message;
  auto second = join(name, 1, 2, milliseconds(10000), {});
  joiner.join();
  EXPECT_EQ(first->rank(), 0);
}

TEST(LocalRendezvous, NameIsFreeAgainOnceEveryMemberIsDestroyed) {
  const std::string name = unique_name("g");
  Group group = join_all(name, 2);
  group[0].reset();
  const std::string message = rendezvous_error(name, 0, 2, milliseconds(0));
  EXPECT_NE(message.find("still in use"), std::string::npos) << message;
  group[1].reset();
  Group again = join_all(name, 3);
  EXPECT_EQ(again[2]->size(), 3);
}

// ---------------------------------------------------------------------------------------------
// Local-only semantics (the shared ones are in conformance_test.cpp)

TEST(LocalTransport, AbortKeepsTheGroupsFirstReason) {
  // One group object holds the reason, so the first abort of any member wins everywhere.
  Group group = join_all(unique_name("g"), 2);
  group[0]->abort("first reason");
  group[1]->abort("second reason");
  int value = 0;
  EXPECT_EQ(group[1]->test(group[1]->post_recv(0, 1, &value, sizeof value)), Outcome::Aborted);
  EXPECT_NE(group[1]->error_message().find("first reason"), std::string::npos);
  EXPECT_EQ(group[1]->error_message().find("second reason"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Link model

TEST(LocalLinkModel, SlowsATransferByItsTransferTime) {
  LinkModel link;
  link.bytes_per_second = 1e6;
  Group group = join_all(unique_name("g"), 2, link);
  std::vector<char> data(200000, 'x'), received(data.size());
  const auto start = Clock::now();
  const Handle recv = group[1]->post_recv(0, 1, received.data(), received.size());
  const Handle send = group[0]->post_send(1, 1, data.data(), data.size());
  EXPECT_EQ(group[1]->test(recv), Outcome::Pending) << "matched, but still on the wire";
  EXPECT_EQ(group[0]->test(send), Outcome::Pending);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_GE(Clock::now() - start, milliseconds(200));
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::Done);
  EXPECT_EQ(received, data);

  // Without a link model the same transfer completes at once.
  Group fast = join_all(unique_name("fast"), 2);
  const Handle fast_recv = fast[1]->post_recv(0, 1, received.data(), received.size());
  const Handle fast_send = fast[0]->post_send(1, 1, data.data(), data.size());
  EXPECT_EQ(fast[1]->test(fast_recv), Outcome::Done);
  EXPECT_EQ(fast[0]->test(fast_send), Outcome::Done);
}

TEST(LocalLinkModel, ALinkCarriesOneMessageAtATime) {
  LinkModel link;
  link.bytes_per_second = 1e6;
  Group group = join_all(unique_name("g"), 2, link);
  std::vector<char> first(100000, 'a'), second(100000, 'b'), reverse(100000, 'c');
  std::vector<char> first_in(first.size()), second_in(second.size()), reverse_in(reverse.size());
  const auto start = Clock::now();
  const Handle handles[] = {group[1]->post_recv(0, 1, first_in.data(), first_in.size()),
                            group[1]->post_recv(0, 2, second_in.data(), second_in.size()),
                            group[0]->post_recv(1, 3, reverse_in.data(), reverse_in.size())};
  group[0]->post_send(1, 1, first.data(), first.size());
  group[0]->post_send(1, 2, second.data(), second.size());
  group[1]->post_send(0, 3, reverse.data(), reverse.size());
  PointToPoint* owners[] = {group[1].get(), group[1].get(), group[0].get()};

  Clock::time_point done_at[3] = {};
  bool done[3] = {};
  const auto deadline = start + std::chrono::seconds(20);
  while (!(done[0] && done[1] && done[2]) && Clock::now() < deadline) {
    for (int i = 0; i < 3; ++i) {
      if (done[i]) continue;
      const Outcome outcome = owners[i]->test(handles[i]);
      if (outcome == Outcome::Pending) continue;
      EXPECT_EQ(outcome, Outcome::Done);
      done[i] = true;
      done_at[i] = Clock::now();
    }
    group[1]->wait_for_activity(std::chrono::microseconds(1000));
  }
  ASSERT_TRUE(done[0] && done[1] && done[2]);
  EXPECT_GE(done_at[0] - start, milliseconds(100));
  EXPECT_GE(done_at[1] - start, milliseconds(200)) << "the second message waits for the first";
  EXPECT_GE(done_at[1], done_at[0]);
  EXPECT_GE(done_at[2] - start, milliseconds(100));
  EXPECT_LT(done_at[2], done_at[1]) << "the opposite direction is a separate link";
}

TEST(LocalLinkModel, AddsLatencyToEveryMessage) {
  LinkModel link;
  link.latency = milliseconds(50);
  Group group = join_all(unique_name("g"), 2, link);
  int value = 3, received = 0;
  const auto start = Clock::now();
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  group[0]->post_send(1, 1, &value, sizeof value);
  EXPECT_EQ(group[1]->test(recv), Outcome::Pending);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_GE(Clock::now() - start, milliseconds(50));
}

TEST(LocalLinkModel, SlowsOnlyTheSendersLinks) {
  LinkModel slow;
  slow.latency = milliseconds(300);
  const std::string name = unique_name("g");
  Group group(2);
  std::thread slow_rank([&] { group[0] = join(name, 0, 2, milliseconds(10000), slow); });
  group[1] = join(name, 1, 2, milliseconds(10000), {});
  slow_rank.join();
  int value = 1, received = 0;
  const Handle fast_recv = group[0]->post_recv(1, 1, &received, sizeof received);
  group[1]->post_send(0, 1, &value, sizeof value);
  EXPECT_EQ(group[0]->test(fast_recv), Outcome::Done) << "rank 1's links are not slowed";
  const Handle slow_recv = group[1]->post_recv(0, 2, &received, sizeof received);
  group[0]->post_send(1, 2, &value, sizeof value);
  EXPECT_EQ(group[1]->test(slow_recv), Outcome::Pending);
  EXPECT_EQ(wait_outcome(*group[1], slow_recv), Outcome::Done);
}

TEST(LocalLinkModel, WaitForActivityWakesWhenADelayedMessageFallsDue) {
  LinkModel link;
  link.latency = milliseconds(50);
  Group group = join_all(unique_name("g"), 2, link);
  int value = 3, received = 0;
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  group[0]->post_send(1, 1, &value, sizeof value);
  const auto start = Clock::now();
  // The match itself is activity; the next wait must end when the message falls due, not
  // after the full 20 s.
  Outcome outcome = Outcome::Pending;
  for (int waits = 0; waits < 3 && outcome == Outcome::Pending; ++waits) {
    group[1]->wait_for_activity(std::chrono::seconds(20));
    outcome = group[1]->test(recv);
  }
  EXPECT_EQ(outcome, Outcome::Done);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

class EnvironmentVariable {
 public:
  EnvironmentVariable(const char* name, const char* value) : name_(name) {
    ::setenv(name, value, 1);
  }
  ~EnvironmentVariable() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(LocalLinkModel, ReadsTheEnvironment) {
  {
    EnvironmentVariable bandwidth("CO2_LOCAL_TEST_BANDWIDTH", "12500000");
    EnvironmentVariable latency("CO2_LOCAL_TEST_LATENCY_US", "250");
    const LinkModel link = LinkModel::from_environment();
    EXPECT_DOUBLE_EQ(link.bytes_per_second, 12500000.0);
    EXPECT_EQ(link.latency, std::chrono::microseconds(250));
  }
  const LinkModel unset = LinkModel::from_environment();
  EXPECT_EQ(unset.bytes_per_second, 0.0);
  EXPECT_EQ(unset.latency, std::chrono::microseconds(0));
  {
    EnvironmentVariable bandwidth("CO2_LOCAL_TEST_BANDWIDTH", "fast");
    EXPECT_THROW(LinkModel::from_environment(), std::invalid_argument);
  }
  {
    EnvironmentVariable latency("CO2_LOCAL_TEST_LATENCY_US", "-5");
    EXPECT_THROW(LinkModel::from_environment(), std::invalid_argument);
  }
}

}  // namespace

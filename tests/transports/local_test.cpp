// Conformance tests of the `local` transport. Group formation needs one thread per rank (join
// blocks); once formed, the transports are non-blocking, so most tests drive every rank from the
// test thread and are deterministic.
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
// Matching and copying

TEST(LocalTransport, MatchesEqualTagsInPostingOrder) {
  Group group = join_all(unique_name("g"), 2);
  std::vector<int> sent = {1, 2, 3};
  std::vector<int> received(3, 0);
  std::vector<Handle> sends, recvs;
  // Sends first (they wait unexpected), then the receives.
  for (int& value : sent) sends.push_back(group[0]->post_send(1, 5, &value, sizeof value));
  for (int& value : received) recvs.push_back(group[1]->post_recv(0, 5, &value, sizeof value));
  for (Handle handle : sends) EXPECT_EQ(wait_outcome(*group[0], handle), Outcome::Done);
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(*group[1], handle), Outcome::Done);
  EXPECT_EQ(received, sent);

  // Receives first this time.
  received.assign(3, 0);
  recvs.clear();
  sends.clear();
  for (int& value : received) recvs.push_back(group[1]->post_recv(0, 5, &value, sizeof value));
  for (int& value : sent) sends.push_back(group[0]->post_send(1, 5, &value, sizeof value));
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(*group[1], handle), Outcome::Done);
  for (Handle handle : sends) EXPECT_EQ(wait_outcome(*group[0], handle), Outcome::Done);
  EXPECT_EQ(received, sent);
}

TEST(LocalTransport, MatchesBySourceAndTag) {
  Group group = join_all(unique_name("g"), 3);
  // value = 10 * source + tag
  int from0_tag7 = 7, from0_tag8 = 8, from2_tag7 = 27, from2_tag8 = 28;
  const Handle sends[] = {group[0]->post_send(1, 7, &from0_tag7, sizeof(int)),
                          group[0]->post_send(1, 8, &from0_tag8, sizeof(int)),
                          group[2]->post_send(1, 7, &from2_tag7, sizeof(int)),
                          group[2]->post_send(1, 8, &from2_tag8, sizeof(int))};
  int got[4] = {};
  const Handle recvs[] = {group[1]->post_recv(2, 8, &got[0], sizeof(int)),
                          group[1]->post_recv(0, 8, &got[1], sizeof(int)),
                          group[1]->post_recv(0, 7, &got[2], sizeof(int)),
                          group[1]->post_recv(2, 7, &got[3], sizeof(int))};
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(*group[1], handle), Outcome::Done);
  EXPECT_EQ(got[0], 28);
  EXPECT_EQ(got[1], 8);
  EXPECT_EQ(got[2], 7);
  EXPECT_EQ(got[3], 27);
  EXPECT_EQ(wait_outcome(*group[0], sends[0]), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[0], sends[1]), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[2], sends[2]), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[2], sends[3]), Outcome::Done);
}

TEST(LocalTransport, CopiesLargeMessagesExactly) {
  Group group = join_all(unique_name("g"), 2);
  std::vector<uint32_t> data(1 << 18);
  std::iota(data.begin(), data.end(), 12345u);
  std::vector<uint32_t> received(data.size(), 0);
  const size_t bytes = data.size() * sizeof(uint32_t);
  const Handle recv = group[1]->post_recv(0, 1, received.data(), bytes);
  const Handle send = group[0]->post_send(1, 1, data.data(), bytes);
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_EQ(received, data);
}

TEST(LocalTransport, SendToSelfWorks) {
  Group group = join_all(unique_name("g"), 2);
  double sent = 2.5, received = 0;
  const Handle send = group[1]->post_send(1, 3, &sent, sizeof sent);
  const Handle recv = group[1]->post_recv(1, 3, &received, sizeof received);
  EXPECT_EQ(wait_outcome(*group[1], send), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_EQ(received, 2.5);
}

TEST(LocalTransport, ZeroLengthMessagesComplete) {
  Group group = join_all(unique_name("g"), 2);
  const Handle send = group[0]->post_send(1, 9, nullptr, 0);
  const Handle recv = group[1]->post_recv(0, 9, nullptr, 0);
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
}

TEST(LocalTransport, SizeMismatchIsReportedOnBothSides) {
  Group group = join_all(unique_name("g"), 2);
  char sent[16] = "0123456789abcde";
  char received[8] = {};
  const Handle send = group[0]->post_send(1, 4, sent, sizeof sent);
  const Handle recv = group[1]->post_recv(0, 4, received, sizeof received);
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::SizeMismatch);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::SizeMismatch);
  const std::string message = group[1]->error_message();
  EXPECT_NE(message.find("16 bytes sent"), std::string::npos) << message;
  EXPECT_NE(message.find("8 bytes expected"), std::string::npos) << message;
  EXPECT_EQ(received[0], 0) << "nothing is copied on a mismatch";
  // The mismatched pair was consumed: the next messages on that tag match normally.
  char again[8] = {};
  const Handle send2 = group[0]->post_send(1, 4, sent, sizeof again);
  const Handle recv2 = group[1]->post_recv(0, 4, again, sizeof again);
  EXPECT_EQ(wait_outcome(*group[0], send2), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[1], recv2), Outcome::Done);
  EXPECT_EQ(std::memcmp(again, sent, sizeof again), 0);
}

TEST(LocalTransport, HandlesAreReleasedOnceFinished) {
  Group group = join_all(unique_name("g"), 2);
  int value = 1, received = 0;
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_EQ(group[1]->test(recv), Outcome::Failed);
  EXPECT_NE(group[1]->error_message().find("unknown handle"), std::string::npos);
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::Done);
  EXPECT_EQ(group[0]->test(987654), Outcome::Failed);
}

TEST(LocalTransport, PeerOutOfRangeFails) {
  Group group = join_all(unique_name("g"), 2);
  int value = 0;
  EXPECT_EQ(group[0]->test(group[0]->post_send(2, 1, &value, sizeof value)), Outcome::Failed);
  EXPECT_EQ(group[0]->test(group[0]->post_recv(-1, 1, &value, sizeof value)), Outcome::Failed);
  EXPECT_NE(group[0]->error_message().find("out of range"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Abort and lost peers

TEST(LocalTransport, AbortFromAnotherThreadWakesAWaiterAndFailsEverything) {
  Group group = join_all(unique_name("g"), 3);
  int received = 0;
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);  // never sent
  int value = 5;
  const Handle unmatched_send = group[2]->post_send(0, 2, &value, sizeof value);

  std::atomic<bool> waiting{false};
  Outcome waiter_outcome = Outcome::Pending;
  Clock::duration waited{};
  std::thread waiter([&] {
    const auto start = Clock::now();
    waiting = true;
    // One long wait: only the abort can end it early.
    group[1]->wait_for_activity(std::chrono::seconds(20));
    waited = Clock::now() - start;
    waiter_outcome = group[1]->test(recv);
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(50));
  group[0]->abort("test abort");
  waiter.join();

  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_EQ(waiter_outcome, Outcome::Aborted);
  EXPECT_NE(group[1]->error_message().find("test abort"), std::string::npos)
      << group[1]->error_message();
  EXPECT_EQ(group[2]->test(unmatched_send), Outcome::Aborted);
  // Future operations of every member fail too, even ones that would match.
  int other = 0;
  const Handle late_send = group[2]->post_send(1, 3, &value, sizeof value);
  const Handle late_recv = group[1]->post_recv(2, 3, &other, sizeof other);
  EXPECT_EQ(group[2]->test(late_send), Outcome::Aborted);
  EXPECT_EQ(group[1]->test(late_recv), Outcome::Aborted);
  EXPECT_EQ(other, 0);
}

TEST(LocalTransport, AbortKeepsTheFirstReason) {
  Group group = join_all(unique_name("g"), 2);
  group[0]->abort("first reason");
  group[1]->abort("second reason");
  int value = 0;
  EXPECT_EQ(group[1]->test(group[1]->post_recv(0, 1, &value, sizeof value)), Outcome::Aborted);
  EXPECT_NE(group[1]->error_message().find("first reason"), std::string::npos);
  EXPECT_EQ(group[1]->error_message().find("second reason"), std::string::npos);
}

TEST(LocalTransport, DestroyedPeerGivesPeerLost) {
  Group group = join_all(unique_name("g"), 3);
  int received = 0, value = 1;
  const Handle recv_from_0 = group[1]->post_recv(0, 1, &received, sizeof received);
  const Handle send_to_0 = group[2]->post_send(0, 1, &value, sizeof value);
  group[0].reset();
  EXPECT_EQ(wait_outcome(*group[1], recv_from_0), Outcome::PeerLost);
  EXPECT_NE(group[1]->error_message().find("rank 0"), std::string::npos);
  EXPECT_EQ(wait_outcome(*group[2], send_to_0), Outcome::PeerLost);
  EXPECT_EQ(group[2]->test(group[2]->post_send(0, 2, &value, sizeof value)), Outcome::PeerLost);
  EXPECT_EQ(group[1]->test(group[1]->post_recv(0, 2, &received, sizeof received)),
            Outcome::PeerLost);
  // The survivors still talk to each other.
  const Handle send = group[2]->post_send(1, 3, &value, sizeof value);
  const Handle recv = group[1]->post_recv(2, 3, &received, sizeof received);
  EXPECT_EQ(wait_outcome(*group[2], send), Outcome::Done);
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
}

TEST(LocalTransport, MessageCompletedBeforeThePeerDiedStaysDone) {
  Group group = join_all(unique_name("g"), 2);
  int value = 42, received = 0;
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  group[0].reset();
  EXPECT_EQ(wait_outcome(*group[1], recv), Outcome::Done);
  EXPECT_EQ(received, 42);
  (void)send;
}

TEST(LocalTransport, WaitForActivityWakesWhenAMessageArrives) {
  Group group = join_all(unique_name("g"), 2);
  int value = 7, received = 0;
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  std::atomic<bool> waiting{false};
  Clock::duration waited{};
  std::thread waiter([&] {
    waiting = true;
    const auto start = Clock::now();
    group[1]->wait_for_activity(std::chrono::seconds(20));
    waited = Clock::now() - start;
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(30));
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  waiter.join();
  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_EQ(group[1]->test(recv), Outcome::Done);
  EXPECT_EQ(received, 7);
  EXPECT_EQ(wait_outcome(*group[0], send), Outcome::Done);
}

TEST(LocalTransport, WaitForActivityReturnsAfterMaxWait) {
  Group group = join_all(unique_name("g"), 2);
  const auto start = Clock::now();
  group[0]->wait_for_activity(std::chrono::microseconds(20000));
  EXPECT_GE(Clock::now() - start, milliseconds(20));
}

TEST(LocalTransport, ManyThreadsExchangeManyMessages) {
  constexpr int kRanks = 4;
  constexpr int kMessages = 200;
  Group group = join_all(unique_name("g"), kRanks);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      PointToPoint& me = *group[size_t(rank)];
      std::vector<int64_t> sent(size_t(kRanks * kMessages)), received(sent.size(), -1);
      std::vector<Handle> handles;
      for (int peer = 0; peer < kRanks; ++peer) {
        for (int i = 0; i < kMessages; ++i) {
          const size_t slot = size_t(peer * kMessages + i);
          sent[slot] = int64_t(rank) * 1000000 + peer * 1000 + i;
          handles.push_back(me.post_recv(peer, uint64_t(i % 7), &received[slot], sizeof(int64_t)));
          handles.push_back(me.post_send(peer, uint64_t(i % 7), &sent[slot], sizeof(int64_t)));
        }
      }
      for (Handle handle : handles)
        if (wait_outcome(me, handle) != Outcome::Done) ++wrong;
      for (int peer = 0; peer < kRanks; ++peer)
        for (int i = 0; i < kMessages; ++i)
          if (received[size_t(peer * kMessages + i)] != int64_t(peer) * 1000000 + rank * 1000 + i)
            ++wrong;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
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

// Conformance of every built point-to-point transport to transports/transport.hpp: one suite,
// instantiated per transport. Ranks are threads of this process (each UCX rank has its own UCP
// context and worker); once formed, most tests drive every rank from the test thread and make
// all ranks progress while they wait (a UCX rendezvous transfer needs both sides to progress).
//
// Where transports legitimately differ, the suite says so through Traits: a UCX send of a small
// message completes locally before the receiver posts anything (eager protocol), so its outcome
// may be Done where the local transport reports the receiver's fate; and a UCX receive may have
// written part of a too-long message before it reports the mismatch.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "rendezvous/store.hpp"
#include "transports/local/transport.hpp"
#ifdef CO2_HAVE_UCX
#include "transports/ucx/transport.hpp"
#endif

namespace {

using co2::transport::Handle;
using co2::transport::kTagBits;
using co2::transport::Outcome;
using co2::transport::PointToPoint;
using co2::transport::RendezvousError;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Group = std::vector<std::unique_ptr<PointToPoint>>;

constexpr milliseconds kFormTimeout{20000};
constexpr milliseconds kWaitLimit{10000};

struct Traits {
  std::string name;
  // Forms a group of `size` ranks named `name` (one thread per rank).
  std::function<Group(const std::string& name, int size)> form;
  // A send may complete (Done) before a matching receive exists.
  bool sends_complete_locally = false;
  // A size mismatch leaves the receive buffer untouched.
  bool mismatch_leaves_buffer_untouched = true;
  // wait_for_activity returns early only when something happened (no internal events).
  bool waits_are_exact = true;
};

void PrintTo(const Traits& traits, std::ostream* out) { *out << traits.name; }

std::string unique_name(const std::string& stem) {
  static std::atomic<int> counter{0};
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string(test->name()) + "/" + stem + "/" + std::to_string(counter++);
}

Group form_with_threads(int size, const std::function<std::unique_ptr<PointToPoint>(int)>& join_rank) {
  Group group(static_cast<size_t>(size));
  std::vector<std::string> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        group[size_t(rank)] = join_rank(rank);
      } catch (const std::exception& error) {
        errors[size_t(rank)] = error.what();
      }
    });
  for (auto& thread : threads) thread.join();
  for (const std::string& error : errors)
    if (!error.empty()) throw std::runtime_error("forming the group failed: " + error);
  return group;
}

Traits local_traits() {
  Traits traits;
  traits.name = "local";
  traits.form = [](const std::string& name, int size) {
    return form_with_threads(size, [&](int rank) {
      return co2::transport::local::join(name, rank, size, kFormTimeout, {});
    });
  };
  return traits;
}

#ifdef CO2_HAVE_UCX
Traits ucx_traits() {
  Traits traits;
  traits.name = "ucx";
  traits.form = [](const std::string& name, int size) {
    auto store = co2::store::make_memory_store();
    return form_with_threads(size, [&](int rank) {
      return co2::transport::ucx::connect(*store, name + "/", rank, size, kFormTimeout);
    });
  };
  traits.sends_complete_locally = true;
  traits.mismatch_leaves_buffer_untouched = false;
  traits.waits_are_exact = false;
  return traits;
}
#endif

class TransportConformance : public ::testing::TestWithParam<Traits> {
 protected:
  void SetUp() override {
#ifdef CO2_HAVE_UCX
    if (GetParam().name == "ucx" && !co2::transport::ucx::available())
      GTEST_SKIP() << "UCX cannot be initialised here";
#endif
  }

  Group form(int size) { return GetParam().form(unique_name("g"), size); }
  const Traits& traits() const { return GetParam(); }
};

// Polls until the handle is no longer pending, or `limit` passes (then Pending). Every live
// member of the group progresses meanwhile.
Outcome wait_outcome(Group& group, int rank, Handle handle, milliseconds limit = kWaitLimit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const Outcome outcome = group[size_t(rank)]->test(handle);
    if (outcome != Outcome::Pending || Clock::now() >= deadline) return outcome;
    for (auto& member : group)
      if (member) member->progress();
    group[size_t(rank)]->wait_for_activity(std::chrono::microseconds(200));
  }
}

// Like wait_outcome, for a thread that owns one transport.
Outcome wait_alone(PointToPoint& transport, Handle handle, milliseconds limit = kWaitLimit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    const Outcome outcome = transport.test(handle);
    if (outcome != Outcome::Pending || Clock::now() >= deadline) return outcome;
    transport.wait_for_activity(std::chrono::microseconds(1000));
  }
}

// ---------------------------------------------------------------------------------------------
// Formation

TEST_P(TransportConformance, FormsAGroupOfAllRanks) {
  Group group = form(4);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_NE(group[size_t(rank)], nullptr);
    EXPECT_EQ(group[size_t(rank)]->rank(), rank);
    EXPECT_EQ(group[size_t(rank)]->size(), 4);
  }
}

TEST_P(TransportConformance, SingleRankGroupTalksToItself) {
  Group group = form(1);
  EXPECT_EQ(group[0]->size(), 1);
  int sent = 11, received = 0;
  const Handle recv = group[0]->post_recv(0, 1, &received, sizeof received);
  const Handle send = group[0]->post_send(0, 1, &sent, sizeof sent);
  EXPECT_EQ(wait_outcome(group, 0, send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, recv), Outcome::Done);
  EXPECT_EQ(received, 11);
}

// ---------------------------------------------------------------------------------------------
// Matching and copying

TEST_P(TransportConformance, MatchesEqualTagsInPostingOrder) {
  Group group = form(2);
  std::vector<int> sent = {1, 2, 3};
  std::vector<int> received(3, 0);
  std::vector<Handle> sends, recvs;
  // Sends first (they wait unexpected), then the receives.
  for (int& value : sent) sends.push_back(group[0]->post_send(1, 5, &value, sizeof value));
  for (int& value : received) recvs.push_back(group[1]->post_recv(0, 5, &value, sizeof value));
  for (Handle handle : sends) EXPECT_EQ(wait_outcome(group, 0, handle), Outcome::Done);
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(group, 1, handle), Outcome::Done);
  EXPECT_EQ(received, sent);

  // Receives first this time.
  received.assign(3, 0);
  recvs.clear();
  sends.clear();
  for (int& value : received) recvs.push_back(group[1]->post_recv(0, 5, &value, sizeof value));
  for (int& value : sent) sends.push_back(group[0]->post_send(1, 5, &value, sizeof value));
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(group, 1, handle), Outcome::Done);
  for (Handle handle : sends) EXPECT_EQ(wait_outcome(group, 0, handle), Outcome::Done);
  EXPECT_EQ(received, sent);
}

TEST_P(TransportConformance, MatchesInPostingOrderAcrossMessageSizes) {
  // Small and large messages on one tag: a transport that switches protocol by size (UCX:
  // eager below a threshold, rendezvous above) must still match in posting order.
  Group group = form(2);
  const std::vector<size_t> sizes = {0, 1, 100, 10000, 100000, size_t(3) << 20, 7};
  std::vector<std::vector<uint8_t>> sent, received;
  for (size_t index = 0; index < sizes.size(); ++index) {
    sent.emplace_back(sizes[index]);
    for (size_t i = 0; i < sizes[index]; ++i) sent.back()[i] = uint8_t(index * 31 + i * 7);
    received.emplace_back(sizes[index], 0xEE);
  }
  std::vector<Handle> sends, recvs;
  for (auto& data : sent) sends.push_back(group[0]->post_send(1, 42, data.data(), data.size()));
  for (auto& data : received) recvs.push_back(group[1]->post_recv(0, 42, data.data(), data.size()));
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(group, 1, handle), Outcome::Done);
  for (Handle handle : sends) EXPECT_EQ(wait_outcome(group, 0, handle), Outcome::Done);
  EXPECT_EQ(received, sent);
}

TEST_P(TransportConformance, MatchesBySourceAndTag) {
  Group group = form(3);
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
  for (Handle handle : recvs) EXPECT_EQ(wait_outcome(group, 1, handle), Outcome::Done);
  EXPECT_EQ(got[0], 28);
  EXPECT_EQ(got[1], 8);
  EXPECT_EQ(got[2], 7);
  EXPECT_EQ(got[3], 27);
  EXPECT_EQ(wait_outcome(group, 0, sends[0]), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, sends[1]), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 2, sends[2]), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 2, sends[3]), Outcome::Done);
}

TEST_P(TransportConformance, UsesTheWholeTagRange) {
  Group group = form(2);
  const uint64_t high = (uint64_t(1) << kTagBits) - 1;
  int a = 1, b = 2, got_a = 0, got_b = 0;
  const Handle recv_b = group[1]->post_recv(0, 0, &got_b, sizeof got_b);
  const Handle recv_a = group[1]->post_recv(0, high, &got_a, sizeof got_a);
  const Handle send_a = group[0]->post_send(1, high, &a, sizeof a);
  const Handle send_b = group[0]->post_send(1, 0, &b, sizeof b);
  EXPECT_EQ(wait_outcome(group, 1, recv_a), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv_b), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, send_a), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, send_b), Outcome::Done);
  EXPECT_EQ(got_a, 1);
  EXPECT_EQ(got_b, 2);
}

TEST_P(TransportConformance, TagWiderThanTheBudgetFails) {
  Group group = form(2);
  int value = 0;
  const uint64_t wide = uint64_t(1) << kTagBits;
  EXPECT_EQ(group[0]->test(group[0]->post_send(1, wide, &value, sizeof value)), Outcome::Failed);
  EXPECT_NE(group[0]->error_message().find("bits"), std::string::npos) << group[0]->error_message();
  EXPECT_EQ(group[1]->test(group[1]->post_recv(0, ~uint64_t(0), &value, sizeof value)),
            Outcome::Failed);
}

TEST_P(TransportConformance, CopiesLargeMessagesExactly) {
  Group group = form(2);
  std::vector<uint32_t> data(size_t(1) << 22);  // 16 MiB
  std::iota(data.begin(), data.end(), 12345u);
  std::vector<uint32_t> received(data.size(), 0);
  const size_t bytes = data.size() * sizeof(uint32_t);
  const Handle recv = group[1]->post_recv(0, 1, received.data(), bytes);
  const Handle send = group[0]->post_send(1, 1, data.data(), bytes);
  EXPECT_EQ(wait_outcome(group, 0, send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
  EXPECT_EQ(received, data);
}

TEST_P(TransportConformance, SendToSelfWorks) {
  Group group = form(2);
  double sent = 2.5, received = 0;
  const Handle send = group[1]->post_send(1, 3, &sent, sizeof sent);
  const Handle recv = group[1]->post_recv(1, 3, &received, sizeof received);
  EXPECT_EQ(wait_outcome(group, 1, send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
  EXPECT_EQ(received, 2.5);

  std::vector<char> big(size_t(2) << 20, 'z'), big_in(big.size());
  const Handle big_recv = group[1]->post_recv(1, 4, big_in.data(), big_in.size());
  const Handle big_send = group[1]->post_send(1, 4, big.data(), big.size());
  EXPECT_EQ(wait_outcome(group, 1, big_recv), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, big_send), Outcome::Done);
  EXPECT_EQ(big_in, big);
}

TEST_P(TransportConformance, ZeroLengthMessagesComplete) {
  Group group = form(2);
  const Handle send = group[0]->post_send(1, 9, nullptr, 0);
  const Handle recv = group[1]->post_recv(0, 9, nullptr, 0);
  EXPECT_EQ(wait_outcome(group, 0, send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
  const Handle self_recv = group[0]->post_recv(0, 9, nullptr, 0);
  const Handle self_send = group[0]->post_send(0, 9, nullptr, 0);
  EXPECT_EQ(wait_outcome(group, 0, self_send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, self_recv), Outcome::Done);
}

TEST_P(TransportConformance, SizeMismatchIsReportedAtTheReceiver) {
  Group group = form(2);
  char sent[16] = "0123456789abcde";
  char received[8] = {};
  const Handle send = group[0]->post_send(1, 4, sent, sizeof sent);
  const Handle recv = group[1]->post_recv(0, 4, received, sizeof received);
  const Outcome send_outcome = wait_outcome(group, 0, send);
  if (traits().sends_complete_locally) {
    EXPECT_TRUE(send_outcome == Outcome::SizeMismatch || send_outcome == Outcome::Done);
  } else {
    EXPECT_EQ(send_outcome, Outcome::SizeMismatch);
  }
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::SizeMismatch);
  const std::string message = group[1]->error_message();
  EXPECT_NE(message.find("16 bytes sent"), std::string::npos) << message;
  EXPECT_NE(message.find("8 bytes expected"), std::string::npos) << message;
  if (traits().mismatch_leaves_buffer_untouched) {
    EXPECT_EQ(received[0], 0) << "nothing is copied on a mismatch";
  }

  // A message shorter than the receive is a mismatch too.
  char large[32] = {};
  const Handle short_send = group[0]->post_send(1, 5, sent, 4);
  const Handle long_recv = group[1]->post_recv(0, 5, large, sizeof large);
  EXPECT_EQ(wait_outcome(group, 1, long_recv), Outcome::SizeMismatch);
  EXPECT_NE(group[1]->error_message().find("4 bytes sent, 32 bytes expected"), std::string::npos)
      << group[1]->error_message();
  wait_outcome(group, 0, short_send);

  // The mismatched pair was consumed: the next messages on that tag match normally.
  char again[8] = {};
  const Handle send2 = group[0]->post_send(1, 4, sent, sizeof again);
  const Handle recv2 = group[1]->post_recv(0, 4, again, sizeof again);
  EXPECT_EQ(wait_outcome(group, 0, send2), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv2), Outcome::Done);
  EXPECT_EQ(std::memcmp(again, sent, sizeof again), 0);
}

TEST_P(TransportConformance, LargeSizeMismatchEndsBothSides) {
  // Large enough for UCX's rendezvous protocol: neither side may be left pending.
  Group group = form(2);
  std::vector<char> sent(size_t(1) << 20, 's'), received(size_t(1) << 19, 0);
  const Handle recv = group[1]->post_recv(0, 6, received.data(), received.size());
  const Handle send = group[0]->post_send(1, 6, sent.data(), sent.size());
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::SizeMismatch);
  EXPECT_NE(group[1]->error_message().find("524288 bytes expected"), std::string::npos)
      << group[1]->error_message();
  const Outcome send_outcome = wait_outcome(group, 0, send);
  EXPECT_NE(send_outcome, Outcome::Pending);
  EXPECT_NE(send_outcome, Outcome::PeerLost);
  // The tag still works afterwards.
  std::vector<char> again(received.size(), 0);
  const Handle recv2 = group[1]->post_recv(0, 6, again.data(), again.size());
  const Handle send2 = group[0]->post_send(1, 6, sent.data(), again.size());
  EXPECT_EQ(wait_outcome(group, 1, recv2), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 0, send2), Outcome::Done);
  EXPECT_EQ(again, std::vector<char>(again.size(), 's'));
}

TEST_P(TransportConformance, HandlesAreReleasedOnceFinished) {
  Group group = form(2);
  int value = 1, received = 0;
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
  EXPECT_EQ(group[1]->test(recv), Outcome::Failed);
  EXPECT_NE(group[1]->error_message().find("unknown handle"), std::string::npos);
  EXPECT_EQ(wait_outcome(group, 0, send), Outcome::Done);
  EXPECT_EQ(group[0]->test(987654), Outcome::Failed);
}

TEST_P(TransportConformance, PeerOutOfRangeFails) {
  Group group = form(2);
  int value = 0;
  EXPECT_EQ(group[0]->test(group[0]->post_send(2, 1, &value, sizeof value)), Outcome::Failed);
  EXPECT_EQ(group[0]->test(group[0]->post_recv(-1, 1, &value, sizeof value)), Outcome::Failed);
  EXPECT_NE(group[0]->error_message().find("out of range"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Abort and lost peers

// Makes `rank` progress until it has noticed an abort (a receive nobody sends ends Aborted).
Outcome noticed_abort(Group& group, int rank) {
  int unused = 0;
  return wait_outcome(group, rank, group[size_t(rank)]->post_recv(rank, 77777, &unused, sizeof unused));
}

TEST_P(TransportConformance, AbortFromAnotherThreadWakesAWaiterAndFailsEverything) {
  Group group = form(3);
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
    // Long waits: only the abort can end them before the deadline.
    while (waiter_outcome == Outcome::Pending && Clock::now() - start < std::chrono::seconds(20)) {
      group[1]->wait_for_activity(std::chrono::seconds(20));
      waiter_outcome = group[1]->test(recv);
    }
    waited = Clock::now() - start;
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(50));
  group[0]->abort("test abort");
  waiter.join();

  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_EQ(waiter_outcome, Outcome::Aborted);
  EXPECT_NE(group[1]->error_message().find("test abort"), std::string::npos)
      << group[1]->error_message();
  const Outcome send_outcome = wait_outcome(group, 2, unmatched_send);
  if (traits().sends_complete_locally) {
    EXPECT_TRUE(send_outcome == Outcome::Aborted || send_outcome == Outcome::Done);
  } else {
    EXPECT_EQ(send_outcome, Outcome::Aborted);
  }
  // Every member learns of it, and future operations fail, even ones that would match.
  EXPECT_EQ(noticed_abort(group, 2), Outcome::Aborted);
  EXPECT_NE(group[2]->error_message().find("test abort"), std::string::npos)
      << group[2]->error_message();
  EXPECT_EQ(noticed_abort(group, 0), Outcome::Aborted);
  int other = 0;
  const Handle late_send = group[2]->post_send(1, 3, &value, sizeof value);
  const Handle late_recv = group[1]->post_recv(2, 3, &other, sizeof other);
  EXPECT_EQ(group[2]->test(late_send), Outcome::Aborted);
  EXPECT_EQ(group[1]->test(late_recv), Outcome::Aborted);
  EXPECT_EQ(other, 0);
}

TEST_P(TransportConformance, AbortReleasesPendingLargeSends) {
  // A large send the peer never receives is still in flight when the group aborts; the abort
  // must end it, so that the caller may free its buffer.
  Group group = form(2);
  std::vector<char> data(size_t(8) << 20, 'q');
  const Handle send = group[0]->post_send(1, 1, data.data(), data.size());
  EXPECT_EQ(group[0]->test(send), Outcome::Pending);
  group[1]->abort("stop");
  const Outcome outcome = wait_outcome(group, 0, send);
  if (traits().sends_complete_locally) {
    // Over UCX/shared memory the aborted receiver drops the message instead.
    EXPECT_TRUE(outcome == Outcome::Aborted || outcome == Outcome::Done) << group[0]->error_message();
  } else {
    EXPECT_EQ(outcome, Outcome::Aborted) << group[0]->error_message();
  }
}

TEST_P(TransportConformance, AbortKeepsTheFirstReason) {
  Group group = form(2);
  group[0]->abort("first reason");
  group[0]->abort("second reason");
  int value = 0;
  EXPECT_EQ(group[0]->test(group[0]->post_recv(1, 1, &value, sizeof value)), Outcome::Aborted);
  EXPECT_NE(group[0]->error_message().find("first reason"), std::string::npos);
  EXPECT_EQ(group[0]->error_message().find("second reason"), std::string::npos);
  EXPECT_EQ(noticed_abort(group, 1), Outcome::Aborted);
  EXPECT_NE(group[1]->error_message().find("first reason"), std::string::npos)
      << group[1]->error_message();
}

TEST_P(TransportConformance, DestroyedPeerGivesPeerLost) {
  Group group = form(3);
  int received = 0, value = 1;
  const Handle recv_from_0 = group[1]->post_recv(0, 1, &received, sizeof received);
  const Handle send_to_0 = group[2]->post_send(0, 1, &value, sizeof value);
  group[0].reset();
  EXPECT_EQ(wait_outcome(group, 1, recv_from_0), Outcome::PeerLost);
  EXPECT_NE(group[1]->error_message().find("rank 0"), std::string::npos);
  const Outcome send_outcome = wait_outcome(group, 2, send_to_0);
  if (traits().sends_complete_locally) {
    EXPECT_TRUE(send_outcome == Outcome::PeerLost || send_outcome == Outcome::Done);
  } else {
    EXPECT_EQ(send_outcome, Outcome::PeerLost);
  }
  // Once rank 2 noticed (a receive from rank 0 ends PeerLost), sends to rank 0 fail at once.
  EXPECT_EQ(wait_outcome(group, 2, group[2]->post_recv(0, 2, &received, sizeof received)),
            Outcome::PeerLost);
  EXPECT_EQ(group[2]->test(group[2]->post_send(0, 2, &value, sizeof value)), Outcome::PeerLost);
  EXPECT_EQ(wait_outcome(group, 1, group[1]->post_recv(0, 2, &received, sizeof received)),
            Outcome::PeerLost);
  // The survivors still talk to each other.
  const Handle send = group[2]->post_send(1, 3, &value, sizeof value);
  const Handle recv = group[1]->post_recv(2, 3, &received, sizeof received);
  EXPECT_EQ(wait_outcome(group, 2, send), Outcome::Done);
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
}

TEST_P(TransportConformance, MessageCompletedBeforeThePeerDiedStaysDone) {
  Group group = form(2);
  int value = 42, received = 0;
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  group[0].reset();
  EXPECT_EQ(wait_outcome(group, 1, recv), Outcome::Done);
  EXPECT_EQ(received, 42);
  (void)send;
}

TEST_P(TransportConformance, MessageSentBeforeThePeerDiedIsStillReceived) {
  // The receive is posted only after the sender is gone: a small message that left before
  // its sender was destroyed is delivered where the transport buffers it (UCX), or reported
  // PeerLost where the sender's buffer was the only copy (local). Never a hang, never garbage.
  Group group = form(2);
  int value = 43, received = 0;
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  if (traits().sends_complete_locally) {
    EXPECT_EQ(wait_outcome(group, 0, send), Outcome::Done);
  }
  group[0].reset();
  const Outcome outcome = wait_outcome(group, 1, group[1]->post_recv(0, 1, &received, sizeof received));
  if (traits().sends_complete_locally) {
    EXPECT_EQ(outcome, Outcome::Done);
    EXPECT_EQ(received, 43);
  } else {
    EXPECT_EQ(outcome, Outcome::PeerLost);
    EXPECT_EQ(received, 0);
  }
}

TEST_P(TransportConformance, WaitForActivityWakesWhenAMessageArrives) {
  Group group = form(2);
  int value = 7, received = 0;
  const Handle recv = group[1]->post_recv(0, 1, &received, sizeof received);
  std::atomic<bool> waiting{false};
  Clock::duration waited{};
  Outcome outcome = Outcome::Pending;
  std::thread waiter([&] {
    waiting = true;
    const auto start = Clock::now();
    while (outcome == Outcome::Pending && Clock::now() - start < std::chrono::seconds(20)) {
      group[1]->wait_for_activity(std::chrono::seconds(20));
      outcome = group[1]->test(recv);
    }
    waited = Clock::now() - start;
  });
  while (!waiting) std::this_thread::yield();
  std::this_thread::sleep_for(milliseconds(30));
  const Handle send = group[0]->post_send(1, 1, &value, sizeof value);
  waiter.join();
  EXPECT_LT(waited, std::chrono::seconds(10));
  EXPECT_EQ(outcome, Outcome::Done);
  EXPECT_EQ(received, 7);
  EXPECT_EQ(wait_alone(*group[0], send), Outcome::Done);
}

TEST_P(TransportConformance, WaitForActivityReturnsAfterMaxWait) {
  Group group = form(2);
  const auto start = Clock::now();
  group[0]->wait_for_activity(std::chrono::microseconds(20000));
  const auto waited = Clock::now() - start;
  EXPECT_LT(waited, std::chrono::seconds(10));
  if (traits().waits_are_exact) {
    EXPECT_GE(waited, milliseconds(20));
  }
}

TEST_P(TransportConformance, ManyThreadsExchangeManyMessages) {
  constexpr int kRanks = 4;
  constexpr int kMessages = 200;
  Group group = form(kRanks);
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
        if (wait_alone(me, handle) != Outcome::Done) ++wrong;
      for (int peer = 0; peer < kRanks; ++peer)
        for (int i = 0; i < kMessages; ++i)
          if (received[size_t(peer * kMessages + i)] != int64_t(peer) * 1000000 + rank * 1000 + i)
            ++wrong;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

std::vector<Traits> built_transports() {
  std::vector<Traits> all = {local_traits()};
#ifdef CO2_HAVE_UCX
  all.push_back(ucx_traits());
#endif
  return all;
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportConformance, ::testing::ValuesIn(built_transports()),
                         [](const ::testing::TestParamInfo<Traits>& info) { return info.param.name; });

}  // namespace

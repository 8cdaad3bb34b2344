// The communicator over a collective-kind transport (the NCCL seam), with an in-process fake
// transport: completion, on_result, and the fault handling it shares with point-to-point
// (sticky first error, transport aborted, no-progress timeout, abort from another thread).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "tests/runtime/comm/collective_group_fake.hpp"

namespace co2 {
namespace {

using namespace std::chrono_literals;

enum class Behaviour { Complete, Hang, LosePeer };

// A group of one whose collectives complete after a few polls (or never, or with a lost peer).
class FakeCollective final : public transport::Collective {
 public:
  struct Shared {
    std::atomic<Behaviour> behaviour{Behaviour::Complete};
    std::atomic<int> aborts{0};
    std::atomic<int> posts{0};
    // >= 0: the group has a second rank whose every collective has this purpose (the
    // descriptor all-gather shows it), as when that rank issued another collective.
    std::atomic<int> peer_purpose{-1};
    // >= 0 (with peer_purpose): the peer's collectives are of this collectives::Kind instead.
    std::atomic<int> peer_kind{-1};
  };
  explicit FakeCollective(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  int rank() const override { return 0; }
  int size() const override { return shared_->peer_purpose.load() >= 0 ? 2 : 1; }
  void* stream() const override { return const_cast<int*>(&stream_tag_); }

  transport::Handle post_allreduce(const void* send, void* recv, size_t count, DataType e,
                                   ReduceOp) override {
    const size_t bytes = count * (e == DataType::F32 || e == DataType::I32 ? 4 : 8);
    if (send != recv) std::memmove(recv, send, bytes);  // a group of one: the average is the input
    return post();
  }
  transport::Handle post_broadcast(void*, size_t, DataType, int) override { return post(); }
  transport::Handle post_allgather(const void* send, void* recv, size_t count, DataType e) override {
    const size_t bytes = count * (e == DataType::F32 || e == DataType::I32 ? 4 : 8);
    std::memmove(recv, send, bytes);
    if (shared_->peer_purpose.load() >= 0) {
      // The peer's descriptor: ours with another purpose (byte 40 of the wire layout).
      auto* peer = static_cast<unsigned char*>(recv) + bytes;
      std::memcpy(peer, send, bytes);
      peer[40] = static_cast<unsigned char>(shared_->peer_purpose.load());
      if (shared_->peer_kind.load() >= 0) peer[5] = static_cast<unsigned char>(shared_->peer_kind.load());
    }
    return post();
  }
  // A group of one: its shard is the whole buffer, already reduced and gathered.
  transport::Handle post_reduce_scatter(void*, size_t, DataType, ReduceOp) override {
    return post();
  }
  transport::Handle post_allgather_shards(void*, size_t, DataType) override { return post(); }
  transport::Outcome test(transport::Handle h) override {
    if (aborted_) return transport::Outcome::Aborted;
    switch (shared_->behaviour.load()) {
      case Behaviour::Hang: return transport::Outcome::Pending;
      case Behaviour::LosePeer: return transport::Outcome::PeerLost;
      case Behaviour::Complete: break;
    }
    return ++polls_[h] >= 3 ? transport::Outcome::Done : transport::Outcome::Pending;
  }
  void abort(const std::string&) override {
    aborted_ = true;
    ++shared_->aborts;
  }
  std::string error_message() const override { return "fake peer 1 went away"; }

 private:
  transport::Handle post() {
    ++shared_->posts;
    return next_++;
  }
  std::shared_ptr<Shared> shared_;
  int stream_tag_ = 0;
  std::atomic<bool> aborted_{false};
  std::unordered_map<transport::Handle, int> polls_;
  transport::Handle next_ = 1;
};

struct Fixture {
  std::shared_ptr<FakeCollective::Shared> shared = std::make_shared<FakeCollective::Shared>();
  std::unique_ptr<Communicator> comm;
  explicit Fixture(std::chrono::milliseconds timeout = 10s, int peer_purpose = -1) {
    shared->peer_purpose = peer_purpose;  // fixes the group's size before the backend reads it
    CommOptions options;
    options.timeout = timeout;
    comm = std::make_unique<Communicator>(std::make_unique<FakeCollective>(shared), options);
  }
};

TEST(CollectiveComm, CompletesAndRunsOnResultFirst) {
  Fixture f;
  float x[4] = {1, 2, 3, 4};
  std::atomic<bool> ran{false};
  auto request = f.comm->allreduce_then(x, 4, DataType::F32, ReduceOp::Avg, [&] { ran = true; });
  EXPECT_EQ(request->wait_status(), Status::Ok);
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(x[3], 4.0f);
  EXPECT_NE(f.comm->collective_stream(), nullptr);
  int64_t mine = 7, all = 0;
  EXPECT_EQ(f.comm->allgather(&mine, &all, 1, DataType::I64)->wait_status(), Status::Ok);
  EXPECT_EQ(all, 7);
  EXPECT_EQ(f.comm->broadcast(x, 4, DataType::F32, 0)->wait_status(), Status::Ok);
  EXPECT_EQ(f.comm->error_status(), Status::Ok);
}

TEST(CollectiveComm, PeerLossIsStickyAndAbortsTheTransport) {
  Fixture f;
  f.shared->behaviour = Behaviour::LosePeer;
  float x[2] = {1, 2};
  auto request = f.comm->allreduce(x, 2, DataType::F32, ReduceOp::Sum);
  EXPECT_EQ(request->wait_status(), Status::PeerLost);
  EXPECT_EQ(f.comm->error_status(), Status::PeerLost);
  EXPECT_NE(f.comm->error_message().find("went away"), std::string::npos);
  EXPECT_GE(f.shared->aborts.load(), 1);  // peers are told promptly
  try {
    f.comm->allreduce(x, 2, DataType::F32, ReduceOp::Sum);
    ADD_FAILURE() << "a failed communicator accepted a collective";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), Status::PeerLost);
  }
}

TEST(CollectiveComm, NoProgressForTheTimeoutIsPeerTimeout) {
  Fixture f(100ms);
  f.shared->behaviour = Behaviour::Hang;
  float x[2] = {1, 2};
  auto request = f.comm->allreduce(x, 2, DataType::F32, ReduceOp::Sum);
  EXPECT_EQ(request->wait_status(), Status::PeerTimeout);
  EXPECT_EQ(f.comm->error_status(), Status::PeerTimeout);
  EXPECT_GE(f.shared->aborts.load(), 1);
}

TEST(CollectiveComm, AbortFromAnotherThreadReleasesAWaiter) {
  Fixture f;
  f.shared->behaviour = Behaviour::Hang;
  float x[2] = {1, 2};
  auto request = f.comm->allreduce(x, 2, DataType::F32, ReduceOp::Sum);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    f.comm->abort();
  });
  EXPECT_EQ(request->wait_status(), Status::Aborted);
  aborter.join();
  EXPECT_EQ(f.comm->error_status(), Status::Aborted);
}

TEST(CollectiveComm, DestroyWithCollectivesInFlightFailsThem) {
  Fixture f;
  f.shared->behaviour = Behaviour::Hang;
  float x[2] = {1, 2};
  auto request = f.comm->allreduce(x, 2, DataType::F32, ReduceOp::Sum);
  f.comm.reset();
  EXPECT_EQ(request->wait_status(), Status::Aborted);
}

// NCCL exchanges no descriptors: the backend all-gathers them before each collective and every
// rank compares all of them (issue 12, item 2).
TEST(CollectiveComm, AnotherPurposeOnAPeerIsACollectiveMismatch) {
  Fixture f(10s, int(Purpose::OuterAverage));
  float x[4] = {1, 2, 3, 4};
  std::atomic<bool> ran{false};
  auto request = f.comm->allreduce_then(x, 4, DataType::F32, ReduceOp::Avg, [&] { ran = true; },
                                        {1, Purpose::Consensus});
  EXPECT_EQ(request->wait_status(), Status::CollectiveMismatch);
  EXPECT_FALSE(ran.load()) << "the result of a mismatched collective was used";
  EXPECT_EQ(f.comm->error_status(), Status::CollectiveMismatch);
  const std::string message = f.comm->error_message();
  EXPECT_NE(message.find("consensus"), std::string::npos) << message;
  EXPECT_NE(message.find("outer-average"), std::string::npos) << message;
  EXPECT_GE(f.shared->aborts.load(), 1);  // the peers fail too, and a hung collective ends
}

TEST(CollectiveComm, EqualIdentitiesPassTheCheck) {
  Fixture f(10s, int(Purpose::Consensus));
  float x[4] = {1, 2, 3, 4};
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(f.comm->allreduce(x, 4, DataType::F32, ReduceOp::Avg, {1, Purpose::Consensus})->wait_status(),
              Status::Ok)
        << f.comm->error_message();
}

TEST(CollectiveComm, ReduceScatterAndAllGatherShardsCompleteAndRunTheirHooks) {
  Fixture f;
  float x[5] = {1, 2, 3, 4, 5};
  std::atomic<int> ran{0};
  EXPECT_EQ(f.comm->reduce_scatter(x, 5, DataType::F32, ReduceOp::Avg, {}, {}, [&] { ++ran; })->wait_status(),
            Status::Ok);
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(f.comm->allgather_shards(x, 5, DataType::F32, {}, [&] { ++ran; })->wait_status(), Status::Ok);
  EXPECT_EQ(ran.load(), 2);
  EXPECT_EQ(f.shared->posts.load(), 4);  // each: the descriptor check and the collective
  EXPECT_EQ(x[4], 5.0f);
  // Compressed, a group of one sends nothing: its result is its input and nothing is dropped.
  std::vector<float> residual(5, -1.0f);
  const float y[5] = {1.1f, 2.2f, 3.3f, 4.4f, 5.5f};
  std::copy(y, y + 5, x);
  EXPECT_EQ(f.comm->reduce_scatter(x, 5, DataType::F32, ReduceOp::Avg, {}, {WireFormat::Int8, residual.data(), {}})
                ->wait_status(),
            Status::Ok);
  EXPECT_TRUE(std::equal(x, x + 5, y));
  EXPECT_EQ(residual, std::vector<float>(5, 0.0f));
}

TEST(CollectiveComm, ReduceScatterAgainstAPeersAllReduceIsACollectiveMismatch) {
  Fixture f(10s, int(Purpose::OuterAverage));
  f.shared->peer_kind = 1;  // collectives::Kind::AllReduce
  float x[4] = {1, 2, 3, 4};
  std::atomic<bool> ran{false};
  auto request = f.comm->reduce_scatter(x, 4, DataType::F32, ReduceOp::Avg, {1, Purpose::OuterAverage}, {},
                                        [&] { ran = true; });
  EXPECT_EQ(request->wait_status(), Status::CollectiveMismatch);
  EXPECT_FALSE(ran.load());
  const std::string message = f.comm->error_message();
  EXPECT_NE(message.find("reduce_scatter(avg, f32, count 4)"), std::string::npos) << message;
  EXPECT_NE(message.find("allreduce(avg, f32, count 4)"), std::string::npos) << message;
}

// A chain's all-gather waits for its reduce-scatter (whose on_result rewrites the shard), and a
// collective submitted after it waits too: the transport runs collectives in posting order, which
// must be the same on every rank.
TEST(CollectiveComm, AGatedCollectiveAndEveryLaterOneArePostedOnlyOnceItsRequestCompleted) {
  Fixture f;
  float x[4] = {1, 2, 3, 4};
  float y[2] = {5, 6};
  std::atomic<int> posts_at_result{-1};
  auto scatter = f.comm->reduce_scatter(x, 4, DataType::F32, ReduceOp::Avg, {}, {}, [&] {
    posts_at_result = f.shared->posts.load();
    x[0] = 42.0f;  // the shard rewritten before the all-gather sends it
  });
  auto gather = f.comm->allgather_shards(x, 4, DataType::F32, {}, {}, scatter);
  auto later = f.comm->allreduce(y, 2, DataType::F32, ReduceOp::Avg);
  EXPECT_EQ(later->wait_status(), Status::Ok) << later->message();
  EXPECT_EQ(gather->wait_status(), Status::Ok) << gather->message();
  EXPECT_EQ(scatter->wait_status(), Status::Ok);
  EXPECT_EQ(posts_at_result.load(), 2) << "only the reduce-scatter and its descriptor check were posted before it completed";
  EXPECT_EQ(f.shared->posts.load(), 6);
  EXPECT_LT(scatter->sequence(), gather->sequence());
  EXPECT_LT(gather->sequence(), later->sequence());
}

// The request a collective follows failed (here on another communicator): the collective never
// starts, and its communicator fails with a message that quotes the first failure.
TEST(CollectiveComm, AGatedCollectiveWhoseRequestFailedFailsTheCommunicatorQuotingIt) {
  Fixture lost, f;
  lost.shared->behaviour = Behaviour::Hang;
  float a[4] = {1, 2, 3, 4}, x[4] = {1, 2, 3, 4}, y[2] = {5, 6};
  auto failing = lost.comm->allreduce(a, 4, DataType::F32, ReduceOp::Avg);
  auto gather = f.comm->allgather_shards(x, 4, DataType::F32, {}, {}, failing);
  auto later = f.comm->allreduce(y, 2, DataType::F32, ReduceOp::Avg);
  EXPECT_EQ(f.shared->posts.load(), 0) << "posted before the request it follows finished";
  lost.shared->behaviour = Behaviour::LosePeer;
  EXPECT_EQ(gather->wait_status(), Status::PeerLost);
  EXPECT_NE(gather->message().find("was not started: the collective it follows failed: fake peer 1 went away"),
            std::string::npos)
      << gather->message();
  EXPECT_EQ(later->wait_status(), Status::PeerLost);
  EXPECT_EQ(f.comm->error_status(), Status::PeerLost);
  EXPECT_EQ(f.shared->posts.load(), 0);
  EXPECT_EQ(f.shared->aborts.load(), 1) << "the peers learn of it through the transport's abort";
}

// A compressed all-reduce over a collective transport, which carries no point-to-point messages:
// every rank's encoding all-gathered and decoded in rank order. The same result on every rank,
// close to the average, and the ring's error-feedback identity: sum of the inputs less the sum of
// the residuals is W times the result. A reduce-scatter leaves its shard and the residual exactly
// as the all-reduce does.
TEST(CollectiveComm, ACompressedAllReduceGathersTheEncodingsAndAgreesOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t n = 1001;
  co2test::CollectiveGroupFake group(kRanks);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < kRanks; ++r) comms.push_back(std::make_unique<Communicator>(group.rank(r), CommOptions{}));
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(n));
  for (int r = 0; r < kRanks; ++r)
    for (size_t i = 0; i < n; ++i) in[size_t(r)][i] = std::sin(0.01f * float(i) + float(r)) * float(1 + r);
  const size_t starts[] = {0, 300};
  const SegmentStarts segments{starts, 2, 0};
  const std::pair<WireFormat, double> formats[] = {{WireFormat::BF16, 0.02}, {WireFormat::Int8, 0.05},
                                                   {WireFormat::Fp4, 0.6}};
  for (const auto& [format, tolerance] : formats) {
    const std::string name = wire_format_name(format);
    auto run = [&](bool whole, std::vector<std::vector<float>>* out, std::vector<std::vector<float>>* residual) {
      *out = in;
      residual->assign(kRanks, std::vector<float>(n, -1.0f));
      std::vector<std::shared_ptr<Request>> requests;
      for (int r = 0; r < kRanks; ++r) {
        const WireCompression wire{format, (*residual)[size_t(r)].data(), segments};
        float* buffer = (*out)[size_t(r)].data();
        requests.push_back(whole ? comms[size_t(r)]->allreduce_then(buffer, n, DataType::F32, ReduceOp::Avg, {}, {}, wire)
                                 : comms[size_t(r)]->reduce_scatter(buffer, n, DataType::F32, ReduceOp::Avg, {}, wire));
      }
      for (auto& request : requests) ASSERT_EQ(request->wait_status(), Status::Ok) << request->message();
    };
    std::vector<std::vector<float>> reduced, residual, scattered, scattered_residual;
    run(true, &reduced, &residual);
    for (int r = 1; r < kRanks; ++r) EXPECT_EQ(reduced[size_t(r)], reduced[0]) << name << ": rank " << r;
    for (size_t i = 0; i < n; ++i) {
      double inputs = 0.0, drops = 0.0;
      for (int r = 0; r < kRanks; ++r) {
        inputs += in[size_t(r)][i];
        drops += residual[size_t(r)][i];
      }
      ASSERT_NEAR(inputs - drops, kRanks * double(reduced[0][i]), 1e-5) << name << " element " << i;
      ASSERT_NEAR(double(reduced[0][i]), inputs / kRanks, tolerance) << name << " element " << i;
    }
    run(false, &scattered, &scattered_residual);
    for (int r = 0; r < kRanks; ++r) {
      const transport::ShardRange shard = transport::shard_range(n, kRanks, r);
      EXPECT_TRUE(std::equal(scattered[size_t(r)].begin() + long(shard.begin), scattered[size_t(r)].begin() + long(shard.end),
                             reduced[size_t(r)].begin() + long(shard.begin)))
          << name << ": rank " << r << "'s shard is not the all-reduce's";
      EXPECT_EQ(scattered_residual[size_t(r)], residual[size_t(r)]) << name << ": rank " << r;
    }
  }
}


// The sum over the group of every rank's (rank + 1), through an all-reduce.
float sum_of_ranks(Communicator& comm) {
  float x = float(comm.rank() + 1);
  auto request = comm.allreduce(&x, 1, DataType::F32, ReduceOp::Sum);
  EXPECT_EQ(request->wait_status(), Status::Ok) << request->message();
  return x;
}

// An elastic communicator over a collective transport goes on over the transport its membership
// forms after each change, with the new rank and size: a rank leaves (its later collectives fail
// with Left, without aborting the others' transport), a thread joins, a rank goes away (its abort
// fails the others' collective, as a lost NCCL peer does, and the survivors re-form without it).
TEST(CollectiveComm, AnElasticCommunicatorContinuesOverTheCollectiveTransportOfEachNewGroup) {
  constexpr int kRanks = 3;
  auto generations = std::make_shared<co2test::CollectiveGenerations>();
  CommOptions options;
  options.timeout = 30s;
  options.elastic_min_ranks = 1;
  std::atomic<int> at_join{0};
  std::vector<std::thread> threads;
  const auto member = [&](int thread) {
    auto comm = std::make_unique<Communicator>(generations->rank_of(0, kRanks, thread), options);
    comm->set_membership(std::make_shared<co2test::CollectiveMembershipFake>(generations, thread, kRanks));
    ASSERT_TRUE(comm->elastic());
    EXPECT_EQ(sum_of_ranks(*comm), 6.0f);

    comm->release(2);
    if (thread == 2) {
      float x = 1;
      try {
        comm->allreduce(&x, 1, DataType::F32, ReduceOp::Sum);
        ADD_FAILURE() << "the rank that left still reduces";
      } catch (const Error& e) {
        EXPECT_EQ(e.status(), Status::Left) << e.what();
      }
      return;
    }
    EXPECT_EQ(comm->size(), 2);
    EXPECT_EQ(comm->rank(), thread);
    EXPECT_EQ(comm->generation(), 1u);
    EXPECT_EQ(sum_of_ranks(*comm), 3.0f);

    if (++at_join == 2) generations->join_requests = 1;
    while (comm->join_requests() == 0) std::this_thread::sleep_for(1ms);
    comm->admit(comm->join_requests());
    EXPECT_EQ(comm->size(), 3);
    EXPECT_EQ(comm->generation(), 2u);
    EXPECT_EQ(sum_of_ranks(*comm), 6.0f);

    // The joiner (rank 2) went away: this collective fails, and the group re-forms.
    float x = 1;
    auto request = comm->allreduce(&x, 1, DataType::F32, ReduceOp::Sum);
    EXPECT_EQ(request->wait_status(), Status::PeerLost);
    ASSERT_TRUE(comm->can_reform()) << comm->error_message();
    comm->reform();
    EXPECT_EQ(comm->size(), 2);
    EXPECT_EQ(comm->rank(), thread);
    EXPECT_EQ(comm->previous_ranks(), (std::vector<int>{0, 1}));
    EXPECT_EQ(comm->generation(), 3u);
    EXPECT_EQ(sum_of_ranks(*comm), 3.0f);
  };
  for (int thread = 0; thread < kRanks; ++thread) threads.emplace_back(member, thread);
  threads.emplace_back([&] {  // the joiner, admitted at generation 2 as its rank 2
    while (generations->join_requests.load() == 0) std::this_thread::sleep_for(1ms);
    Communicator comm(generations->rank_of(2, 3, 2), options);
    comm.set_membership(std::make_shared<co2test::CollectiveMembershipFake>(generations, 2, 3, 2, 1));
    comm.set_joining(true);
    EXPECT_EQ(sum_of_ranks(comm), 6.0f);
    generations->lost = 2;  // and then it goes away
    comm.abort();
  });
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace co2

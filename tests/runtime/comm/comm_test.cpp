// The communicator's collective identity and lanes (docs/capi.md "Collective identity",
// docs/architecture.md "Lanes"), over the local transport's threads.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/comm.hpp"
#include "tests/runtime/thread_group.hpp"
#include "transports/local/transport.hpp"

namespace co2 {
namespace {

using test::Outcome;

using std::chrono::milliseconds;

// A bound for every wait here: a mismatch must fail within it instead of hanging.
constexpr milliseconds kWait{20000};

std::string group_name() {
  static int counter = 0;
  return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "#" +
         std::to_string(counter++);
}

std::vector<std::unique_ptr<Communicator>> make_group(int size,
                                                      const transport::local::LinkModel& link = {},
                                                      size_t chunk_bytes = size_t(1) << 20) {
  const std::string name = group_name();
  CommOptions options;
  options.timeout = milliseconds(60000);
  options.chunk_bytes = chunk_bytes;
  return test::form_thread_group(
      size, [&](int rank) { return transport::local::join(name, rank, size, kWait, link); }, options);
}

Outcome outcome_of(const std::shared_ptr<Request>& request) { return test::outcome_of(request, kWait); }

// Rank r issues ids[r]; every other field is equal. Expects CollectiveMismatch on every rank,
// with a message that names each of `needles`.
void expect_mismatch_everywhere(const std::vector<CollectiveId>& ids,
                                const std::vector<std::string>& needles) {
  const int size = int(ids.size());
  auto group = make_group(size);
  std::vector<std::vector<float>> buffers(size_t(size), std::vector<float>(1000, 1.0f));
  std::vector<std::shared_ptr<Request>> requests;
  for (int rank = 0; rank < size; ++rank)
    requests.push_back(group[size_t(rank)]->allreduce(buffers[size_t(rank)].data(), 1000,
                                                      DataType::F32, ReduceOp::Avg, ids[size_t(rank)]));
  for (int rank = 0; rank < size; ++rank) {
    const Outcome outcome = outcome_of(requests[size_t(rank)]);
    ASSERT_TRUE(outcome.finished) << "rank " << rank << " hangs";
    EXPECT_EQ(outcome.status, Status::CollectiveMismatch) << "rank " << rank << ": " << outcome.message;
    for (const std::string& needle : needles)
      EXPECT_NE(outcome.message.find(needle), std::string::npos) << "rank " << rank << ": " << outcome.message;
    // The buffers were not touched: no data moved before the descriptors were compared.
    EXPECT_EQ(buffers[size_t(rank)][0], 1.0f);
  }
}

TEST(CollectiveIdentity, SameShapeDifferentPurposeIsAMismatchOnEveryRank) {
  const CollectiveId consensus{1, Purpose::Consensus};
  const CollectiveId outer{1, Purpose::OuterAverage};
  expect_mismatch_everywhere({consensus, outer}, {"consensus", "outer-average"});
  // Three ranks: rank 1 is not next to the difference between ranks 2 and 0... and still fails.
  expect_mismatch_everywhere({outer, outer, consensus}, {"consensus", "outer-average"});
}

TEST(CollectiveIdentity, SamePurposeOfAnotherOwnerIsAMismatch) {
  expect_mismatch_everywhere({{1, Purpose::OuterAverage}, {2, Purpose::OuterAverage}},
                             {"owner 1", "owner 2"});
  expect_mismatch_everywhere({{0, Purpose::User}, {1, Purpose::Consensus}}, {"user", "consensus"});
}

TEST(CollectiveIdentity, AMismatchFailsTheCommunicatorForGood) {
  auto group = make_group(2);
  std::vector<float> a(64, 1.0f), b(64, 1.0f), c(64, 1.0f);
  auto first0 = group[0]->allreduce(a.data(), 64, DataType::F32, ReduceOp::Avg, {1, Purpose::Consensus});
  auto first1 = group[1]->allreduce(b.data(), 64, DataType::F32, ReduceOp::Avg, {1, Purpose::OuterAverage});
  EXPECT_EQ(outcome_of(first0).status, Status::CollectiveMismatch);
  EXPECT_EQ(outcome_of(first1).status, Status::CollectiveMismatch);
  // The communicators are failed for good: later submissions throw the stored error.
  EXPECT_THROW(group[0]->allreduce(c.data(), 64, DataType::F32, ReduceOp::Avg), Error);
}

TEST(CollectiveIdentity, EqualIdentitiesStillPair) {
  auto group = make_group(3);
  std::vector<std::vector<double>> buffers(3);
  std::vector<std::shared_ptr<Request>> requests;
  for (int round = 0; round < 3; ++round) {
    requests.clear();
    for (int rank = 0; rank < 3; ++rank) {
      buffers[size_t(rank)].assign(10, double(rank + 1));
      const Purpose purpose = round == 1 ? Purpose::AnchorCheck : Purpose::Consensus;
      requests.push_back(group[size_t(rank)]->allreduce(buffers[size_t(rank)].data(), 10,
                                                        DataType::F64, ReduceOp::Sum, {4, purpose}));
    }
    for (auto& request : requests) EXPECT_TRUE(request->wait_for(kWait));
    for (auto& buffer : buffers) EXPECT_EQ(buffer[0], 6.0);
  }
  EXPECT_NE(group[0]->register_owner(), group[0]->register_owner());
}

// Item 3 of issue 12: a 16-byte all-reduce must not wait behind a large one's chunks on a slow
// link. The link model makes each (sender -> receiver) link a queue with this rate.
TEST(CollectiveLanes, SmallCollectiveOvertakesALargeOneOnASlowLink) {
  transport::local::LinkModel link;
  link.bytes_per_second = 10e6;
  // One chunk per block: the large all-reduce is two messages of 8 MiB per link (0.8 s each),
  // so without a lane of its own the small one's messages would queue behind one of them and
  // it would finish after the large one.
  constexpr size_t kLarge = size_t(4) << 20;  // floats: 16 MiB
  auto group = make_group(2, link, kLarge * sizeof(float));
  std::vector<std::vector<float>> large(2, std::vector<float>(kLarge, 1.0f));
  std::vector<std::vector<float>> small(2, std::vector<float>(4, 2.0f));
  std::vector<std::shared_ptr<Request>> large_requests, small_requests;
  for (int rank = 0; rank < 2; ++rank)
    large_requests.push_back(group[size_t(rank)]->allreduce(large[size_t(rank)].data(), kLarge,
                                                            DataType::F32, ReduceOp::Sum));
  // Let the large one's chunks fill the links first.
  std::this_thread::sleep_for(milliseconds(50));
  for (int rank = 0; rank < 2; ++rank)
    small_requests.push_back(group[size_t(rank)]->allreduce(small[size_t(rank)].data(), 4,
                                                            DataType::F32, ReduceOp::Sum));
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(small_requests[size_t(rank)]->wait_for(kWait));
    // Ordering, not timing: the small one is done while the large one is still in flight.
    EXPECT_FALSE(large_requests[size_t(rank)]->test()) << "rank " << rank;
    EXPECT_EQ(small[size_t(rank)][0], 4.0f);
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(large_requests[size_t(rank)]->wait_for(kWait));
    EXPECT_EQ(large[size_t(rank)][kLarge - 1], 2.0f);
    EXPECT_LT(small_requests[size_t(rank)]->completed_at(), large_requests[size_t(rank)]->completed_at());
  }
}

}  // namespace
}  // namespace co2

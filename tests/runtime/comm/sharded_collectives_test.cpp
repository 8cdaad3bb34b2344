// The sharded collectives of the communicator (runtime/comm/comm.hpp: reduce_scatter,
// allgather_shards): reduce_scatter followed by allgather_shards is the all-reduce bit for bit
// (every wire format, with equal error-feedback residuals), the shard layout, the result hook,
// faults and collective identity. Over the local transport and UCX, ranks as threads.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/collectives/collectives.hpp"
#include "runtime/comm/comm.hpp"
#include "tests/runtime/thread_group.hpp"
#include "tests/transports/ucx_collectives.hpp"
#include "transports/local/transport.hpp"
#ifdef CO2_HAVE_UCX
#include "rendezvous/store.hpp"
#include "transports/ucx/transport.hpp"
#endif

namespace co2 {
namespace {

using test::Outcome;

using std::chrono::milliseconds;
using Group = std::vector<std::unique_ptr<Communicator>>;

// A bound for every wait here: a fault or a mismatch must end a collective within it.
constexpr milliseconds kWait{30000};
// Small chunks, so that the larger counts run many segments with several in flight.
constexpr size_t kChunkBytes = 4096;

std::string group_name() {
  static int counter = 0;
  return std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "#" +
         std::to_string(counter++);
}

Group make_group(const std::string& kind, int size, milliseconds timeout = milliseconds(60000)) {
  const std::string name = group_name();
#ifdef CO2_HAVE_UCX
  auto store = store::make_memory_store();
#endif
  CommOptions options;
  options.timeout = timeout;
  options.chunk_bytes = kChunkBytes;
  return test::form_thread_group(
      size,
      [&](int rank) -> std::unique_ptr<transport::PointToPoint> {
#ifdef CO2_HAVE_UCX
        if (kind == "ucx") return transport::ucx::connect(*store, name + "/", rank, size, kWait);
#endif
        return transport::local::join(name, rank, size, kWait, {});
      },
      options);
}

Outcome outcome_of(const std::shared_ptr<Request>& request) { return test::outcome_of(request, kWait); }

void wait_ok(const std::vector<std::shared_ptr<Request>>& requests, const std::string& what) {
  for (size_t rank = 0; rank < requests.size(); ++rank) {
    const Outcome outcome = outcome_of(requests[rank]);
    ASSERT_TRUE(outcome.finished) << what << ": rank " << rank << " hangs";
    ASSERT_EQ(outcome.status, Status::Ok) << what << ": rank " << rank << ": " << outcome.message;
  }
}

// Input of `rank` for one case: the UCX workload's (varied exponents, so that a different order
// of operands shows in the bits).
std::vector<char> input(DataType dtype, size_t count, int rank, int seed) {
  return test::workload_input(dtype, count, rank, seed);
}

// Index of the first differing element, or -1.
long first_difference(const void* a, const void* b, size_t count, size_t element_bytes) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  for (size_t i = 0; i < count; ++i)
    if (std::memcmp(x + i * element_bytes, y + i * element_bytes, element_bytes) != 0) return long(i);
  return -1;
}

struct Case {
  size_t count;
  DataType dtype;
  ReduceOp op;
  WireFormat wire;
};

std::string describe(const Case& c, int size) {
  return "W " + std::to_string(size) + ", count " + std::to_string(c.count) + ", dtype " +
         std::to_string(int(c.dtype)) + ", op " + std::to_string(int(c.op)) + ", wire " +
         wire_format_name(c.wire);
}

// Runs `c` as an all-reduce and as reduce_scatter + allgather_shards on every rank of `group`
// and compares: the shard after the reduce-scatter (taken in its result hook), the residuals
// and the final buffers, bit for bit, and the all-reduce's result across ranks.
void expect_sharded_equals_allreduce(Group& group, const Case& c, int seed) {
  const int size = int(group.size());
  const size_t bytes = dtype_size(c.dtype);
  const bool compressed = c.wire != WireFormat::F32;
  const std::string what = describe(c, size);
  const size_t ranks = size_t(size);
  std::vector<std::vector<char>> reduced(ranks), sharded(ranks), at_hook(ranks);
  std::vector<std::vector<float>> residual_reduced(ranks), residual_sharded(ranks);
  std::vector<std::shared_ptr<Request>> requests;
  for (int rank = 0; rank < size; ++rank) {
    reduced[size_t(rank)] = sharded[size_t(rank)] = input(c.dtype, c.count, rank, seed);
    if (compressed) {
      residual_reduced[size_t(rank)].assign(c.count, -7.0f);
      residual_sharded[size_t(rank)].assign(c.count, -7.0f);
    }
  }

  for (int rank = 0; rank < size; ++rank)
    requests.push_back(group[size_t(rank)]->allreduce_then(
        reduced[size_t(rank)].data(), c.count, c.dtype, c.op, {}, {},
        {c.wire, compressed ? residual_reduced[size_t(rank)].data() : nullptr, {}}));
  wait_ok(requests, what + ": allreduce");
  requests.clear();

  for (int rank = 0; rank < size; ++rank) {
    const ShardRange shard = shard_range(c.count, size, rank);
    char* buffer = sharded[size_t(rank)].data();
    std::vector<char>* snapshot = &at_hook[size_t(rank)];
    requests.push_back(group[size_t(rank)]->reduce_scatter(
        buffer, c.count, c.dtype, c.op, {},
        {c.wire, compressed ? residual_sharded[size_t(rank)].data() : nullptr, {}},
        [=] { snapshot->assign(buffer + shard.begin * bytes, buffer + shard.end * bytes); }));
  }
  wait_ok(requests, what + ": reduce_scatter");
  requests.clear();
  for (int rank = 0; rank < size; ++rank) {
    const ShardRange shard = shard_range(c.count, size, rank);
    ASSERT_EQ(at_hook[size_t(rank)].size(), shard.count() * bytes) << what << ", rank " << rank;
    const long diff = first_difference(at_hook[size_t(rank)].data(),
                                       reduced[size_t(rank)].data() + shard.begin * bytes,
                                       shard.count(), bytes);
    EXPECT_EQ(diff, -1) << what << ", rank " << rank << ": shard after reduce_scatter differs at "
                        << shard.begin + size_t(diff);
    if (compressed) {
      EXPECT_EQ(first_difference(residual_sharded[size_t(rank)].data(),
                                 residual_reduced[size_t(rank)].data(), c.count, 4), -1)
          << what << ", rank " << rank << ": residual";
    }
  }

  for (int rank = 0; rank < size; ++rank)
    requests.push_back(
        group[size_t(rank)]->allgather_shards(sharded[size_t(rank)].data(), c.count, c.dtype));
  wait_ok(requests, what + ": allgather_shards");
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(first_difference(sharded[size_t(rank)].data(), reduced[size_t(rank)].data(), c.count,
                               bytes), -1)
        << what << ", rank " << rank << ": after allgather_shards";
    EXPECT_EQ(first_difference(reduced[size_t(rank)].data(), reduced[0].data(), c.count, bytes), -1)
        << what << ", rank " << rank << ": the all-reduce differs from rank 0's";
  }
}

std::vector<std::string> transports_built() {
  std::vector<std::string> kinds{"local"};
#ifdef CO2_HAVE_UCX
  kinds.push_back("ucx");
#endif
  return kinds;
}

class Sharded : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifdef CO2_HAVE_UCX
    if (GetParam() == "ucx" && !transport::ucx::available()) GTEST_SKIP() << "UCX cannot be initialised here";
#endif
  }
};

TEST(ShardLayout, ContiguousCoveringAndEqualButForTheTrailingShards) {
  for (int size = 1; size <= 9; ++size)
    for (size_t count : {0, 1, 2, 3, 5, 8, 9, 10, 17, 1000, 1001}) {
      const size_t s = shard_size(count, size);
      EXPECT_EQ(s, (count + size_t(size) - 1) / size_t(size));
      size_t next = 0;
      bool shorter_seen = false;
      for (int rank = 0; rank < size; ++rank) {
        const ShardRange shard = shard_range(count, size, rank);
        EXPECT_EQ(shard.begin, next) << "count " << count << ", W " << size << ", rank " << rank;
        EXPECT_LE(shard.begin, shard.end);
        EXPECT_LE(shard.count(), s);
        // Only the trailing shards are shorter: once one is, every later one is empty.
        if (shorter_seen) {
          EXPECT_EQ(shard.count(), 0u);
        }
        shorter_seen |= shard.count() < s;
        next = shard.end;
      }
      EXPECT_EQ(next, count) << "count " << count << ", W " << size;
    }
  EXPECT_EQ(shard_range(10, 4, 3).begin, 9u);  // S = 3: 3, 3, 3, 1
  EXPECT_EQ(shard_range(10, 4, 3).count(), 1u);
  EXPECT_EQ(shard_range(5, 4, 3).count(), 0u);  // S = 2: 2, 2, 1, 0
}

TEST_P(Sharded, ReduceScatterThenAllGatherIsTheAllReduceBitForBit) {
  int seed = 0;
  for (int size = 1; size <= 4; ++size) {
    Group group = make_group(GetParam(), size);
    std::vector<size_t> counts{0, 1, 7, 1000, 4099, 20011};
    if (size > 2) counts.push_back(size_t(size) - 1);  // fewer elements than ranks
    for (size_t count : counts) {
      for (WireFormat wire : {WireFormat::F32, WireFormat::BF16, WireFormat::Int8})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg})
          expect_sharded_equals_allreduce(group, {count, DataType::F32, op, wire}, seed++);
      if (count > 1000) continue;  // the other dtypes take the same path
      for (DataType dtype : {DataType::F64, DataType::I32, DataType::I64})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max})
          expect_sharded_equals_allreduce(group, {count, dtype, op, WireFormat::F32}, seed++);
      for (ReduceOp op : {ReduceOp::Min, ReduceOp::Max})
        expect_sharded_equals_allreduce(group, {count, DataType::F32, op, WireFormat::F32}, seed++);
      if (HasFailure()) return;
    }
  }
}

TEST_P(Sharded, OneMessagePerCollectiveGivesTheSameBits) {
  // One chunk holds a whole shard: a different segmentation, the same per-element order.
  Group group = make_group(GetParam(), 3);
  for (WireFormat wire : {WireFormat::F32, WireFormat::Int8})
    expect_sharded_equals_allreduce(group, {3 * 100, DataType::F32, ReduceOp::Avg, wire}, 99);
}

// A rank that aborts its communicator instead of issuing the collective: the others end with a
// status, never a hang.
void expect_abort_ends(const std::string& kind, bool reduce) {
  Group group = make_group(kind, 3);
  const size_t count = 100000;
  std::vector<std::vector<float>> buffers(3, std::vector<float>(count, 1.0f));
  std::vector<std::shared_ptr<Request>> requests;
  for (int rank = 0; rank < 2; ++rank) {
    Communicator& comm = *group[size_t(rank)];
    requests.push_back(reduce ? comm.reduce_scatter(buffers[size_t(rank)].data(), count,
                                                    DataType::F32, ReduceOp::Avg)
                              : comm.allgather_shards(buffers[size_t(rank)].data(), count,
                                                      DataType::F32));
  }
  group[2]->abort();
  for (int rank = 0; rank < 2; ++rank) {
    const Outcome outcome = outcome_of(requests[size_t(rank)]);
    ASSERT_TRUE(outcome.finished) << kind << " rank " << rank << " hangs";
    EXPECT_TRUE(outcome.status == Status::Aborted || outcome.status == Status::PeerLost)
        << kind << " rank " << rank << ": status " << int(outcome.status) << ": " << outcome.message;
  }
}

TEST_P(Sharded, AnAbortedPeerEndsReduceScatter) { expect_abort_ends(GetParam(), true); }
TEST_P(Sharded, AnAbortedPeerEndsAllGatherShards) { expect_abort_ends(GetParam(), false); }

// A chain across two communicators (as hierarchical co2's: an inter-node all-reduce, then a
// gather over all ranks `after` it) whose first link fails on one rank only: the gated gather
// must not start on a result that never came. It fails at once with the first link's status and
// message, and the peer, whose own first link was fine, ends too instead of completing.
TEST_P(Sharded, AFailedLinkFailsTheRestOfItsChainOnEveryRank) {
  Group first = make_group(GetParam(), 2);
  Group second = make_group(GetParam(), 2);
  const size_t count = 100000;
  std::vector<std::vector<float>> buffers(2, std::vector<float>(count, 1.0f));
  std::vector<std::vector<float>> gathered(2, std::vector<float>(count, 2.0f));
  auto link = first[0]->reduce_scatter(buffers[0].data(), count, DataType::F32, ReduceOp::Avg);
  first[1]->abort();
  const Outcome failed_link = outcome_of(link);
  ASSERT_TRUE(failed_link.finished);
  ASSERT_NE(failed_link.status, Status::Ok);
  std::vector<std::shared_ptr<Request>> chain = {
      second[0]->allgather_shards(gathered[0].data(), count, DataType::F32, {}, {}, link),
      second[1]->allgather_shards(gathered[1].data(), count, DataType::F32)};
  const Outcome mine = outcome_of(chain[0]);
  ASSERT_TRUE(mine.finished) << "the gated collective hangs";
  EXPECT_EQ(mine.status, failed_link.status) << mine.message;
  EXPECT_NE(mine.message.find(failed_link.message), std::string::npos)
      << "'" << mine.message << "' does not quote the failed link's '" << failed_link.message << "'";
  EXPECT_NE(mine.message.find("was not started"), std::string::npos) << mine.message;
  const Outcome peer = outcome_of(chain[1]);
  ASSERT_TRUE(peer.finished) << "the peer hangs";
  EXPECT_NE(peer.status, Status::Ok) << "the peer's collective completed without this rank's part";
  EXPECT_EQ(second[0]->error_status(), failed_link.status);
}

// A stalled peer (it issues nothing) along a chain: the first link times out, and the gated
// collective behind it fails with that timeout at once instead of starting and waiting out a
// timeout of its own (which made a hierarchical run report a stalled rank after up to 2.2 x the
// timeout). Checked by what it reports, not by a clock: the first link's timeout, quoted.
TEST_P(Sharded, AStalledPeerIsReportedOnceAlongAChain) {
  Group first = make_group(GetParam(), 2, milliseconds(300));
  Group second = make_group(GetParam(), 2, milliseconds(300));
  std::vector<float> buffer(5000, 1.0f), gathered(5000, 2.0f);
  auto link = first[0]->reduce_scatter(buffer.data(), buffer.size(), DataType::F32, ReduceOp::Sum);
  auto gated = second[0]->allgather_shards(gathered.data(), gathered.size(), DataType::F32, {}, {}, link);
  const Outcome timed_out = outcome_of(link);
  ASSERT_TRUE(timed_out.finished);
  ASSERT_EQ(timed_out.status, Status::PeerTimeout) << timed_out.message;
  const Outcome behind = outcome_of(gated);
  ASSERT_TRUE(behind.finished);
  EXPECT_EQ(behind.status, Status::PeerTimeout) << behind.message;
  EXPECT_NE(behind.message.find("was not started"), std::string::npos) << behind.message;
  EXPECT_NE(behind.message.find(timed_out.message), std::string::npos)
      << "'" << behind.message << "' does not quote the first link's '" << timed_out.message << "'";
}

TEST_P(Sharded, APeerThatNeverIssuesTimesOut) {
  std::vector<float> buffer(5000, 1.0f);
  for (bool reduce : {true, false}) {
    Group group = make_group(GetParam(), 2, milliseconds(300));
    const Outcome outcome = outcome_of(
        reduce ? group[0]->reduce_scatter(buffer.data(), buffer.size(), DataType::F32, ReduceOp::Sum)
               : group[0]->allgather_shards(buffer.data(), buffer.size(), DataType::F32));
    ASSERT_TRUE(outcome.finished);
    EXPECT_EQ(outcome.status, Status::PeerTimeout) << outcome.message;
  }
}

// Rank r issues issue[r]; every rank must fail with CollectiveMismatch, naming `needle`.
void expect_mismatch(const std::string& kind,
                     const std::vector<std::function<std::shared_ptr<Request>(Communicator&, float*)>>& issue,
                     const std::string& needle) {
  const int size = int(issue.size());
  Group group = make_group(kind, size);
  std::vector<std::vector<float>> buffers(size_t(size), std::vector<float>(1000, 1.0f));
  std::vector<std::shared_ptr<Request>> requests;
  for (int rank = 0; rank < size; ++rank)
    requests.push_back(issue[size_t(rank)](*group[size_t(rank)], buffers[size_t(rank)].data()));
  for (int rank = 0; rank < size; ++rank) {
    const Outcome outcome = outcome_of(requests[size_t(rank)]);
    ASSERT_TRUE(outcome.finished) << "rank " << rank << " hangs";
    EXPECT_EQ(outcome.status, Status::CollectiveMismatch) << "rank " << rank << ": " << outcome.message;
    EXPECT_NE(outcome.message.find(needle), std::string::npos) << "rank " << rank << ": " << outcome.message;
  }
}

std::shared_ptr<Request> scatter(Communicator& comm, float* buffer) {
  return comm.reduce_scatter(buffer, 1000, DataType::F32, ReduceOp::Avg);
}
std::shared_ptr<Request> reduce(Communicator& comm, float* buffer) {
  return comm.allreduce(buffer, 1000, DataType::F32, ReduceOp::Avg);
}
std::shared_ptr<Request> gather(Communicator& comm, float* buffer) {
  return comm.allgather_shards(buffer, 1000, DataType::F32);
}

TEST_P(Sharded, ReduceScatterAgainstAllReduceIsAMismatch) {
  expect_mismatch(GetParam(), {scatter, reduce}, "reduce_scatter(avg, f32, count 1000)");
  expect_mismatch(GetParam(), {scatter, scatter, reduce}, "allreduce(avg, f32, count 1000)");
}

TEST_P(Sharded, AllGatherShardsAgainstReduceScatterIsAMismatch) {
  expect_mismatch(GetParam(), {gather, scatter}, "allgather_shards(f32, count 1000)");
}

TEST_P(Sharded, ReduceScatterInAnotherWireFormatIsAMismatch) {
  std::vector<float> residual(1000);
  expect_mismatch(GetParam(), {scatter, [&](Communicator& comm, float* buffer) {
    return comm.reduce_scatter(buffer, 1000, DataType::F32, ReduceOp::Avg, {},
                               {WireFormat::BF16, residual.data(), {}});
  }}, "wire bf16");
}

INSTANTIATE_TEST_SUITE_P(Transports, Sharded, ::testing::ValuesIn(transports_built()),
                         [](const auto& info) { return info.param; });

TEST(ShardedInput, WhatTheRingCannotDoIsRefusedUpFront) {
  Group group = make_group("local", 1);
  std::vector<double> doubles(10);
  std::vector<float> floats(10), residual(10);
  const auto status_of = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const Error& error) {
      return error.status();
    }
    return Status::Ok;
  };
  Communicator& comm = *group[0];
  EXPECT_EQ(status_of([&] {
    comm.reduce_scatter(doubles.data(), 10, DataType::F64, ReduceOp::Sum, {}, {WireFormat::BF16, nullptr, {}});
  }), Status::InvalidArgument);
  EXPECT_EQ(status_of([&] {
    comm.reduce_scatter(floats.data(), 10, DataType::F32, ReduceOp::Max, {}, {WireFormat::Int8, nullptr, {}});
  }), Status::InvalidArgument);
  EXPECT_EQ(status_of([&] {
    comm.reduce_scatter(floats.data(), 10, DataType::F32, ReduceOp::Sum, {}, {WireFormat::F32, residual.data(), {}});
  }), Status::InvalidArgument);
  EXPECT_EQ(status_of([&] { comm.reduce_scatter(nullptr, 10, DataType::F32, ReduceOp::Sum); }),
            Status::InvalidArgument);
  EXPECT_EQ(status_of([&] { comm.allgather_shards(nullptr, 10, DataType::F32); }), Status::InvalidArgument);
  EXPECT_EQ(status_of([&] { comm.reduce_scatter(floats.data(), 10, DataType::F32, ReduceOp(9)); }),
            Status::UnknownEnum);
  // The communicator is still usable: refused submissions took no sequence number.
  EXPECT_TRUE(comm.reduce_scatter(floats.data(), 10, DataType::F32, ReduceOp::Sum)->wait_for(kWait));
}

TEST(ShardedInput, ACompressedShardAllGatherIsRefused) {
  // The all-gather forwards the owner's values as they are; a wire format there would round them.
  auto transport = transport::local::join(group_name(), 0, 1, kWait, {});
  collectives::Descriptor descriptor;
  descriptor.count = 4;
  descriptor.wire = WireFormat::BF16;
  float buffer[4] = {1, 2, 3, 4};
  try {
    collectives::make_allgather_shards(*transport, descriptor, buffer, collectives::Tuning{});
    ADD_FAILURE() << "a compressed shard all-gather was built";
  } catch (const Error& error) {
    EXPECT_EQ(error.status(), Status::Unsupported);
    EXPECT_NE(std::string(error.what()).find("fp32 only"), std::string::npos) << error.what();
  }
}

TEST(ShardedWireBytes, TheHalvesAddUpToTheAllReduce) {
  collectives::Tuning tuning;
  tuning.chunk_bytes = kChunkBytes;
  for (int size : {2, 3, 4})
    for (uint64_t count : {uint64_t(5), uint64_t(100003)})
      for (int rank = 0; rank < size; ++rank) {
        const uint64_t f32 = collectives::allreduce_wire_bytes(rank, size, count, WireFormat::F32, tuning);
        const uint64_t scatter = collectives::reduce_scatter_wire_bytes(rank, size, count, WireFormat::F32, tuning);
        EXPECT_EQ(scatter + collectives::allgather_shards_wire_bytes(rank, size, count, tuning), f32);
        // In the reduce-scatter rank r sends (partial sums of) every shard but its own.
        EXPECT_EQ(scatter, 4 * (count - shard_range(count, size, rank).count()))
            << "W " << size << ", rank " << rank;
        EXPECT_EQ(collectives::reduce_scatter_wire_bytes(rank, size, count, WireFormat::BF16, tuning),
                  scatter / 2);
      }
}

TEST(ShardedDescriptor, NewKindsRoundTripAndDescribeThemselves) {
  collectives::Descriptor descriptor;
  descriptor.kind = collectives::Kind::ReduceScatter;
  descriptor.op = ReduceOp::Avg;
  descriptor.count = 12;
  descriptor.wire = WireFormat::Int8;
  EXPECT_EQ(collectives::decode(collectives::encode(descriptor)), descriptor);
  EXPECT_NE(descriptor.to_string().find("reduce_scatter(avg, f32, count 12, wire int8)"), std::string::npos)
      << descriptor.to_string();
  descriptor.kind = collectives::Kind::AllGatherShards;
  descriptor.op = ReduceOp::Sum;
  descriptor.wire = WireFormat::F32;
  EXPECT_EQ(collectives::decode(collectives::encode(descriptor)), descriptor);
  EXPECT_NE(descriptor.to_string().find("allgather_shards(f32, count 12)"), std::string::npos)
      << descriptor.to_string();
}

}  // namespace
}  // namespace co2

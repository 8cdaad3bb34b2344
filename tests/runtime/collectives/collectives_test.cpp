// Tests of the collective state machines over the local transport, without the communicator:
// each rank is a thread that drives its collectives the way a progress thread does.
#include "runtime/collectives/collectives.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "transports/local/transport.hpp"

namespace {

using co2::DataType;
using co2::ReduceOp;
using co2::Status;
using co2::collectives::Collective;
using co2::collectives::Descriptor;
using co2::collectives::Kind;
using co2::collectives::Tuning;
using co2::transport::Outcome;
using co2::transport::PointToPoint;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Group = std::vector<std::unique_ptr<PointToPoint>>;
using Bytes = std::vector<std::byte>;

std::string unique_name() {
  static std::atomic<int> counter{0};
  return "collectives_test/" + std::to_string(counter++);
}

Group join_all(int size, const co2::transport::local::LinkModel& link = {}) {
  const std::string name = unique_name();
  Group group(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      group[size_t(rank)] = co2::transport::local::join(name, rank, size, milliseconds(10000), link);
    });
  for (auto& thread : threads) thread.join();
  return group;
}

struct RankResult {
  Status status = Status::Ok;
  std::string message;
};

using Factory = std::function<std::vector<std::unique_ptr<Collective>>(PointToPoint&, int rank)>;

// Runs each rank's collectives to the end on one thread per rank, advancing them round-robin.
// Like the communicator, a rank whose collective fails aborts its transport, so that its peers
// fail too instead of waiting. A rank still running after `limit` reports Status::Timeout.
std::vector<RankResult> run_ranks(Group& group, const Factory& make,
                                  milliseconds limit = milliseconds(60000)) {
  std::vector<RankResult> results(group.size());
  std::vector<std::thread> threads;
  for (size_t rank = 0; rank < group.size(); ++rank) {
    threads.emplace_back([&, rank] {
      PointToPoint& transport = *group[rank];
      auto collectives = make(transport, int(rank));
      RankResult& result = results[rank];
      const auto deadline = Clock::now() + limit;
      bool running = true;
      while (running) {
        running = false;
        bool progressed = false;
        for (auto& collective : collectives) {
          progressed |= collective->advance();
          if (collective->failed() && result.status == Status::Ok) {
            result = {collective->status(), collective->message()};
            transport.abort(collective->message());
          }
          running |= !collective->finished() && !collective->failed();
        }
        if (result.status != Status::Ok) break;
        if (Clock::now() > deadline) {
          result = {Status::Timeout, "rank did not finish in time"};
          transport.abort("test timeout");
          break;
        }
        if (running && !progressed) transport.wait_for_activity(std::chrono::microseconds(1000));
      }
      for (auto& collective : collectives) {
        const auto release_deadline = Clock::now() + milliseconds(5000);
        while (!collective->release_transfers() && Clock::now() < release_deadline)
          transport.wait_for_activity(std::chrono::microseconds(1000));
        EXPECT_TRUE(collective->release_transfers()) << "rank " << rank;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return results;
}

std::vector<std::unique_ptr<Collective>> one(std::unique_ptr<Collective> collective) {
  std::vector<std::unique_ptr<Collective>> list;
  list.push_back(std::move(collective));
  return list;
}

Descriptor allreduce_descriptor(uint64_t sequence, size_t count, DataType dtype, ReduceOp op) {
  Descriptor descriptor;
  descriptor.sequence = sequence;
  descriptor.kind = Kind::AllReduce;
  descriptor.count = count;
  descriptor.dtype = dtype;
  descriptor.op = op;
  return descriptor;
}

Descriptor broadcast_descriptor(uint64_t sequence, size_t count, DataType dtype, int root) {
  Descriptor descriptor;
  descriptor.sequence = sequence;
  descriptor.kind = Kind::Broadcast;
  descriptor.count = count;
  descriptor.dtype = dtype;
  descriptor.root = root;
  return descriptor;
}

Descriptor allgather_descriptor(uint64_t sequence, size_t count, DataType dtype) {
  Descriptor descriptor;
  descriptor.sequence = sequence;
  descriptor.kind = Kind::AllGather;
  descriptor.count = count;
  descriptor.dtype = dtype;
  return descriptor;
}

void expect_all_ok(const std::vector<RankResult>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank)
    EXPECT_EQ(results[rank].status, Status::Ok) << "rank " << rank << ": " << results[rank].message;
}

// ---------------------------------------------------------------------------------------------
// Typed inputs and references. Float inputs are small multiples of 1/4, so every sum is exact in
// any order and the reference can be compared exactly.

template <typename T>
T input_value(int rank, size_t index) {
  const int64_t base = int64_t((uint64_t(rank) * 7919 + index * 13) % 251) - 125;
  if constexpr (std::is_floating_point_v<T>) {
    return T(base) * T(0.25);
  } else if constexpr (sizeof(T) == 8) {
    return T(base * 1000000007LL + rank);  // needs 64-bit arithmetic
  } else {
    return T(base * 1000 + rank);
  }
}

template <typename T>
T reference_value(ReduceOp op, int ranks, size_t index) {
  T extreme = input_value<T>(0, index);
  long double sum = 0;
  int64_t integer_sum = 0;
  for (int rank = 0; rank < ranks; ++rank) {
    const T value = input_value<T>(rank, index);
    if (op == ReduceOp::Min) extreme = std::min(extreme, value);
    if (op == ReduceOp::Max) extreme = std::max(extreme, value);
    sum += value;
    integer_sum += int64_t(value);
  }
  switch (op) {
    case ReduceOp::Min:
    case ReduceOp::Max: return extreme;
    case ReduceOp::Sum:
      if constexpr (std::is_floating_point_v<T>) return T(sum);
      else return T(integer_sum);
    case ReduceOp::Avg:
      if constexpr (std::is_floating_point_v<T>) return T(sum) * (T(1) / T(ranks));
      else return T(integer_sum / ranks);
  }
  return T(0);
}

size_t element_size(DataType dtype) { return co2::dtype_size(dtype); }

template <typename T>
void fill_typed(Bytes& bytes, int rank) {
  T* values = reinterpret_cast<T*>(bytes.data());
  for (size_t i = 0; i < bytes.size() / sizeof(T); ++i) values[i] = input_value<T>(rank, i);
}

template <typename T>
Bytes reference_typed(ReduceOp op, int ranks, size_t count) {
  Bytes bytes(count * sizeof(T));
  T* values = reinterpret_cast<T*>(bytes.data());
  for (size_t i = 0; i < count; ++i) values[i] = reference_value<T>(op, ranks, i);
  return bytes;
}

Bytes make_input(DataType dtype, int rank, size_t count) {
  Bytes bytes(count * element_size(dtype));
  switch (dtype) {
    case DataType::F32: fill_typed<float>(bytes, rank); break;
    case DataType::F64: fill_typed<double>(bytes, rank); break;
    case DataType::I32: fill_typed<int32_t>(bytes, rank); break;
    case DataType::I64: fill_typed<int64_t>(bytes, rank); break;
  }
  return bytes;
}

Bytes make_reference(DataType dtype, ReduceOp op, int ranks, size_t count) {
  switch (dtype) {
    case DataType::F32: return reference_typed<float>(op, ranks, count);
    case DataType::F64: return reference_typed<double>(op, ranks, count);
    case DataType::I32: return reference_typed<int32_t>(op, ranks, count);
    case DataType::I64: return reference_typed<int64_t>(op, ranks, count);
  }
  return {};
}

// Index of the first differing element, or -1.
long long first_difference(const Bytes& a, const Bytes& b, size_t element_bytes) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); i += element_bytes)
    if (std::memcmp(&a[i], &b[i], element_bytes) != 0) return (long long)(i / element_bytes);
  return -1;
}

const char* dtype_label(DataType dtype) {
  switch (dtype) {
    case DataType::F32: return "F32";
    case DataType::F64: return "F64";
    case DataType::I32: return "I32";
    case DataType::I64: return "I64";
  }
  return "?";
}

const char* op_label(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Avg: return "Avg";
    case ReduceOp::Min: return "Min";
    case ReduceOp::Max: return "Max";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// All-reduce: every W x count x dtype x op

using AllReduceCase = std::tuple<int, size_t, DataType, ReduceOp>;

class AllReduceMatrix : public ::testing::TestWithParam<AllReduceCase> {};

TEST_P(AllReduceMatrix, MatchesReferenceBitIdenticallyOnEveryRank) {
  const auto [ranks, count, dtype, op] = GetParam();
  Tuning tuning;
  tuning.chunk_bytes = 16384;  // many segments for the large counts: exercises the pipeline
  Group group = join_all(ranks);
  std::vector<Bytes> buffers;
  for (int rank = 0; rank < ranks; ++rank) buffers.push_back(make_input(dtype, rank, count));
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    return one(co2::collectives::make_allreduce(
        transport, allreduce_descriptor(0, count, dtype, op), buffers[size_t(rank)].data(), tuning));
  });
  expect_all_ok(results);
  const Bytes expected = make_reference(dtype, op, ranks, count);
  for (int rank = 0; rank < ranks; ++rank) {
    EXPECT_EQ(first_difference(buffers[size_t(rank)], expected, element_size(dtype)), -1)
        << "rank " << rank << " differs from the reference";
    EXPECT_TRUE(buffers[size_t(rank)] == buffers[0]) << "rank " << rank << " differs from rank 0";
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, AllReduceMatrix,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(size_t(1), size_t(7), size_t(1000), size_t(1000003)),
                       ::testing::Values(DataType::F32, DataType::F64, DataType::I32, DataType::I64),
                       ::testing::Values(ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max)),
    [](const ::testing::TestParamInfo<AllReduceCase>& info) {
      return "W" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param)) + "_" + dtype_label(std::get<2>(info.param)) +
             "_" + op_label(std::get<3>(info.param));
    });

TEST(AllReduce, RandomFloatSumsAreBitIdenticalAcrossRanks) {
  // Random values: the rounding depends on the order of additions, so equal bytes on every rank
  // show that each element is reduced once, in one order, and then copied.
  for (int ranks : {3, 4}) {
    const size_t count = 100003;
    Group group = join_all(ranks);
    std::vector<std::vector<float>> buffers(static_cast<size_t>(ranks), std::vector<float>(count));
    std::vector<double> exact(count, 0.0);
    std::mt19937 random(42);
    std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
    for (auto& buffer : buffers)
      for (size_t i = 0; i < count; ++i) {
        buffer[i] = distribution(random) * std::pow(10.0f, float(i % 7) - 3.0f);
        exact[i] += buffer[i];
      }
    Tuning tuning;
    tuning.chunk_bytes = 4096;
    const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
      return one(co2::collectives::make_allreduce(
          transport, allreduce_descriptor(0, count, DataType::F32, ReduceOp::Sum),
          buffers[size_t(rank)].data(), tuning));
    });
    expect_all_ok(results);
    for (int rank = 1; rank < ranks; ++rank)
      EXPECT_EQ(std::memcmp(buffers[size_t(rank)].data(), buffers[0].data(), count * sizeof(float)), 0)
          << "W=" << ranks << " rank " << rank;
    for (size_t i = 0; i < count; ++i)
      ASSERT_NEAR(buffers[0][i], exact[i], 1e-5 * (1.0 + std::fabs(exact[i]) * 1e3)) << i;
  }
}

TEST(AllReduce, WorksWithOneElementPerMessageAndWithOneHugeChunk) {
  for (size_t chunk_bytes : {size_t(1), size_t(1) << 30}) {
    const int ranks = 3;
    const size_t count = 101;
    Tuning tuning;
    tuning.chunk_bytes = chunk_bytes;
    Group group = join_all(ranks);
    std::vector<Bytes> buffers;
    for (int rank = 0; rank < ranks; ++rank) buffers.push_back(make_input(DataType::I64, rank, count));
    const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
      return one(co2::collectives::make_allreduce(
          transport, allreduce_descriptor(0, count, DataType::I64, ReduceOp::Sum),
          buffers[size_t(rank)].data(), tuning));
    });
    expect_all_ok(results);
    const Bytes expected = make_reference(DataType::I64, ReduceOp::Sum, ranks, count);
    for (const Bytes& buffer : buffers) EXPECT_EQ(first_difference(buffer, expected, 8), -1);
  }
}

TEST(AllReduce, ZeroElementsCompletes) {
  Group group = join_all(3);
  const auto results = run_ranks(group, [&](PointToPoint& transport, int) {
    return one(co2::collectives::make_allreduce(
        transport, allreduce_descriptor(0, 0, DataType::F32, ReduceOp::Sum), nullptr, Tuning{}));
  });
  expect_all_ok(results);
}

TEST(AllReduce, IntegerSumsWrapAroundInsteadOfOverflowing) {
  const int ranks = 2;
  Group group = join_all(ranks);
  std::vector<std::vector<int32_t>> buffers = {{INT32_MAX, INT32_MIN}, {1, -1}};
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    return one(co2::collectives::make_allreduce(
        transport, allreduce_descriptor(0, 2, DataType::I32, ReduceOp::Sum),
        buffers[size_t(rank)].data(), Tuning{}));
  });
  expect_all_ok(results);
  EXPECT_EQ(buffers[0][0], INT32_MIN);
  EXPECT_EQ(buffers[0][1], INT32_MAX);
  EXPECT_EQ(buffers[1], buffers[0]);
}

// ---------------------------------------------------------------------------------------------
// Broadcast and all-gather

TEST(Broadcast, CopiesTheRootsBufferToEveryRank) {
  for (int ranks : {1, 2, 3, 4}) {
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(1000003)}) {
      for (DataType dtype : {DataType::F64, DataType::I32}) {
        for (int root = 0; root < ranks; ++root) {
          Tuning tuning;
          tuning.chunk_bytes = 8192;
          Group group = join_all(ranks);
          std::vector<Bytes> buffers;
          for (int rank = 0; rank < ranks; ++rank) buffers.push_back(make_input(dtype, rank, count));
          const Bytes expected = buffers[size_t(root)];
          const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
            return one(co2::collectives::make_broadcast(
                transport, broadcast_descriptor(0, count, dtype, root), buffers[size_t(rank)].data(),
                tuning));
          });
          expect_all_ok(results);
          for (int rank = 0; rank < ranks; ++rank)
            ASSERT_TRUE(buffers[size_t(rank)] == expected)
                << "W=" << ranks << " count=" << count << " root=" << root << " rank=" << rank;
        }
      }
    }
  }
}

TEST(AllGather, CollectsEveryRanksBlockInRankOrder) {
  for (int ranks : {1, 2, 3, 4}) {
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(100003)}) {
      for (bool in_place : {false, true}) {
        Tuning tuning;
        tuning.chunk_bytes = 4096;
        Group group = join_all(ranks);
        const DataType dtype = DataType::F32;
        const size_t block_bytes = count * element_size(dtype);
        std::vector<Bytes> sends, recvs(static_cast<size_t>(ranks), Bytes(block_bytes * size_t(ranks)));
        Bytes expected;
        for (int rank = 0; rank < ranks; ++rank) {
          sends.push_back(make_input(dtype, rank, count));
          expected.insert(expected.end(), sends.back().begin(), sends.back().end());
          if (in_place && count > 0)
            std::memcpy(recvs[size_t(rank)].data() + size_t(rank) * block_bytes, sends.back().data(),
                        block_bytes);
        }
        const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
          std::byte* recv = recvs[size_t(rank)].data();
          const void* send = in_place ? recv + size_t(rank) * block_bytes : sends[size_t(rank)].data();
          return one(co2::collectives::make_allgather(
              transport, allgather_descriptor(0, count, dtype), send, recv, tuning));
        });
        expect_all_ok(results);
        for (int rank = 0; rank < ranks; ++rank)
          ASSERT_TRUE(recvs[size_t(rank)] == expected)
              << "W=" << ranks << " count=" << count << " in_place=" << in_place << " rank=" << rank;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Several collectives at once

TEST(Collectives, ManyInFlightAdvancedInDifferentOrdersOnEachRank) {
  const int ranks = 4;
  const int kCollectives = 24;
  Group group = join_all(ranks);
  Tuning tuning;
  tuning.chunk_bytes = 1024;
  // Per rank, per collective: one buffer (all-gather: send + recv).
  std::vector<std::vector<Bytes>> buffers(static_cast<size_t>(ranks)), sends(static_cast<size_t>(ranks));
  auto count_of = [](int index) { return size_t(index * 997 % 5000 + 1); };
  for (int rank = 0; rank < ranks; ++rank)
    for (int index = 0; index < kCollectives; ++index) {
      const size_t count = count_of(index);
      sends[size_t(rank)].push_back(make_input(DataType::I64, rank, count));
      buffers[size_t(rank)].push_back(index % 3 == 2 ? Bytes(count * 8 * ranks)
                                                     : sends[size_t(rank)].back());
    }
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    std::vector<std::unique_ptr<Collective>> list;
    for (int index = 0; index < kCollectives; ++index) {
      const size_t count = count_of(index);
      void* buffer = buffers[size_t(rank)][size_t(index)].data();
      const uint64_t sequence = uint64_t(index);
      switch (index % 3) {
        case 0:
          list.push_back(co2::collectives::make_allreduce(
              transport, allreduce_descriptor(sequence, count, DataType::I64, ReduceOp::Max), buffer,
              tuning));
          break;
        case 1:
          list.push_back(co2::collectives::make_broadcast(
              transport, broadcast_descriptor(sequence, count, DataType::I64, index % ranks), buffer,
              tuning));
          break;
        case 2:
          list.push_back(co2::collectives::make_allgather(
              transport, allgather_descriptor(sequence, count, DataType::I64),
              sends[size_t(rank)][size_t(index)].data(), buffer, tuning));
          break;
      }
    }
    // Odd ranks drive them newest first, so the ranks post different collectives first.
    if (rank % 2 == 1) std::reverse(list.begin(), list.end());
    return list;
  });
  expect_all_ok(results);
  for (int index = 0; index < kCollectives; ++index) {
    const size_t count = count_of(index);
    Bytes expected;
    if (index % 3 == 0) expected = make_reference(DataType::I64, ReduceOp::Max, ranks, count);
    if (index % 3 == 1) expected = sends[size_t(index % ranks)][size_t(index)];
    if (index % 3 == 2)
      for (int rank = 0; rank < ranks; ++rank)
        expected.insert(expected.end(), sends[size_t(rank)][size_t(index)].begin(),
                        sends[size_t(rank)][size_t(index)].end());
    for (int rank = 0; rank < ranks; ++rank)
      EXPECT_TRUE(buffers[size_t(rank)][size_t(index)] == expected)
          << "collective " << index << " rank " << rank;
  }
}

// ---------------------------------------------------------------------------------------------
// Mismatches and transport failures

// Runs one collective per rank built by `make_for_rank` (on 16 int32 elements), expecting that
// none succeeds and that none hangs. Returns the results.
std::vector<RankResult> run_expecting_failure(
    int ranks, const std::function<std::unique_ptr<Collective>(PointToPoint&, int, void*)>& make_for_rank) {
  Group group = join_all(ranks);
  std::vector<std::vector<int32_t>> buffers(static_cast<size_t>(ranks), std::vector<int32_t>(16, 0));
  for (int rank = 0; rank < ranks; ++rank)
    for (size_t i = 0; i < 16; ++i) buffers[size_t(rank)][i] = int32_t(100 * rank + int(i));
  const auto originals = buffers;
  const auto start = Clock::now();
  auto results = run_ranks(
      group,
      [&](PointToPoint& transport, int rank) {
        return one(make_for_rank(transport, rank, buffers[size_t(rank)].data()));
      },
      milliseconds(20000));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "failure took too long to spread";
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_NE(results[rank].status, Status::Ok) << "rank " << rank;
    EXPECT_NE(results[rank].status, Status::Timeout) << "rank " << rank << " hung";
  }
  // A rank posts no data before it checked its predecessor's descriptor, so a rank that saw the
  // mismatch never had its buffer written. (Ranks further along may hold partial results.)
  for (size_t rank = 0; rank < results.size(); ++rank) {
    if (results[rank].status == Status::CollectiveMismatch) {
      EXPECT_EQ(buffers[rank], originals[rank]) << "rank " << rank << "'s buffer was written";
    }
  }
  return results;
}

// Only the ranks next to the difference compare the two descriptors; the first to do so aborts
// the group with the mismatch as the reason. Checks that every rank fails with
// CollectiveMismatch and that every message contains `needles`.
void expect_mismatch_detected(const std::vector<RankResult>& results,
                              const std::vector<std::string>& needles) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const RankResult& result = results[rank];
    // Every rank reports the mismatch, not only the ranks next to it (they learn of it through
    // the abort, whose reason names both descriptors).
    EXPECT_EQ(result.status, Status::CollectiveMismatch) << "rank " << rank << ": " << result.message;
    for (const std::string& needle : needles)
      EXPECT_NE(result.message.find(needle), std::string::npos)
          << "rank " << rank << ": " << result.message;
  }
}

TEST(CollectiveMismatch, DifferentCountIsDetectedAndNamesBothDescriptors) {
  const auto results = run_expecting_failure(3, [](PointToPoint& transport, int rank, void* buffer) {
    const size_t count = rank == 1 ? 8 : 7;
    return co2::collectives::make_allreduce(
        transport, allreduce_descriptor(0, count, DataType::I32, ReduceOp::Sum), buffer, Tuning{});
  });
  // Rank 0 and its predecessor agree, yet it reports the mismatch too.
  expect_mismatch_detected(results, {"count 7", "count 8", "rank 1"});
}

TEST(CollectiveMismatch, DifferentKindIsDetected) {
  const auto results = run_expecting_failure(2, [](PointToPoint& transport, int rank, void* buffer) {
    if (rank == 0)
      return co2::collectives::make_broadcast(transport, broadcast_descriptor(0, 16, DataType::I32, 0),
                                              buffer, Tuning{});
    return co2::collectives::make_allreduce(
        transport, allreduce_descriptor(0, 16, DataType::I32, ReduceOp::Sum), buffer, Tuning{});
  });
  expect_mismatch_detected(results, {"broadcast", "allreduce"});
}

TEST(CollectiveMismatch, DifferentOpDtypeOrRootIsDetected) {
  using Make = std::function<std::unique_ptr<Collective>(PointToPoint&, int, void*)>;
  const std::vector<Make> variants = {
      [](PointToPoint& transport, int rank, void* buffer) {
        return co2::collectives::make_allreduce(
            transport,
            allreduce_descriptor(0, 16, DataType::I32, rank == 3 ? ReduceOp::Max : ReduceOp::Sum),
            buffer, Tuning{});
      },
      [](PointToPoint& transport, int rank, void* buffer) {
        // f32 and i32 have the same size: only the descriptor tells them apart.
        return co2::collectives::make_allreduce(
            transport,
            allreduce_descriptor(0, 16, rank == 3 ? DataType::F32 : DataType::I32, ReduceOp::Sum),
            buffer, Tuning{});
      },
      [](PointToPoint& transport, int rank, void* buffer) {
        return co2::collectives::make_broadcast(
            transport, broadcast_descriptor(0, 16, DataType::I32, rank == 3 ? 1 : 0), buffer, Tuning{});
      },
  };
  for (const Make& make : variants) {
    const auto results = run_expecting_failure(4, make);
    expect_mismatch_detected(results, {"rank 3"});  // rank 3 or its successor, rank 0, sees it
  }
}

TEST(CollectiveMismatch, TransportSizeMismatchMapsToCollectiveMismatch) {
  Group group = join_all(2);
  std::vector<int32_t> buffer(4, 1);
  auto collective = co2::collectives::make_allreduce(
      *group[1], allreduce_descriptor(0, 4, DataType::I32, ReduceOp::Sum), buffer.data(), Tuning{});
  // A stranger on the descriptor tag with a message of the wrong length.
  char junk[3] = {1, 2, 3};
  group[0]->post_send(1, co2::collectives::descriptor_tag(0), junk, sizeof junk);
  for (int i = 0; i < 1000 && !collective->failed(); ++i) {
    collective->advance();
    group[1]->wait_for_activity(std::chrono::microseconds(1000));
  }
  ASSERT_TRUE(collective->failed());
  EXPECT_EQ(collective->status(), Status::CollectiveMismatch) << collective->message();
  group[1]->abort("done");
  EXPECT_TRUE(collective->release_transfers());
}

TEST(CollectiveMismatch, MalformedDescriptorIsReported) {
  Group group = join_all(2);
  std::vector<int32_t> buffer(4, 1);
  auto collective = co2::collectives::make_allreduce(
      *group[1], allreduce_descriptor(0, 4, DataType::I32, ReduceOp::Sum), buffer.data(), Tuning{});
  std::vector<char> zeros(co2::collectives::kDescriptorBytes, 0);
  group[0]->post_send(1, co2::collectives::descriptor_tag(0), zeros.data(), zeros.size());
  for (int i = 0; i < 1000 && !collective->failed(); ++i) {
    collective->advance();
    group[1]->wait_for_activity(std::chrono::microseconds(1000));
  }
  ASSERT_TRUE(collective->failed());
  EXPECT_EQ(collective->status(), Status::CollectiveMismatch);
  EXPECT_NE(collective->message().find("malformed"), std::string::npos) << collective->message();
  group[1]->abort("done");
  EXPECT_TRUE(collective->release_transfers());
}

TEST(CollectiveFailure, LostPeerMapsToPeerLost) {
  Group group = join_all(2);
  std::vector<int32_t> buffer(4, 1);
  auto collective = co2::collectives::make_allreduce(
      *group[0], allreduce_descriptor(0, 4, DataType::I32, ReduceOp::Sum), buffer.data(), Tuning{});
  collective->advance();
  group[1].reset();
  for (int i = 0; i < 1000 && !collective->failed(); ++i) {
    collective->advance();
    group[0]->wait_for_activity(std::chrono::microseconds(1000));
  }
  ASSERT_TRUE(collective->failed());
  EXPECT_EQ(collective->status(), Status::PeerLost) << collective->message();
}

TEST(CollectiveFailure, AbortedTransportMapsToAborted) {
  Group group = join_all(2);
  std::vector<int32_t> buffer(4, 1);
  auto collective = co2::collectives::make_allreduce(
      *group[0], allreduce_descriptor(0, 4, DataType::I32, ReduceOp::Sum), buffer.data(), Tuning{});
  collective->advance();
  group[1]->abort("stop everything");
  collective->advance();
  ASSERT_TRUE(collective->failed());
  EXPECT_EQ(collective->status(), Status::Aborted);
  EXPECT_NE(collective->message().find("stop everything"), std::string::npos) << collective->message();
  EXPECT_TRUE(collective->release_transfers());
}

TEST(CollectiveFailure, OutcomesMapToStatuses) {
  EXPECT_EQ(co2::collectives::status_of(Outcome::Done), Status::Ok);
  EXPECT_EQ(co2::collectives::status_of(Outcome::PeerLost), Status::PeerLost);
  EXPECT_EQ(co2::collectives::status_of(Outcome::SizeMismatch), Status::CollectiveMismatch);
  EXPECT_EQ(co2::collectives::status_of(Outcome::Aborted), Status::Aborted);
  EXPECT_EQ(co2::collectives::status_of(Outcome::Failed), Status::Transport);
}

TEST(CollectiveFailure, BroadcastRootOutOfRangeIsRejected) {
  Group group = join_all(1);
  int32_t value = 0;
  try {
    co2::collectives::make_broadcast(*group[0], broadcast_descriptor(0, 1, DataType::I32, 1), &value,
                                     Tuning{});
    FAIL() << "expected an error";
  } catch (const co2::Error& error) {
    EXPECT_EQ(error.status(), Status::InvalidArgument);
  }
}

// ---------------------------------------------------------------------------------------------
// Tags and descriptors

TEST(CollectiveTags, AreDistinctPerSequenceStepAndChunk) {
  std::set<uint64_t> tags;
  size_t made = 0;
  for (uint64_t sequence : {0ull, 1ull, 2ull, 12345ull})
    for (uint32_t step : {0u, 1u, 5u, 4093u})
      for (uint64_t chunk : {0ull, 1ull, 2ull, 1000ull, 4000000ull}) {
        for (bool control_lane : {false, true}) {
          tags.insert(co2::collectives::data_tag(sequence, step, chunk, control_lane));
          ++made;
        }
      }
  for (uint64_t sequence : {0ull, 1ull, 2ull, 12345ull}) {
    tags.insert(co2::collectives::descriptor_tag(sequence));
    ++made;
  }
  EXPECT_EQ(tags.size(), made);
}

TEST(CollectiveDescriptor, ComparesAndDescribesEveryField) {
  const Descriptor base = allreduce_descriptor(7, 1000, DataType::F32, ReduceOp::Sum);
  EXPECT_EQ(base.to_string(), "#7 user #0 of owner 0: allreduce(sum, f32, count 1000)");
  EXPECT_EQ(broadcast_descriptor(2, 5, DataType::I64, 3).to_string(),
            "#2 user #0 of owner 0: broadcast(i64, count 5, root 3)");
  EXPECT_EQ(allgather_descriptor(3, 9, DataType::F64).to_string(),
            "#3 user #0 of owner 0: allgather(f64, count 9)");
  Descriptor other = base;
  EXPECT_EQ(other, base);
  other.sequence = 8;
  EXPECT_NE(other, base);
  other = base;
  other.count = 1001;
  EXPECT_NE(other, base);
  other = base;
  other.op = ReduceOp::Avg;
  EXPECT_NE(other, base);
  other = base;
  other.dtype = DataType::I32;
  EXPECT_NE(other, base);
  other = base;
  other.kind = Kind::Broadcast;
  EXPECT_NE(other, base);
  other = base;
  other.root = 1;
  EXPECT_NE(other, base);
  other = base;
  other.owner = 1;
  EXPECT_NE(other, base);
  other = base;
  other.purpose = co2::Purpose::Consensus;
  EXPECT_NE(other, base);
  other = base;
  other.purpose_sequence = 3;
  EXPECT_NE(other, base);
  // The identity survives the wire.
  other = base;
  other.owner = 5;
  other.purpose = co2::Purpose::AnchorCheck;
  other.purpose_sequence = 0x123456789;
  const auto decoded = co2::collectives::decode(co2::collectives::encode(other));
  ASSERT_TRUE(decoded.has_value());
  EXPECT_EQ(*decoded, other);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Issue 12, item 4: a transport that cannot withdraw a matched receive (UCX over shared memory)
// may write into it after the abort. The collective must then have received into memory of
// its own, so that such a late write never reaches the caller's buffer, which the caller may
// free once its request completed.

namespace {

// Wraps a local transport and behaves like such a transport: after abort() its receives are
// never released, and land_late() writes into every receive that was posted, as UCX could.
class LateLandingTransport final : public PointToPoint {
 public:
  explicit LateLandingTransport(std::unique_ptr<PointToPoint> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  co2::transport::Handle post_send(int peer, uint64_t tag, const void* data, size_t length) override {
    return inner_->post_send(peer, tag, data, length);
  }
  co2::transport::Handle post_recv(int peer, uint64_t tag, void* data, size_t length) override {
    const auto handle = inner_->post_recv(peer, tag, data, length);
    if (tag != co2::collectives::descriptor_tag(0)) receives_.push_back({static_cast<std::byte*>(data), length});
    return handle;
  }
  Outcome test(co2::transport::Handle handle) override {
    if (aborted_) return Outcome::Pending;  // never released, as over shared memory
    return inner_->test(handle);
  }
  void progress() override { inner_->progress(); }
  void wait_for_activity(std::chrono::microseconds max_wait) override { inner_->wait_for_activity(max_wait); }
  void abort(const std::string& reason) override {
    aborted_ = true;
    inner_->abort(reason);
  }
  std::string error_message() const override { return inner_->error_message(); }
  bool receives_may_land_late() const override { return true; }

  void land_late() {
    for (const auto& [data, length] : receives_) std::memset(data, 0xEE, length);
  }
  size_t receives() const { return receives_.size(); }

 private:
  std::unique_ptr<PointToPoint> inner_;
  bool aborted_ = false;
  std::vector<std::pair<std::byte*, size_t>> receives_;
};

}  // namespace

TEST(CollectiveFailure, AReceiveThatLandsAfterTheAbortNeverWritesTheCallersBuffer) {
  Group group = join_all(2);
  LateLandingTransport late(std::move(group[1]));
  std::vector<int32_t> buffer(1000, 7);
  auto collective = co2::collectives::make_broadcast(
      late, broadcast_descriptor(0, buffer.size(), DataType::I32, 0), buffer.data(), Tuning{});
  // Rank 0 takes part in the descriptor exchange only: rank 1's data receive stays posted.
  const auto theirs = co2::collectives::encode(collective->descriptor());
  co2::collectives::DescriptorWire mine{};
  const auto tag = co2::collectives::descriptor_tag(0);
  group[0]->post_recv(1, tag, mine.data(), mine.size());
  group[0]->post_send(1, tag, theirs.data(), theirs.size());
  const auto deadline = Clock::now() + milliseconds(10000);
  while (late.receives() == 0 && Clock::now() < deadline) {
    collective->advance();
    late.wait_for_activity(std::chrono::microseconds(1000));
  }
  ASSERT_EQ(late.receives(), 1u) << "the data receive was never posted";
  late.abort("test");
  collective->advance();
  EXPECT_FALSE(collective->release_transfers());  // the transport keeps the receive
  // The communicator now completes the request (after its release limit); the caller frees or
  // reuses its buffer. The transport's late write must not reach it.
  late.land_late();
  EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](int32_t v) { return v == 7; }));
}

TEST(Collectives, StagedReceivesGiveTheSameResults) {
  // Over a transport whose receives may land late every receive is staged and copied: the
  // results are the same as in place.
  Group group = join_all(3);
  std::vector<std::unique_ptr<LateLandingTransport>> late;
  for (auto& transport : group) late.push_back(std::make_unique<LateLandingTransport>(std::move(transport)));
  std::vector<std::vector<float>> buffers(3);
  std::vector<std::unique_ptr<Collective>> collectives;
  Tuning tuning;
  tuning.chunk_bytes = 64;  // many chunks and steps
  for (int rank = 0; rank < 3; ++rank) {
    buffers[size_t(rank)].assign(1001, float(rank + 1));
    collectives.push_back(co2::collectives::make_allreduce(
        *late[size_t(rank)], allreduce_descriptor(0, 1001, DataType::F32, ReduceOp::Sum),
        buffers[size_t(rank)].data(), tuning));
  }
  const auto deadline = Clock::now() + milliseconds(20000);
  bool all_finished = false;
  while (!all_finished && Clock::now() < deadline) {
    all_finished = true;
    for (auto& collective : collectives) {
      collective->advance();
      ASSERT_FALSE(collective->failed()) << collective->message();
      all_finished = all_finished && collective->finished();
    }
  }
  ASSERT_TRUE(all_finished);
  for (auto& buffer : buffers)
    for (float value : buffer) ASSERT_EQ(value, 6.0f);
}

// ---------------------------------------------------------------------------------------------
// Compressed all-reduce (wire formats) against a float64 reference: quantize -> reduce ->
// dequantize, with and without error feedback.

using co2::WireFormat;

// What one element of a format may lose per encoding, relative to the largest magnitude in
// its group (int8) or to itself (bf16).
double format_tolerance(WireFormat format) {
  // Twice the largest rounding relative to the group's largest value: bf16 half an ulp; int8
  // half a step of max/127; fp4 half the gap between its two largest codes, 4 and 6 (of max/6).
  switch (format) {
    case WireFormat::BF16: return std::ldexp(1.0, -8);
    case WireFormat::Int8: return 1.0 / 127.0;
    case WireFormat::Fp4: return 2.0 / 6.0;
    default: return 0.0;
  }
}

// Inputs of rank r: values spanning several magnitudes, so that groups differ in scale.
std::vector<std::vector<float>> compressed_inputs(int ranks, size_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> distribution(-1.0f, 1.0f);
  std::vector<std::vector<float>> inputs(size_t(ranks), std::vector<float>(count, 0.0f));
  for (auto& input : inputs)
    for (size_t i = 0; i < count; ++i)
      input[i] = distribution(random) * std::pow(10.0f, float((i / 300) % 4) - 2.0f);
  return inputs;
}

// One compressed average of `buffers` in place; residuals (may be empty) receive the drops.
void compressed_average(std::vector<std::vector<float>>& buffers,
                        std::vector<std::vector<float>>* residuals, WireFormat format,
                        const Tuning& tuning) {
  const int ranks = int(buffers.size());
  const size_t count = buffers[0].size();
  Group group = join_all(ranks);
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    Descriptor descriptor = allreduce_descriptor(0, count, DataType::F32, ReduceOp::Avg);
    descriptor.wire = format;
    return one(co2::collectives::make_allreduce(
        transport, descriptor, buffers[size_t(rank)].data(), tuning,
        residuals ? (*residuals)[size_t(rank)].data() : nullptr));
  });
  expect_all_ok(results);
}

using CompressedCase = std::tuple<int, size_t, WireFormat>;
class CompressedAllReduce : public ::testing::TestWithParam<CompressedCase> {};

TEST_P(CompressedAllReduce, BitIdenticalAndWithinTheFormatsErrorOfTheFloat64Average) {
  const auto [ranks, count, format] = GetParam();
  Tuning tuning;
  tuning.chunk_bytes = 1000;  // segments whose blocks do not align with int8 groups
  const auto inputs = compressed_inputs(ranks, count, 7);
  auto buffers = inputs;
  std::vector<std::vector<float>> residuals(size_t(ranks), std::vector<float>(count, 1e30f));
  compressed_average(buffers, &residuals, format, tuning);
  for (int rank = 1; rank < ranks; ++rank)
    ASSERT_EQ(std::memcmp(buffers[size_t(rank)].data(), buffers[0].data(), count * sizeof(float)), 0)
        << "rank " << rank << " differs from rank 0";
  // Each element is encoded W times on its way (W-1 partial sums and the average), each time
  // losing at most the format's tolerance of its group's largest partial sum.
  double largest = 0.0;
  for (const auto& input : inputs)
    for (float v : input) largest = std::max(largest, double(std::fabs(v)));
  for (size_t i = 0; i < count; ++i) {
    double sum = 0.0, residual_sum = 0.0;
    for (int rank = 0; rank < ranks; ++rank) {
      sum += inputs[size_t(rank)][i];
      residual_sum += residuals[size_t(rank)][i];
    }
    const double result = buffers[0][i];
    ASSERT_LE(std::fabs(result - sum / ranks), format_tolerance(format) * largest * ranks)
        << "element " << i;
    // What the encodings dropped accounts for the whole difference: the error-feedback invariant.
    ASSERT_NEAR(sum - residual_sum, ranks * result, 1e-5 * largest * ranks) << "element " << i;
  }
  if (ranks == 1) {  // alone: nothing travels, so nothing is quantized or dropped
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(buffers[0][i], inputs[0][i]) << "element " << i;
      ASSERT_EQ(residuals[0][i], 0.0f) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    FormatsRanksSizes, CompressedAllReduce,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(size_t(1), size_t(7), size_t(1000), size_t(20011)),
                       ::testing::Values(WireFormat::BF16, WireFormat::Int8, WireFormat::Fp4)),
    [](const ::testing::TestParamInfo<CompressedCase>& info) {
      return "W" + std::to_string(std::get<0>(info.param)) + "_n" +
             std::to_string(std::get<1>(info.param)) + "_" +
             co2::wire_format_name(std::get<2>(info.param));
    });

TEST(CompressedAllReduce, ErrorFeedbackKeepsTheAccumulatedAverageOnTheFloat64Reference) {
  // Rounds of the same inputs, as an engine's deltas: with error feedback (the residual added to
  // the next round's input) the sum of the averages stays within one round's error of
  // rounds x the exact average; without it the same rounding repeats and grows with the rounds.
  const int rounds = 30;
  const size_t count = 3001;
  Tuning tuning;
  tuning.chunk_bytes = 2048;
  for (WireFormat format : {WireFormat::BF16, WireFormat::Int8, WireFormat::Fp4})
    for (int ranks : {2, 3, 4}) {  // one rank drops nothing (CompressedAllReduce W1_*)
      const auto inputs = compressed_inputs(ranks, count, 11);
      std::vector<double> exact(count, 0.0);
      double largest = 0.0;
      for (const auto& input : inputs)
        for (size_t i = 0; i < count; ++i) {
          exact[i] += double(input[i]) / ranks;
          largest = std::max(largest, double(std::fabs(input[i])));
        }
      double drift[2] = {0.0, 0.0};  // summed |accumulated - rounds * exact|: without, with EF
      for (int feedback = 0; feedback < 2; ++feedback) {
        std::vector<std::vector<float>> residuals(size_t(ranks), std::vector<float>(count, 0.0f));
        std::vector<double> accumulated(count, 0.0);
        for (int round = 0; round < rounds; ++round) {
          auto buffers = inputs;
          if (feedback)
            for (int rank = 0; rank < ranks; ++rank)
              for (size_t i = 0; i < count; ++i) buffers[size_t(rank)][i] += residuals[size_t(rank)][i];
          compressed_average(buffers, feedback ? &residuals : nullptr, format, tuning);
          for (size_t i = 0; i < count; ++i) accumulated[i] += buffers[0][i];
        }
        for (size_t i = 0; i < count; ++i) {
          const double error = std::fabs(accumulated[i] - rounds * exact[i]);
          drift[feedback] += error;
          // With feedback: bounded by (about) one round's error, whatever the number of rounds.
          if (feedback) {
            ASSERT_LE(error, 2.0 * format_tolerance(format) * largest * ranks)
                << wire_format_name(format) << " W=" << ranks << " element " << i;
          }
        }
      }
      EXPECT_LT(drift[1] * 5.0, drift[0]) << co2::wire_format_name(format) << " W=" << ranks;
    }
}

TEST(CompressedAllReduce, CodecRoundTripsAndBoundaries) {
  // bf16 rounds to nearest even; int8 keeps zero groups zero and makes non-finite groups NaN.
  const std::vector<float> values = {1.0f, 1.00390625f, 1.01171875f, -3.5f, 0.0f, 1e-30f};
  std::vector<std::byte> bytes(co2::wire_bytes(WireFormat::BF16, values.size()));
  co2::wire_encode(WireFormat::BF16, values.data(), values.size(), bytes.data());
  std::vector<float> decoded(values.size());
  co2::wire_decode(WireFormat::BF16, bytes.data(), values.size(), decoded.data(), false);
  EXPECT_EQ(decoded[0], 1.0f);
  EXPECT_EQ(decoded[1], 1.0f);          // tie -> even
  EXPECT_EQ(decoded[2], 1.015625f);     // tie -> even (upwards)
  EXPECT_EQ(decoded[3], -3.5f);
  EXPECT_EQ(decoded[4], 0.0f);
  EXPECT_NEAR(decoded[5], 1e-30f, 1e-32f);

  std::vector<float> group(300, 0.0f);
  group[200] = 2.0f;
  group[280] = std::numeric_limits<float>::infinity();
  std::vector<std::byte> int8(co2::wire_bytes(WireFormat::Int8, group.size()));
  EXPECT_EQ(int8.size(), 300u + 3u * 4u);
  co2::wire_encode(WireFormat::Int8, group.data(), group.size(), int8.data());
  std::vector<float> out(group.size(), -1.0f);
  co2::wire_decode(WireFormat::Int8, int8.data(), group.size(), out.data(), false);
  for (size_t i = 0; i < 128; ++i) ASSERT_EQ(out[i], 0.0f) << i;  // an all-zero group
  EXPECT_EQ(out[200], 2.0f);                                      // the largest is exact
  EXPECT_TRUE(std::isnan(out[260]));  // the non-finite group
  // A group too small for a finite inverse scale travels as zeros (not NaN).
  std::vector<float> tiny(5, 1e-40f);
  co2::wire_encode(WireFormat::Int8, tiny.data(), tiny.size(), int8.data());
  co2::wire_decode(WireFormat::Int8, int8.data(), tiny.size(), out.data(), false);
  for (size_t i = 0; i < tiny.size(); ++i) EXPECT_EQ(out[i], 0.0f) << i;
  EXPECT_THROW(co2::wire_format_of(4), co2::Error);

  // The fused outputs of wire_encode are exactly what decoding the message gives.
  std::vector<float> mixed = compressed_inputs(1, 1000, 3)[0];
  mixed[5] = std::numeric_limits<float>::quiet_NaN();
  for (WireFormat format : {WireFormat::F32, WireFormat::BF16, WireFormat::Int8, WireFormat::Fp4}) {
    std::vector<std::byte> message(co2::wire_bytes(format, mixed.size()));
    std::vector<float> dropped(mixed.size()), fused(mixed.size()), plain(mixed.size());
    co2::wire_encode(format, mixed.data(), mixed.size(), message.data(), dropped.data(), 3.0f, fused.data());
    co2::wire_decode(format, message.data(), mixed.size(), plain.data(), false);
    EXPECT_EQ(std::memcmp(fused.data(), plain.data(), plain.size() * sizeof(float)), 0)
        << co2::wire_format_name(format);
    for (size_t i = 0; i < mixed.size(); ++i) {
      if (std::isnan(mixed[i])) continue;
      if (format == WireFormat::Int8 && i / co2::kInt8Group == 0) continue;  // the NaN group
      if (format == WireFormat::Fp4 && i / co2::kFp4Group == 0) continue;
      ASSERT_EQ(dropped[i], (mixed[i] - plain[i]) * 3.0f) << co2::wire_format_name(format) << " " << i;
    }
  }
}

// FP4 E2M1 of x / s against a float64 reference: the nearest of the format's magnitudes, ties to
// the even code (0, 1, 2, 4: the codes 0, 2, 4, 6), the sign in bit 3.
double fp4_reference(double x) {
  static const double magnitudes[] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  const double m = std::fabs(x);
  int best = 0;
  for (int code = 1; code < 8; ++code) {
    const double gap = std::fabs(m - magnitudes[code]), best_gap = std::fabs(m - magnitudes[best]);
    if (gap < best_gap || (gap == best_gap && code % 2 == 0)) best = code;
  }
  return x < 0 ? -magnitudes[best] : magnitudes[best];
}

TEST(CompressedAllReduce, Fp4CodesAreTheNearestE2M1ValuesTiesToEven) {
  // Every magnitude, every midpoint (the ties), and values around them, in one group per sign
  // whose largest is 6 (scale 1: the codes are the values themselves).
  std::vector<std::byte> message;
  std::vector<float> out;
  for (double sign : {1.0, -1.0}) {
    std::vector<float> values = {float(sign * 6.0)};
    for (double m : {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0})
      for (double nudge : {-1e-3, 0.0, 1e-3})
        if (m + nudge >= 0.0 && m + nudge <= 6.0) values.push_back(float(sign * (m + nudge)));
    ASSERT_LE(values.size(), co2::kFp4Group);
    message.assign(co2::wire_bytes(WireFormat::Fp4, values.size()), std::byte{0});
    EXPECT_EQ(message.size(), (values.size() + 1) / 2 + 4u);
    co2::wire_encode(WireFormat::Fp4, values.data(), values.size(), message.data());
    out.assign(values.size(), -1.0f);
    co2::wire_decode(WireFormat::Fp4, message.data(), values.size(), out.data(), false);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(double(out[i]), fp4_reference(values[i])) << "value " << values[i];
    EXPECT_EQ(out[0], values[0]);  // the group's largest is exact
  }

  // Groups of 64 that start at every segment, an odd one included: values 0-2 are one segment
  // (of small values), 3-302 another; [0,3) [3,67) ... [259,303): six groups, and the odd start
  // shares a byte with the group before it but not a nibble.
  std::vector<float> mixed(303, 1.0f);
  for (size_t i = 0; i < 3; ++i) mixed[i] = 1e-3f * float(i + 1);
  for (size_t i = 3; i < mixed.size(); ++i) mixed[i] = float(i % 13) - 6.0f;
  const size_t starts[] = {0, 3};
  const co2::SegmentStarts segments{starts, 2, 0};
  EXPECT_EQ(co2::wire_bytes(WireFormat::Fp4, mixed.size(), segments), 152u + 6u * 4u);
  EXPECT_EQ(co2::wire_bytes(WireFormat::Fp4, mixed.size()), 152u + 5u * 4u);
  EXPECT_LE(co2::wire_bytes(WireFormat::Fp4, mixed.size(), segments),
            co2::wire_bytes_bound(WireFormat::Fp4, mixed.size(), segments));
  message.assign(co2::wire_bytes(WireFormat::Fp4, mixed.size(), segments), std::byte{0xff});
  co2::wire_encode(WireFormat::Fp4, mixed.data(), mixed.size(), message.data(), nullptr, 1.0f, nullptr, segments);
  out.assign(mixed.size(), -1.0f);
  co2::wire_decode(WireFormat::Fp4, message.data(), mixed.size(), out.data(), false, segments);
  for (size_t i = 0; i < 3; ++i)  // their own scale 3e-3 / 6: 1e-3 and 2e-3 are 2 and 4 of it
    EXPECT_FLOAT_EQ(out[i], mixed[i]) << i;
  for (size_t i = 3; i < mixed.size(); ++i) {
    // A group's scale is its largest |x| / 6, so the values -6..6 of the pattern decode as the
    // codes' nearest magnitudes of x * 6 / max.
    size_t begin = 3 + (i - 3) / co2::kFp4Group * co2::kFp4Group;
    size_t end = std::min(mixed.size(), begin + co2::kFp4Group);
    double largest = 0.0;
    for (size_t j = begin; j < end; ++j) largest = std::max(largest, double(std::fabs(mixed[j])));
    const double scale = double(float(largest) / 6.0f);
    ASSERT_NEAR(out[i], fp4_reference(mixed[i] / scale) * scale, 1e-6) << "element " << i;
  }
}

TEST(CompressedAllReduce, Int8GroupsStartAtEverySegment) {
  // Issue 23, item 7: 4 values of 1e-3 (one segment) before 300 of 1 (another). In one group
  // with the large ones their scale is 1/127 and they decode to 0; cut at the segment they get
  // a scale of their own.
  std::vector<float> values(304, 1.0f);
  for (size_t i = 0; i < 4; ++i) values[i] = 1e-3f * float(i + 1);
  const size_t starts[] = {0, 4};
  const co2::SegmentStarts segments{starts, 2, 0};
  // Groups [0,4) [4,132) [132,260) [260,304): four scales; without the cut, three.
  EXPECT_EQ(co2::wire_bytes(WireFormat::Int8, values.size(), segments), 304u + 4u * 4u);
  EXPECT_EQ(co2::wire_bytes(WireFormat::Int8, values.size()), 304u + 3u * 4u);
  EXPECT_LE(co2::wire_bytes(WireFormat::Int8, values.size(), segments),
            co2::wire_bytes_bound(WireFormat::Int8, values.size(), segments));
  std::vector<std::byte> message(co2::wire_bytes(WireFormat::Int8, values.size(), segments));
  co2::wire_encode(WireFormat::Int8, values.data(), values.size(), message.data(), nullptr, 1.0f, nullptr,
                   segments);
  std::vector<float> out(values.size());
  co2::wire_decode(WireFormat::Int8, message.data(), values.size(), out.data(), false, segments);
  // Half a step of the small group's own scale (4e-3 / 127); sharing the large group's, the
  // small values would decode to 0.
  const float half_step = 4e-3f / 254.0f * 1.01f;
  for (size_t i = 0; i < values.size(); ++i) ASSERT_NEAR(out[i], values[i], half_step) << "element " << i;
  // The same cut seen from a range that starts inside the first segment (offset 2), and from a
  // collective over a sub-range of the state (origin 2): one group of 2 small values first.
  const co2::SegmentStarts shifted{starts, 2, 2};
  for (const auto& [view, offset] : {std::pair{segments, size_t(2)}, std::pair{shifted, size_t(0)}}) {
    std::vector<std::byte> part(co2::wire_bytes(WireFormat::Int8, 302, view, offset));
    EXPECT_EQ(part.size(), 302u + 4u * 4u);
    co2::wire_encode(WireFormat::Int8, values.data() + 2, 302, part.data(), nullptr, 1.0f, nullptr, view, offset);
    co2::wire_decode(WireFormat::Int8, part.data(), 302, out.data(), false, view, offset);
    EXPECT_NEAR(out[0], values[2], half_step);
    EXPECT_NEAR(out[1], values[3], half_step);
  }
  // Through the ring: both ranks hold the same segments; the small values are averaged up to
  // their own groups' roundings (partial sums up to 12e-3, the average up to 8e-3), far below
  // the 2e-3 that a shared group (scale 2/127) would lose.
  Tuning tuning;
  tuning.chunk_bytes = 1000;
  std::vector<std::vector<float>> buffers(2, values);
  for (float& v : buffers[1]) v *= 3.0f;
  Group group = join_all(2);
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    Descriptor descriptor = allreduce_descriptor(0, values.size(), DataType::F32, ReduceOp::Avg);
    descriptor.wire = WireFormat::Int8;
    return one(co2::collectives::make_allreduce(transport, descriptor, buffers[size_t(rank)].data(), tuning,
                                                nullptr, segments));
  });
  expect_all_ok(results);
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(buffers[0][i], 2.0f * values[i], 1e-4f) << i;
  EXPECT_EQ(std::memcmp(buffers[0].data(), buffers[1].data(), values.size() * sizeof(float)), 0);
  EXPECT_EQ(co2::collectives::allreduce_wire_bytes(0, 2, values.size(), WireFormat::Int8, tuning, segments),
            co2::collectives::allreduce_wire_bytes(0, 2, values.size(), WireFormat::Int8, tuning) + 4u);
}

TEST(CompressedAllReduce, RejectsWhatItCannotCompressAndMismatchedFormats) {
  Group group = join_all(2);
  std::vector<float> buffer(10);
  Descriptor descriptor = allreduce_descriptor(0, 10, DataType::F64, ReduceOp::Avg);
  descriptor.wire = WireFormat::BF16;
  EXPECT_THROW(co2::collectives::make_allreduce(*group[0], descriptor, buffer.data(), Tuning{}),
               co2::Error);
  descriptor = allreduce_descriptor(0, 10, DataType::F32, ReduceOp::Max);
  descriptor.wire = WireFormat::Int8;
  EXPECT_THROW(co2::collectives::make_allreduce(*group[0], descriptor, buffer.data(), Tuning{}),
               co2::Error);
  // Ranks that chose different formats get CollectiveMismatch, not garbage.
  std::vector<std::vector<float>> buffers(2, std::vector<float>(100, 1.0f));
  const auto results = run_ranks(group, [&](PointToPoint& transport, int rank) {
    Descriptor d = allreduce_descriptor(0, 100, DataType::F32, ReduceOp::Avg);
    d.wire = rank == 0 ? WireFormat::BF16 : WireFormat::Int8;
    return one(co2::collectives::make_allreduce(transport, d, buffers[size_t(rank)].data(), Tuning{}));
  });
  for (const auto& result : results) EXPECT_EQ(result.status, Status::CollectiveMismatch);
  EXPECT_NE(results[0].message.find("wire"), std::string::npos) << results[0].message;
}

TEST(CompressedAllReduce, WireBytesCountWhatIsSent) {
  Tuning tuning;
  tuning.chunk_bytes = 4096;
  // fp32 ring: 2 (W-1)/W of the payload; bf16 half of it; int8 a quarter plus the scales.
  const uint64_t f32 = co2::collectives::allreduce_wire_bytes(0, 4, 100000, WireFormat::F32, tuning);
  EXPECT_EQ(f32, 2u * 3u * 25000u * 4u);
  EXPECT_EQ(co2::collectives::allreduce_wire_bytes(0, 4, 100000, WireFormat::BF16, tuning), f32 / 2);
  const uint64_t int8 = co2::collectives::allreduce_wire_bytes(0, 4, 100000, WireFormat::Int8, tuning);
  EXPECT_GT(int8, f32 / 4);
  EXPECT_LT(int8, f32 / 4 * 1.05);
  // fp4: an eighth plus a scale per 64 values (4.5 bits: 7.1x fewer bytes than fp32).
  const uint64_t fp4 = co2::collectives::allreduce_wire_bytes(0, 4, 100000, WireFormat::Fp4, tuning);
  EXPECT_GT(fp4, f32 / 8 * 1.12);
  EXPECT_LT(fp4, f32 / 8 * 1.14);
  EXPECT_EQ(co2::collectives::allreduce_wire_bytes(0, 1, 100000, WireFormat::Int8, tuning), 0u);
}

// Defects of the pre-1.0 audit (issue 12), one test each, through the public C API: a checkpoint
// whose flags contradict the engine, huge request timeouts, collectives of count 0, malformed
// CO2_LOCAL_TEST_* variables, a failed host alloc_flat in CUDA builds, beta from 0 to > 0, an
// outer update that overflows from finite inputs, and co2_engine_state_size while the average is
// in flight. Its own executable: it sets CO2_LOCAL_TEST_* in-process.
#include <zlib.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "co2/co2.h"
#include "rank_threads.hpp"

namespace {

using co2test::run_ranks;
using co2test::ScopedEnv;
using co2test::unique_group_name;

co2_comm_t one_rank_comm() {
  co2_comm_t comm = nullptr;
  EXPECT_EQ(co2test::create_comm(unique_group_name(), 0, 1, &comm), CO2_OK) << co2_last_error_message();
  return comm;
}

// One rank, one tensor `w` of `p.size()` elements, committed.
co2_engine_t make_engine(co2_comm_t comm, co2_engine_config_t config, std::vector<float>& p) {
  co2_engine_t engine = nullptr;
  EXPECT_EQ(co2_engine_create(comm, &config, &engine), CO2_OK) << co2_last_error_message();
  if (!engine) return nullptr;
  co2_tensor_t t = CO2_TENSOR_INIT;
  t.name = "w";
  t.data = p.data();
  t.count = p.size();
  EXPECT_EQ(co2_engine_register_tensor(engine, &t), CO2_OK) << co2_last_error_message();
  EXPECT_EQ(co2_engine_commit(engine), CO2_OK) << co2_last_error_message();
  return engine;
}

co2_engine_config_t config_of(co2_algorithm_t algorithm, double outer_lr, double beta) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.eager = 0;  // the delayed schedule (eager has its own cases)
  c.algorithm = algorithm;
  c.tau = 1;
  c.outer_lr = outer_lr;
  c.outer_momentum = beta;
  c.anchor_check_interval = 0;
  return c;
}

std::vector<float> anchor_of(co2_engine_t engine, size_t n) {
  std::vector<float> a(n, -7.0f);
  EXPECT_EQ(co2_engine_consensus(engine, CO2_CONSENSUS_ANCHOR, a.data(), n), CO2_OK) << co2_last_error_message();
  return a;
}

// co2 applies a round's average a round later: synchronize applies it now.
co2_status_t finish_round(co2_engine_t engine, co2_algorithm_t algorithm) {
  return algorithm == CO2_ALGO_CO2 ? co2_engine_synchronize(engine) : CO2_OK;
}

struct Blob {
  std::vector<unsigned char> bytes;
  size_t at = 0;
};

int write_blob(void* user, const void* data, size_t length) {
  auto* b = static_cast<Blob*>(user);
  const auto* c = static_cast<const unsigned char*>(data);
  b->bytes.insert(b->bytes.end(), c, c + length);
  return 0;
}

int read_blob(void* user, void* data, size_t length) {
  auto* b = static_cast<Blob*>(user);
  if (b->bytes.size() - b->at < length) return 1;
  std::memcpy(data, b->bytes.data() + b->at, length);
  b->at += length;
  return 0;
}

// --- checkpoint flags that contradict the engine (issue 12, item 5) -------------------------

// Offsets in a blob (runtime/engine/checkpoint.cpp): magic 8, version 4, layout hash 8, world size 4,
// algorithm 4, flags 4, ...; the header CRC follows 128 bytes of header fields.
constexpr size_t kFlagsAt = 8 + 4 + 8 + 4 + 4;
constexpr size_t kHeaderCrcAt = 8 + 4 + 128;
constexpr uint32_t kHasMomentum = 1u << 2, kHasAnchor = 1u << 4;

uint32_t get_u32(const std::vector<unsigned char>& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
void put_u32(std::vector<unsigned char>& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }

// A blob of one segment `w` of n elements without momentum or average, re-encoded with the
// anchor flag cleared and the anchor's bytes removed: every CRC valid, the body consistent.
std::vector<unsigned char> without_anchor(std::vector<unsigned char> b, size_t n) {
  const uint32_t flags = get_u32(b, kFlagsAt);
  EXPECT_EQ(flags & (kHasAnchor | kHasMomentum), kHasAnchor);
  put_u32(b, kFlagsAt, flags & ~kHasAnchor);
  put_u32(b, kHeaderCrcAt, uint32_t(crc32(0, b.data(), uInt(kHeaderCrcAt))));
  // segment: u32 name length, "w", u32 role, u64 count, 3 x 8 history, then the anchor.
  const size_t anchor_at = kHeaderCrcAt + 4 + 4 + 1 + 4 + 8 + 24;
  b.erase(b.begin() + long(anchor_at), b.begin() + long(anchor_at + n * sizeof(float)));
  const size_t body_crc_at = b.size() - 8 - 4;
  put_u32(b, body_crc_at, uint32_t(crc32(0, b.data(), uInt(body_crc_at))));
  return b;
}

TEST(AuditCheckpoint, AnchorFlagClearedIsRefusedNotACrash) {
  for (co2_algorithm_t algorithm : {CO2_ALGO_CO2, CO2_ALGO_DILOCO}) {
    SCOPED_TRACE(algorithm == CO2_ALGO_CO2 ? "co2" : "diloco");
    co2_comm_t comm = one_rank_comm();
    std::vector<float> p = {1.0f, 2.0f, 3.0f, 4.0f};
    co2_engine_t engine = make_engine(comm, config_of(algorithm, 1.0, 0.0), p);
    ASSERT_NE(engine, nullptr);
    Blob saved;
    ASSERT_EQ(co2_engine_save(engine, write_blob, &saved), CO2_OK) << co2_last_error_message();
    Blob forged;
    forged.bytes = without_anchor(saved.bytes, p.size());
    p.assign({9.0f, 9.0f, 9.0f, 9.0f});
    const co2_status_t s = co2_engine_load(engine, read_blob, &forged);
    EXPECT_TRUE(s == CO2_ERR_CHECKPOINT_CORRUPT || s == CO2_ERR_CHECKPOINT_MISMATCH) << s;
    EXPECT_NE(std::string(co2_last_error_message()).find("anchor"), std::string::npos) << co2_last_error_message();
    // Transactional: the engine is as it was, and the genuine blob still loads.
    EXPECT_EQ(anchor_of(engine, p.size()), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
    EXPECT_EQ(p[0], 9.0f);
    saved.at = 0;
    EXPECT_EQ(co2_engine_load(engine, read_blob, &saved), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(p[0], 1.0f);
    EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  }
}

// --- a CRC-valid blob with non-finite outer state (issue 23, item 17) ---------------------------

// No writer saves a non-finite anchor, momentum or eager state (a refused update leaves them as
// they were), so a blob that holds one is corrupted or crafted: its load is refused with
// CHECKPOINT_CORRUPT, the engine stays as it was, and the genuine blob still loads.
// One segment "w" of n elements saved right after commit by a one-rank co2 engine with momentum:
// the header (with the rank of an eager blob inside its CRC), then the segment's name length,
// name, role, count and history, then anchor, momentum[, eager offset, eager momentum].
struct Poisoned {
  const char* what;
  size_t array;  // 0 anchor, 1 momentum, 2 eager offset, 3 eager momentum
  size_t element;
  float value;
};

TEST(AuditCheckpoint, NonFiniteStateIsRefusedAsCorrupt) {
  constexpr size_t n = 5;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (co2_tensor_role_t role : {CO2_ROLE_PARAMETER, CO2_ROLE_BUFFER}) {
    const bool eager = role == CO2_ROLE_PARAMETER;  // BUFFER segments carry no eager state
    SCOPED_TRACE(eager ? "PARAMETER, eager" : "BUFFER");
    co2_comm_t comm = one_rank_comm();
    co2_engine_config_t config = config_of(CO2_ALGO_CO2, 1.0, 0.5);
    config.eager = 1;
    co2_engine_t engine = nullptr;
    ASSERT_EQ(co2_engine_create(comm, &config, &engine), CO2_OK) << co2_last_error_message();
    std::vector<float> p = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = p.data();
    t.count = n;
    t.role = role;
    ASSERT_EQ(co2_engine_register_tensor(engine, &t), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(co2_engine_commit(engine), CO2_OK) << co2_last_error_message();
    Blob saved;
    ASSERT_EQ(co2_engine_save(engine, write_blob, &saved), CO2_OK) << co2_last_error_message();
    const size_t arrays = eager ? 4 : 2;
    const size_t first_array_at = kHeaderCrcAt + 4 /* rank */ + 4 + 4 + 1 + 4 + 8 + 24;
    ASSERT_EQ(saved.bytes.size(), first_array_at + arrays * n * sizeof(float) + 4 + 8) << "blob layout";
    std::vector<Poisoned> cases = {{"a NaN anchor", 0, 2, nan}, {"an infinite momentum", 1, 1, inf}};
    if (eager) {
      cases.push_back({"a NaN eager offset", 2, 0, nan});
      cases.push_back({"an infinite eager momentum", 3, 4, -inf});
    }
    for (const Poisoned& c : cases) {
      SCOPED_TRACE(c.what);
      Blob forged;
      forged.bytes = saved.bytes;
      std::memcpy(forged.bytes.data() + first_array_at + (c.array * n + c.element) * sizeof(float), &c.value,
                  sizeof(float));
      const size_t body_crc_at = forged.bytes.size() - 8 - 4;
      put_u32(forged.bytes, body_crc_at, uint32_t(crc32(0, forged.bytes.data(), uInt(body_crc_at))));
      p.assign({9.0f, 9.0f, 9.0f, 9.0f, 9.0f});
      EXPECT_EQ(co2_engine_load(engine, read_blob, &forged), CO2_ERR_CHECKPOINT_CORRUPT);
      EXPECT_NE(std::string(co2_last_error_message()).find("non-finite"), std::string::npos)
          << co2_last_error_message();
      EXPECT_EQ(p[0], 9.0f) << "the refused load touched the parameters";
      EXPECT_EQ(anchor_of(engine, n), (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f}));
      EXPECT_EQ(co2_engine_synchronize(engine), CO2_OK) << co2_last_error_message();
      for (float x : p) EXPECT_TRUE(std::isfinite(x));
    }
    saved.at = 0;
    EXPECT_EQ(co2_engine_load(engine, read_blob, &saved), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(p[0], 1.0f);
    EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  }
}

// --- co2_request_wait with huge timeouts (item 6) --------------------------------------------

TEST(AuditRequest, HugeTimeoutsWaitForCompletion) {
  co2_comm_t comm = one_rank_comm();
  for (int64_t timeout : {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max() - 1,
                          std::numeric_limits<int64_t>::max() / 2, int64_t(1) << 53, int64_t(10000000000000)}) {
    float x[2] = {1.0f, 2.0f};
    co2_request_t request = nullptr;
    ASSERT_EQ(co2_allreduce(comm, x, 2, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &request), CO2_OK);
    EXPECT_EQ(co2_request_wait(request, timeout), CO2_OK) << timeout << ": " << co2_last_error_message();
    EXPECT_EQ(co2_request_wait(request, timeout), CO2_OK) << "again, completed: " << timeout;
    EXPECT_EQ(co2_request_free(request), CO2_OK);
  }
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

// An all-reduce whose peer joins 200 ms later: the huge timeout waits instead of giving up.
TEST(AuditRequest, HugeTimeoutWaitsForAPendingRequest) {
  run_ranks(2, [](int rank, co2_comm_t comm) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    double x = rank + 1.0;
    co2_request_t request = nullptr;
    ASSERT_EQ(co2_allreduce(comm, &x, 1, CO2_DTYPE_FP64, CO2_REDUCE_SUM, nullptr, &request), CO2_OK);
    EXPECT_EQ(co2_request_wait(request, std::numeric_limits<int64_t>::max()), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(x, 3.0);
    EXPECT_EQ(co2_request_free(request), CO2_OK);
  });
}

// --- count 0 (item 9) --------------------------------------------------------------------------

// A collective without data, NULL buffer allowed; it pairs across ranks like any other, so the
// collective after it still matches.
TEST(AuditCollectives, CountZeroIsACollectiveWithoutData) {
  run_ranks(2, [](int rank, co2_comm_t comm) {
    co2_request_t request = nullptr;
    ASSERT_EQ(co2_allreduce(comm, nullptr, 0, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &request), CO2_OK)
        << co2_last_error_message();
    EXPECT_EQ(co2_request_wait(request, 60000), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(co2_request_free(request), CO2_OK);
    int64_t unused = 5;
    ASSERT_EQ(co2_broadcast(comm, &unused, 0, CO2_DTYPE_INT64, 1, nullptr, &request), CO2_OK)
        << co2_last_error_message();
    EXPECT_EQ(co2_request_wait(request, 60000), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(co2_request_free(request), CO2_OK);
    EXPECT_EQ(unused, 5);
    int32_t x[3] = {rank, 10 * rank, 100};
    ASSERT_EQ(co2_allreduce(comm, x, 3, CO2_DTYPE_INT32, CO2_REDUCE_SUM, nullptr, &request), CO2_OK);
    EXPECT_EQ(co2_request_wait(request, 60000), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(co2_request_free(request), CO2_OK);
    EXPECT_EQ(x[0], 1);
    EXPECT_EQ(x[1], 10);
    EXPECT_EQ(x[2], 200);
  });
}

// --- malformed CO2_LOCAL_TEST_* (item 9) -------------------------------------------------------

TEST(AuditEnvironment, MalformedLocalTestVariablesAreInvalidArguments) {
  const std::pair<const char*, const char*> cases[] = {
      {"CO2_LOCAL_TEST_BANDWIDTH", "fast"}, {"CO2_LOCAL_TEST_BANDWIDTH", "-1"},
      {"CO2_LOCAL_TEST_LATENCY_US", "-5"}, {"CO2_LOCAL_TEST_LATENCY_US", "10ms"}};
  for (const auto& c : cases) {
    ScopedEnv env(c.first, c.second);
    co2_comm_t comm = nullptr;
    EXPECT_EQ(co2test::create_comm(unique_group_name(), 0, 1, &comm), CO2_ERR_INVALID_ARGUMENT)
        << c.first << "=" << c.second;
    EXPECT_NE(std::string(co2_last_error_message()).find(c.first), std::string::npos) << co2_last_error_message();
    EXPECT_EQ(comm, nullptr);
  }
}

// --- a failed host alloc_flat leaves no placement behind (item 9) -----------------------------

TEST(AuditPlacement, FailedHostAllocFlatDoesNotPinTheEngineToTheHost) {
  co2_comm_t comm = one_rank_comm();
  co2_engine_t engine = nullptr;
  ASSERT_EQ(co2_engine_create(comm, nullptr, &engine), CO2_OK);
  // Only CUDA builds can place an engine anywhere but the host.
  if (co2_engine_set_allocator(engine, nullptr) == CO2_ERR_UNSUPPORTED) {
    co2_engine_destroy(engine);
    co2_comm_destroy(comm);
    GTEST_SKIP() << "this libco2 has no CUDA: the host is the only placement";
  }
#if defined(__SANITIZE_ADDRESS__)
  co2_engine_destroy(engine);
  co2_comm_destroy(comm);
  GTEST_SKIP() << "AddressSanitizer aborts on a 4 TiB allocation instead of failing it";
#endif
  void* flat = nullptr;
  ASSERT_EQ(co2_engine_alloc_flat(engine, size_t(1) << 40, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat),
            CO2_ERR_OUT_OF_MEMORY);
  // A CUDA flat storage is judged on its own merits (no GPU here: a device error), never refused
  // because the failed host call pinned the engine to the host.
  const co2_status_t s = co2_engine_alloc_flat(engine, 16, CO2_DTYPE_FP32, CO2_DEVICE_CUDA, 0, &flat);
  EXPECT_EQ(std::string(co2_last_error_message()).find("must all live"), std::string::npos)
      << s << ": " << co2_last_error_message();
  EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

// --- beta from 0 to > 0 (item 9; docs/algorithm.md, "Changing beta") ---------------------------

// While beta = 0 no momentum is kept; the first update after the setter makes beta > 0 starts
// from zero momentum: m = c, not beta * (last c) + c.
TEST(AuditMomentum, BetaFromZeroStartsFromZeroMomentum) {
  for (co2_algorithm_t algorithm : {CO2_ALGO_DILOCO, CO2_ALGO_CO2}) {
    SCOPED_TRACE(algorithm == CO2_ALGO_CO2 ? "co2" : "diloco");
    co2_comm_t comm = one_rank_comm();
    std::vector<float> p = {0.0f, 0.0f};
    co2_engine_t engine = make_engine(comm, config_of(algorithm, 1.0, 0.0), p);
    ASSERT_NE(engine, nullptr);
    // Round 1 (beta = 0): the anchor moves to the parameters (alpha = 1, m = c).
    p = {-1.0f, -2.0f};
    ASSERT_EQ(co2_engine_step(engine, nullptr, nullptr), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(finish_round(engine, algorithm), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(anchor_of(engine, 2), (std::vector<float>{-1.0f, -2.0f}));
    ASSERT_EQ(co2_engine_set_param(engine, CO2_PARAM_OUTER_MOMENTUM, 0.5), CO2_OK);
    // Round 2: c = a - p = (1, 1); zero momentum: m = c, a = a - m = p. A momentum kept from
    // round 1 (c = (1, 2)) would give a = p - 0.5 * (1, 2).
    p = {-2.0f, -3.0f};
    ASSERT_EQ(co2_engine_step(engine, nullptr, nullptr), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(finish_round(engine, algorithm), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(anchor_of(engine, 2), (std::vector<float>{-2.0f, -3.0f}));
    // Round 3: now the momentum carries over: c = (1, 1), m = 0.5 * (1, 1) + c = (1.5, 1.5).
    p = {-3.0f, -4.0f};
    ASSERT_EQ(co2_engine_step(engine, nullptr, nullptr), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(finish_round(engine, algorithm), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(anchor_of(engine, 2), (std::vector<float>{-3.5f, -4.5f}));
    EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  }
}

// --- an update that overflows from finite inputs (item 9) -------------------------------------

// a = 3e38, c = a - p = -1e33 (finite), alpha = 1e6: a - alpha * s = 3e38 + 1e39 overflows. The
// boundary must report CO2_ERR_NONFINITE and leave anchor (and momentum) as they were; with
// alpha back at 1 the next round is exact again.
TEST(AuditOverflow, AnUpdateThatOverflowsIsNotApplied) {
  for (co2_algorithm_t algorithm : {CO2_ALGO_DILOCO, CO2_ALGO_CO2}) {
    for (double beta : {0.0, 0.5}) {
      SCOPED_TRACE(std::string(algorithm == CO2_ALGO_CO2 ? "co2" : "diloco") + " beta " + std::to_string(beta));
      co2_comm_t comm = one_rank_comm();
      std::vector<float> p = {3e38f, 1.0f};
      co2_engine_t engine = make_engine(comm, config_of(algorithm, 1e6, beta), p);
      ASSERT_NE(engine, nullptr);
      p = {3e38f + 1e33f, 1.0f};
      const std::vector<float> before = anchor_of(engine, 2);
      co2_status_t s = co2_engine_step(engine, nullptr, nullptr);
      if (algorithm == CO2_ALGO_CO2) {  // the average arrives a round later
        ASSERT_EQ(s, CO2_OK) << co2_last_error_message();
        s = co2_engine_synchronize(engine);
      }
      EXPECT_EQ(s, CO2_ERR_NONFINITE) << co2_last_error_message();
      const std::vector<float> after = anchor_of(engine, 2);
      EXPECT_EQ(after, before);
      EXPECT_TRUE(std::isfinite(after[0]));
      co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
      ASSERT_EQ(co2_engine_get_stats(engine, &stats), CO2_OK);
      EXPECT_EQ(stats.nonfinite_rounds, 1u);
      EXPECT_EQ(stats.outer_updates, 0u);
      // A sane round: c = (0, 0.5); zero momentum (nothing entered it): a = a - c.
      ASSERT_EQ(co2_engine_set_param(engine, CO2_PARAM_OUTER_LR, 1.0), CO2_OK);
      p = {before[0], 0.5f};
      ASSERT_EQ(co2_engine_step(engine, nullptr, nullptr), CO2_OK) << co2_last_error_message();
      ASSERT_EQ(finish_round(engine, algorithm), CO2_OK) << co2_last_error_message();
      EXPECT_EQ(anchor_of(engine, 2), (std::vector<float>{before[0], 0.5f}));
      EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
      EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
    }
  }
}

// --- co2_engine_state_size while the average is in flight (item 7) ----------------------------

// Right after a co2 boundary the all-reduce of the deltas is on a slowed link (~0.3 s) and the
// progress thread writes the comm buffer and, once it arrives, the momentum: state_size must
// neither read them (ThreadSanitizer reports the reads the unfixed library made) nor wait, and
// must equal what save then writes.
TEST(AuditStateSize, StateSizeWhileTheAverageIsInFlightEqualsTheSavedSize) {
  ScopedEnv slow("CO2_LOCAL_TEST_BANDWIDTH", "4000000");
  constexpr size_t kCount = size_t(1) << 18;  // 1 MiB of deltas
  run_ranks(2, [&](int rank, co2_comm_t comm) {
    std::vector<float> p(kCount, 0.5f);
    co2_engine_t engine = make_engine(comm, config_of(CO2_ALGO_CO2, 1.0, 0.5), p);
    ASSERT_NE(engine, nullptr);
    for (size_t i = 0; i < kCount; ++i) p[i] = float(rank) * 0.25f + float(i % 7);
    int boundary = 0;
    ASSERT_EQ(co2_engine_step(engine, nullptr, &boundary), CO2_OK) << co2_last_error_message();
    ASSERT_EQ(boundary, 1);
    // Asked again and again while the deltas travel (~0.3 s), with no other call in between
    // that could order these reads before the progress thread's writes.
    size_t in_flight = 0;
    ASSERT_EQ(co2_engine_state_size(engine, &in_flight), CO2_OK) << co2_last_error_message();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
    while (std::chrono::steady_clock::now() < until) {
      size_t again = 0;
      ASSERT_EQ(co2_engine_state_size(engine, &again), CO2_OK) << co2_last_error_message();
      ASSERT_EQ(again, in_flight);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    Blob saved;
    ASSERT_EQ(co2_engine_save(engine, rank == 0 ? write_blob : nullptr, &saved), CO2_OK)
        << co2_last_error_message();
    size_t collected = 0;
    ASSERT_EQ(co2_engine_state_size(engine, &collected), CO2_OK);
    EXPECT_EQ(in_flight, collected);
    if (rank == 0) {
      EXPECT_EQ(in_flight, saved.bytes.size());
    }
    // anchor, momentum and the average, 4 bytes each per element, plus header and trailer.
    EXPECT_GT(in_flight, 3 * kCount * sizeof(float));
    EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
  });
}

}  // namespace

// Bad input for every entry point of co2.h: NULL handles and pointers, zero or mismatched sizes,
// unknown enum values, config structs with a wrong `size`/`version`, and calls in the wrong
// state. Each must return its specific status, leave a non-empty co2_last_error_message(), not
// crash, leave outputs untouched, and leave the handle usable (or cleanly destroyable).
//
// The `size` rule for size-first structs (docs/capi.md): size 0 or smaller than the v1 struct
// (capi/abi_v1.h) -> CO2_ERR_INVALID_CONFIG; version 0 -> CO2_ERR_INVALID_CONFIG; a size larger than the
// library's sizeof is accepted and only the library's sizeof bytes are read (or written, for
// stats), so a program built against a newer header runs on an older library.
//
// Every communicator is a world_size-1 `local` communicator with its own group name, so the
// whole test runs on one thread (plus the communicators' progress threads).
#include <co2/co2.h>

#include "capi/abi_v1.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define CO2_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CO2_TEST_ASAN 1
#endif
#endif
#ifndef CO2_TEST_ASAN
#define CO2_TEST_ASAN 0
#endif

namespace {

// Expects `call` to return `expected`; on failure the thread's message must be non-empty.
// (The call is evaluated before status_is reads the thread's last error message.)
::testing::AssertionResult status_is(const char* expr, co2_status_t expected, co2_status_t actual) {
  const char* m = co2_last_error_message();
  const std::string message = m ? m : "(null)";
  if (actual != expected)
    return ::testing::AssertionFailure() << expr << " returned " << actual << " ("
                                         << co2_status_string(actual) << "), expected " << expected
                                         << " (" << co2_status_string(expected) << "): " << message;
  if (actual != CO2_OK && (m == nullptr || message.empty()))
    return ::testing::AssertionFailure() << expr << " failed without a co2_last_error_message";
  return ::testing::AssertionSuccess();
}

#define EXPECT_STATUS(expected, call) EXPECT_TRUE(status_is(#call, co2_status_t(expected), (call)))

#define ASSERT_OK(call)                                                                  \
  do {                                                                                   \
    const co2_status_t status_ = (call);                                                 \
    ASSERT_EQ(status_, CO2_OK) << #call << ": " << co2_status_string(status_) << ": "    \
                               << co2_last_error_message();                              \
  } while (0)

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

co2_engine_t const kSentinelEngine = reinterpret_cast<co2_engine_t>(uintptr_t(0x5EED));
co2_comm_t const kSentinelComm = reinterpret_cast<co2_comm_t>(uintptr_t(0x5EED));
co2_request_t const kSentinelRequest = reinterpret_cast<co2_request_t>(uintptr_t(0x5EED));

std::string unique_group(const char* what) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::string("bad_input.") + (info ? info->name() : "none") + "." + what + "." +
         std::to_string(counter++);
}

co2_comm_config_t local_config(const std::string& group) {
  co2_comm_config_t c = CO2_COMM_CONFIG_INIT;
  c.transport = CO2_TRANSPORT_LOCAL;
  c.rank = 0;
  c.world_size = 1;
  c.group_name = group.c_str();  // the caller keeps `group` alive for the call
  c.timeout_ms = 10000;
  return c;
}

co2_engine_config_t engine_config(co2_algorithm_t algorithm = CO2_ALGO_CO2, uint32_t tau = 2) {
  co2_engine_config_t c = CO2_ENGINE_CONFIG_INIT;
  c.algorithm = algorithm;
  c.tau = tau;
  return c;
}

co2_tensor_t tensor(const char* name, float* data, size_t count) {
  co2_tensor_t t = CO2_TENSOR_INIT;
  t.name = name;
  t.data = data;
  t.count = count;
  return t;
}

co2_segment_t segment(const char* name, size_t offset, size_t count) {
  co2_segment_t s = CO2_SEGMENT_INIT;
  s.name = name;
  s.offset = offset;
  s.count = count;
  return s;
}

// A fixture with one world_size-1 local communicator.
class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    group_ = unique_group("comm");
    const co2_comm_config_t c = local_config(group_);
    ASSERT_OK(co2_comm_create(&c, &comm_));
    ASSERT_NE(comm_, nullptr);
  }
  void TearDown() override {
    for (co2_engine_t e : engines_) EXPECT_EQ(co2_engine_destroy(e), CO2_OK);
    EXPECT_EQ(co2_comm_destroy(comm_), CO2_OK);
  }

  co2_engine_t make_engine(co2_algorithm_t algorithm = CO2_ALGO_CO2, uint32_t tau = 2) {
    const co2_engine_config_t c = engine_config(algorithm, tau);
    co2_engine_t e = nullptr;
    const co2_status_t s = co2_engine_create(comm_, &c, &e);
    EXPECT_EQ(s, CO2_OK) << co2_last_error_message();
    if (e) engines_.push_back(e);
    return e;
  }

  // An engine with one committed tensor of params_.size() elements.
  co2_engine_t committed_engine(co2_algorithm_t algorithm = CO2_ALGO_CO2, uint32_t tau = 2) {
    co2_engine_t e = make_engine(algorithm, tau);
    if (!e) return nullptr;
    params_.assign(7, 0.0f);
    for (size_t i = 0; i < params_.size(); ++i) params_[i] = 0.25f * float(i) - 0.5f;
    const co2_tensor_t t = tensor("w", params_.data(), params_.size());
    EXPECT_EQ(co2_engine_register_tensor(e, &t), CO2_OK) << co2_last_error_message();
    EXPECT_EQ(co2_engine_commit(e), CO2_OK) << co2_last_error_message();
    return e;
  }

  // Frees an engine early (and forgets it).
  void destroy(co2_engine_t e) {
    for (auto it = engines_.begin(); it != engines_.end(); ++it)
      if (*it == e) {
        engines_.erase(it);
        break;
      }
    EXPECT_EQ(co2_engine_destroy(e), CO2_OK);
  }

  std::string group_;
  co2_comm_t comm_ = nullptr;
  std::vector<co2_engine_t> engines_;
  std::vector<float> params_;
};

// Runs `steps` steps and expects them to succeed.
void run_steps(co2_engine_t e, int steps) {
  for (int i = 0; i < steps; ++i) {
    int boundary = -1;
    EXPECT_STATUS(CO2_OK, co2_engine_step(e, nullptr, &boundary));
    EXPECT_TRUE(boundary == 0 || boundary == 1);
  }
}

// ------------------------------------------------------------------------------------------
// Handles that need none
// ------------------------------------------------------------------------------------------

TEST(BadInputGlobal, DestroyNullIsOk) {
  EXPECT_EQ(co2_comm_destroy(nullptr), CO2_OK);
  EXPECT_EQ(co2_engine_destroy(nullptr), CO2_OK);
  EXPECT_EQ(co2_request_free(nullptr), CO2_OK);
}

TEST(BadInputGlobal, InitFunctionsRejectNull) {
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_config_init(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_config_init(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_tensor_init(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_segment_init(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_stats_init(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_get_unique_id(nullptr));
  int a = 1, b = 2, c = 3;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_get_version(nullptr, nullptr, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_get_version(&a, &b, nullptr));
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(c, 3);
}

TEST(BadInputGlobal, NullHandlesEverywhere) {
  int32_t i32 = 7;
  int done = 7;
  size_t n = 7;
  double d = 7.0;
  float f[4] = {0, 0, 0, 0};
  void* ptr = &n;
  co2_request_t req = kSentinelRequest;
  co2_engine_t engine = kSentinelEngine;
  co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
  co2_tensor_t t = tensor("t", f, 4);
  co2_segment_t s = segment("s", 0, 4);
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;

  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_rank(nullptr, &i32));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_size(nullptr, &i32));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_abort(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_allreduce(nullptr, f, 4, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_broadcast(nullptr, f, 4, CO2_DTYPE_FP32, 0, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_request_test(nullptr, &done));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_request_wait(nullptr, -1));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(nullptr, &ec, &engine));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(nullptr, &t));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_alloc_flat(nullptr, 4, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &ptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_adopt_flat(nullptr, f, 4, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(nullptr, &s));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_commit(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_step(nullptr, nullptr, &done));
  void* grads[1] = {f};
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_reduce_gradients(nullptr, grads, 1, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_synchronize(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_finalize(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_leave(nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_consensus(nullptr, CO2_CONSENSUS_ANCHOR, f, 4));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_num_elements(nullptr, &n));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_set_param(nullptr, CO2_PARAM_TAU, 3));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_get_param(nullptr, CO2_PARAM_TAU, &d));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_get_stats(nullptr, &stats));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_save(nullptr, [](void*, const void*, size_t) { return 0; }, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_state_size(nullptr, &n));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_save_portable(nullptr, [](void*, const void*, size_t) { return 0; }, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_portable_state_size(nullptr, &n));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_load(nullptr, [](void*, void*, size_t) { return 0; }, nullptr));

  // Outputs untouched.
  EXPECT_EQ(i32, 7);
  EXPECT_EQ(done, 7);
  EXPECT_EQ(n, 7u);
  EXPECT_EQ(d, 7.0);
  EXPECT_EQ(ptr, static_cast<void*>(&n));
  EXPECT_EQ(req, kSentinelRequest);
  EXPECT_EQ(engine, kSentinelEngine);
}

// ------------------------------------------------------------------------------------------
// Communicator creation
// ------------------------------------------------------------------------------------------

TEST(BadInputComm, CreateNullPointers) {
  const std::string g = unique_group("g");
  const co2_comm_config_t c = local_config(g);
  co2_comm_t comm = kSentinelComm;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(nullptr, nullptr));
  EXPECT_EQ(comm, kSentinelComm);
  // config = NULL means the defaults (co2.h): a group of one.
  ASSERT_OK(co2_comm_create(nullptr, &comm));
  ASSERT_NE(comm, kSentinelComm);
  int32_t size = -1;
  EXPECT_STATUS(CO2_OK, co2_comm_size(comm, &size));
  EXPECT_EQ(size, 1);
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

TEST(BadInputComm, ConfigSizeAndVersion) {
  const std::string g = unique_group("g");
  co2_comm_t comm = kSentinelComm;
  for (size_t bad_size : {size_t(0), size_t(1), sizeof(size_t), sizeof(size_t) + 4,
                          size_t(CO2_COMM_CONFIG_V1_SIZE - 8)}) {
    co2_comm_config_t c = local_config(g);
    c.size = bad_size;
    EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create(&c, &comm)) << "size " << bad_size;
  }
  co2_comm_config_t c = local_config(g);
  c.version = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create(&c, &comm));
  EXPECT_EQ(comm, kSentinelComm);

  // The group name was never taken by the failed calls: a valid config with it works.
  c = local_config(g);
  ASSERT_OK(co2_comm_create(&c, &comm));
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

// Reserved fields must be 0, so that a later version can give them a meaning; version is the
// CO2_ABI_VERSION of the caller's header: 1 (1.0) up to this library's, nothing else.
TEST(BadInputComm, ReservedFieldsAndVersion) {
  const std::string g = unique_group("g");
  co2_comm_t comm = kSentinelComm;
  for (int field = 0; field < 3; ++field) {
    co2_comm_config_t c = local_config(g);
    (field == 0 ? c.reserved0 : field == 1 ? c.reserved1 : c.reserved2) = 7;
    EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create(&c, &comm)) << "reserved" << field;
    EXPECT_NE(std::string(co2_last_error_message()).find("reserved" + std::to_string(field)), std::string::npos)
        << co2_last_error_message();
  }
  co2_comm_config_t newer = local_config(g);
  newer.version = CO2_ABI_VERSION + 1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create(&newer, &comm));
  EXPECT_NE(std::string(co2_last_error_message()).find("version"), std::string::npos) << co2_last_error_message();
  EXPECT_EQ(comm, kSentinelComm);
  // A 1.0 caller: version 1, and its struct ends before reserved1 (whatever lies there is not
  // its own, so not read).
  for (uint32_t version = 1; version <= CO2_ABI_VERSION; ++version) {
    co2_comm_config_t c = local_config(g);
    c.version = version;
    c.size = version == 1 ? size_t(CO2_COMM_CONFIG_V1_SIZE) : sizeof c;
    c.reserved1 = version == 1 ? 5 : 0;
    ASSERT_OK(co2_comm_create(&c, &comm));
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  }
}

TEST(BadInputComm, LargerConfigFromANewerHeaderIsAccepted) {
  // A newer header's struct: v1 fields, then fields this library does not know. Only
  // sizeof(co2_comm_config_t) bytes are read, whatever follows.
  struct Newer {
    co2_comm_config_t v1;
    unsigned char extra[64];
  };
  for (unsigned char fill : {0x00, 0xFF}) {
    const std::string g = unique_group("g");
    Newer n;
    std::memset(&n, fill, sizeof n);
    n.v1 = local_config(g);
    n.v1.size = sizeof n;
    co2_comm_t comm = nullptr;
    EXPECT_STATUS(CO2_OK, co2_comm_create(&n.v1, &comm));
    int32_t size = 0;
    EXPECT_STATUS(CO2_OK, co2_comm_size(comm, &size));
    EXPECT_EQ(size, 1);
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  }
}

TEST(BadInputComm, UnknownAndUnsupportedTransport) {
  const std::string g = unique_group("g");
  co2_comm_t comm = kSentinelComm;
  co2_comm_config_t c = local_config(g);
  c.transport = 99;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_comm_create(&c, &comm));
  c.transport = -1;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_comm_create(&c, &comm));
  // NCCL: unsupported without NCCL or without a GPU; with both, a group of one forms.
  c.transport = CO2_TRANSPORT_NCCL;
  const co2_status_t nccl = co2_comm_create(&c, &comm);
  if (nccl == CO2_OK) {
    EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
  } else {
    EXPECT_STATUS(CO2_ERR_UNSUPPORTED, nccl);
    EXPECT_EQ(comm, kSentinelComm);
  }
  // An elastic NCCL group of threads has no membership endpoints: refused, naming it, before
  // any GPU is looked for (it used to form a group that silently was not elastic).
  c.elastic_min_ranks = 1;
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_comm_create(&c, &comm));
  EXPECT_EQ(comm, kSentinelComm);
  EXPECT_NE(std::string(co2_last_error_message()).find("elastic membership over NCCL needs ranks that are processes"),
            std::string::npos)
      << co2_last_error_message();
}

TEST(BadInputComm, RankAndWorldSizeOutOfRange) {
  const std::string g = unique_group("g");
  co2_comm_t comm = kSentinelComm;
  struct Case {
    int32_t rank, world_size;
  };
  for (const Case k : {Case{0, 0}, Case{0, -1}, Case{-1, 1}, Case{1, 1}, Case{5, 2}}) {
    co2_comm_config_t c = local_config(g);
    c.rank = k.rank;
    c.world_size = k.world_size;
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, &comm))
        << "rank " << k.rank << " world_size " << k.world_size;
  }
  co2_comm_config_t c = local_config(g);
  c.chunk_bytes = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, &comm));
  c = local_config(g);
  c.device_index = -2;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, &comm));
  EXPECT_NE(std::string(co2_last_error_message()).find("device_index"), std::string::npos);
  c = local_config(g);
  c.connections_per_peer = CO2_MAX_CONNECTIONS + 1;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, &comm));
  EXPECT_NE(std::string(co2_last_error_message()).find("connections_per_peer"), std::string::npos);
  c = local_config(g);
  c.reserved3 = 1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create(&c, &comm));
  c = local_config(g);
  c.group_name = "";
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create(&c, &comm));
  EXPECT_EQ(comm, kSentinelComm);
}

TEST(BadInputComm, RendezvousTimesOutWhenPeersNeverCome) {
  const std::string g = unique_group("g");
  co2_comm_config_t c = local_config(g);
  c.world_size = 2;
  c.timeout_ms = 200;
  co2_comm_t comm = kSentinelComm;
  EXPECT_STATUS(CO2_ERR_RENDEZVOUS, co2_comm_create(&c, &comm));
  EXPECT_EQ(comm, kSentinelComm);
  // The group is free again afterwards.
  c.world_size = 1;
  ASSERT_OK(co2_comm_create(&c, &comm));
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

TEST(BadInputComm, CreateWithId) {
  co2_unique_id_t id;
  ASSERT_OK(co2_get_unique_id(&id));
  co2_comm_t comm = kSentinelComm;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create_with_id(nullptr, nullptr, 0, 1, &comm));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create_with_id(nullptr, &id, 0, 1, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create_with_id(nullptr, &id, 1, 1, &comm));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create_with_id(nullptr, &id, -1, 1, &comm));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_create_with_id(nullptr, &id, 0, 0, &comm));
  co2_comm_config_t bad = CO2_COMM_CONFIG_INIT;
  bad.size = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_comm_create_with_id(&bad, &id, 0, 1, &comm));
  EXPECT_EQ(comm, kSentinelComm);

  // The id works afterwards; rank and world_size come from the arguments, not the config.
  co2_comm_config_t c = CO2_COMM_CONFIG_INIT;
  c.rank = 3;
  c.world_size = 9;
  ASSERT_OK(co2_comm_create_with_id(&c, &id, 0, 1, &comm));
  int32_t rank = -1, size = -1;
  EXPECT_STATUS(CO2_OK, co2_comm_rank(comm, &rank));
  EXPECT_STATUS(CO2_OK, co2_comm_size(comm, &size));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);

  // Two ids differ.
  co2_unique_id_t other;
  ASSERT_OK(co2_get_unique_id(&other));
  EXPECT_NE(std::memcmp(&id, &other, sizeof id), 0);
}

TEST_F(BadInput, CommQueriesRejectNullOutputs) {
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_rank(comm_, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_comm_size(comm_, nullptr));
  int32_t rank = -1, size = -1;
  EXPECT_STATUS(CO2_OK, co2_comm_rank(comm_, &rank));
  EXPECT_STATUS(CO2_OK, co2_comm_size(comm_, &size));
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(size, 1);
}

// ------------------------------------------------------------------------------------------
// Raw collectives and requests
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, AllreduceArguments) {
  float buf[3] = {1.0f, 2.0f, 3.0f};
  co2_request_t req = kSentinelRequest;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_allreduce(comm_, nullptr, 3, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_allreduce(comm_, buf, 3, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, nullptr));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_allreduce(comm_, buf, 3, 99, CO2_REDUCE_SUM, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_allreduce(comm_, buf, 3, -1, CO2_REDUCE_SUM, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED,
                co2_allreduce(comm_, buf, 3, CO2_DTYPE_BF16, CO2_REDUCE_SUM, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_allreduce(comm_, buf, 3, CO2_DTYPE_FP32, 99, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_allreduce(comm_, buf, 3, CO2_DTYPE_FP32, -1, nullptr, &req));
  EXPECT_EQ(req, kSentinelRequest);

  // The communicator still works, and a world of one sums to itself.
  ASSERT_OK(co2_allreduce(comm_, buf, 3, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &req));
  ASSERT_NE(req, kSentinelRequest);
  EXPECT_STATUS(CO2_OK, co2_request_wait(req, -1));
  int done = 0;
  EXPECT_STATUS(CO2_OK, co2_request_test(req, &done));
  EXPECT_EQ(done, 1);
  EXPECT_STATUS(CO2_OK, co2_request_free(req));
  EXPECT_EQ(buf[0], 1.0f);
  EXPECT_EQ(buf[2], 3.0f);
}

TEST_F(BadInput, BroadcastArguments) {
  double buf[2] = {1.5, -2.5};
  co2_request_t req = kSentinelRequest;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_broadcast(comm_, nullptr, 2, CO2_DTYPE_FP64, 0, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_broadcast(comm_, buf, 2, CO2_DTYPE_FP64, -1, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_broadcast(comm_, buf, 2, CO2_DTYPE_FP64, 1, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_broadcast(comm_, buf, 2, CO2_DTYPE_FP64, 0, nullptr, nullptr));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_broadcast(comm_, buf, 2, 42, 0, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_broadcast(comm_, buf, 2, CO2_DTYPE_FP16, 0, nullptr, &req));
  EXPECT_EQ(req, kSentinelRequest);

  ASSERT_OK(co2_broadcast(comm_, buf, 2, CO2_DTYPE_FP64, 0, nullptr, &req));
  EXPECT_STATUS(CO2_OK, co2_request_wait(req, 10000));
  EXPECT_STATUS(CO2_OK, co2_request_free(req));
  EXPECT_EQ(buf[0], 1.5);
  EXPECT_EQ(buf[1], -2.5);
}

TEST_F(BadInput, RequestTestRejectsNullOutput) {
  int64_t v[4] = {1, 2, 3, 4};
  co2_request_t req = nullptr;
  ASSERT_OK(co2_allreduce(comm_, v, 4, CO2_DTYPE_INT64, CO2_REDUCE_MAX, nullptr, &req));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_request_test(req, nullptr));
  // The request is still usable.
  EXPECT_STATUS(CO2_OK, co2_request_wait(req, -1));
  EXPECT_STATUS(CO2_OK, co2_request_wait(req, 0));  // already complete: still OK
  EXPECT_STATUS(CO2_OK, co2_request_free(req));
  EXPECT_EQ(v[3], 4);
}

TEST_F(BadInput, CollectivesAfterAbortFailWithAborted) {
  ASSERT_OK(co2_comm_abort(comm_));
  float buf[2] = {1.0f, 2.0f};
  co2_request_t req = nullptr;
  co2_status_t s = co2_allreduce(comm_, buf, 2, CO2_DTYPE_FP32, CO2_REDUCE_SUM, nullptr, &req);
  if (s == CO2_OK) {  // the failure may surface at the wait instead of the submit
    ASSERT_NE(req, nullptr);
    s = co2_request_wait(req, 10000);
    EXPECT_EQ(co2_request_free(req), CO2_OK);  // freeing a failed request is fine
  }
  EXPECT_EQ(s, CO2_ERR_ABORTED) << co2_status_string(s) << ": " << co2_last_error_message();
  EXPECT_STRNE(co2_last_error_message(), "");
  EXPECT_EQ(co2_comm_abort(comm_), CO2_OK);  // aborting twice is harmless
  // Queries still answer; destroy (TearDown) is clean.
  int32_t rank = -1;
  EXPECT_STATUS(CO2_OK, co2_comm_rank(comm_, &rank));
}

// ------------------------------------------------------------------------------------------
// Engine creation
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, EngineCreateNullPointers) {
  const co2_engine_config_t c = engine_config();
  co2_engine_t e = kSentinelEngine;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, nullptr, nullptr));
  EXPECT_EQ(e, kSentinelEngine);
  // config = NULL means the defaults (co2.h).
  ASSERT_OK(co2_engine_create(comm_, nullptr, &e));
  ASSERT_NE(e, kSentinelEngine);
  double tau = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_get_param(e, CO2_PARAM_TAU, &tau));
  EXPECT_EQ(tau, double(CO2_DEFAULT_TAU));
  EXPECT_EQ(co2_engine_destroy(e), CO2_OK);
}

TEST_F(BadInput, EngineConfigSizeAndVersion) {
  co2_engine_t e = kSentinelEngine;
  for (size_t bad_size : {size_t(0), size_t(1), sizeof(size_t), sizeof(size_t) + 4,
                          size_t(CO2_ENGINE_CONFIG_V1_SIZE - 8)}) {
    co2_engine_config_t c = engine_config();
    c.size = bad_size;
    EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e)) << "size " << bad_size;
  }
  co2_engine_config_t c = engine_config();
  c.version = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e));
  EXPECT_EQ(e, kSentinelEngine);

  struct Newer {
    co2_engine_config_t v1;
    unsigned char extra[40];
  } n;
  std::memset(&n, 0xEE, sizeof n);
  n.v1 = engine_config(CO2_ALGO_CO2, 5);
  n.v1.size = sizeof n;
  co2_engine_t ok = nullptr;
  EXPECT_STATUS(CO2_OK, co2_engine_create(comm_, &n.v1, &ok));
  double tau = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_get_param(ok, CO2_PARAM_TAU, &tau));
  EXPECT_EQ(tau, 5.0);
  EXPECT_EQ(co2_engine_destroy(ok), CO2_OK);
}

TEST_F(BadInput, EngineConfigUnknownEnums) {
  co2_engine_t e = kSentinelEngine;
  co2_engine_config_t c = engine_config();
  c.algorithm = 4;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_create(comm_, &c, &e));
  c = engine_config();
  c.algorithm = -1;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_create(comm_, &c, &e));
  c = engine_config();
  c.penalty = 3;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_create(comm_, &c, &e));
  c = engine_config();
  c.clip = 7;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_create(comm_, &c, &e));
  c = engine_config();
  c.state_dtype = 99;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_create(comm_, &c, &e));
  c = engine_config();
  c.state_dtype = CO2_DTYPE_BF16;  // a separate field from v1 on, but only fp32 state exists
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_create(comm_, &c, &e));
  EXPECT_EQ(e, kSentinelEngine);
}

TEST_F(BadInput, EngineConfigValuesOutOfRange) {
  co2_engine_t e = kSentinelEngine;
  auto expect_invalid = [&](const co2_engine_config_t& c, const char* what) {
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, &e)) << what;
  };
  co2_engine_config_t c;
  c = engine_config(); c.tau = 0; expect_invalid(c, "tau 0");
  c = engine_config(); c.outer_lr = -0.1; expect_invalid(c, "outer_lr < 0");
  c = engine_config(); c.outer_lr = kNaN; expect_invalid(c, "outer_lr NaN");
  c = engine_config(); c.outer_lr = kInf; expect_invalid(c, "outer_lr inf");
  c = engine_config(); c.outer_momentum = 1.0; expect_invalid(c, "momentum 1");
  c = engine_config(); c.outer_momentum = -0.5; expect_invalid(c, "momentum -0.5 (not AUTO)");
  c = engine_config(); c.outer_momentum = kNaN; expect_invalid(c, "momentum NaN");
  c = engine_config(); c.penalty = CO2_PENALTY_CONSTANT; c.penalty_constant = 0; expect_invalid(c, "penalty constant 0");
  c = engine_config(); c.clip = CO2_CLIP_NORM; c.clip_threshold = 0; expect_invalid(c, "clip threshold 0");
  c = engine_config(); c.clip = CO2_CLIP_VALUE; c.clip_threshold = -1; expect_invalid(c, "clip threshold < 0");
  c = engine_config(); c.inner_lr = -1; expect_invalid(c, "inner lr < 0");
  c = engine_config(); c.nesterov = 2; expect_invalid(c, "nesterov not 0/1");
  c = engine_config(); c.state_dtype = CO2_DTYPE_FP64; expect_invalid(c, "state dtype fp64");
  EXPECT_EQ(e, kSentinelEngine);
  // The communicator is untouched by all that: a valid engine still comes up.
  EXPECT_NE(committed_engine(), nullptr);
}

TEST_F(BadInput, EngineConfigReservedFieldsAndVersion) {
  co2_engine_t e = kSentinelEngine;
  co2_engine_config_t c = engine_config();
  c.reserved0 = 1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e));
  EXPECT_NE(std::string(co2_last_error_message()).find("reserved0"), std::string::npos) << co2_last_error_message();
  c = engine_config();
  c.reserved1 = -1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e));
  EXPECT_NE(std::string(co2_last_error_message()).find("reserved1"), std::string::npos) << co2_last_error_message();
  c = engine_config();
  c.reserved2 = 1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e));
  EXPECT_NE(std::string(co2_last_error_message()).find("reserved2"), std::string::npos) << co2_last_error_message();
  c = engine_config();
  c.version = CO2_ABI_VERSION + 1;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_create(comm_, &c, &e));
  EXPECT_EQ(e, kSentinelEngine);
  // A 1.0 caller (version 1, v1 size): reserved1 lies past its struct and is not read.
  c = engine_config();
  c.version = 1;
  c.size = CO2_ENGINE_CONFIG_V1_SIZE;
  c.reserved1 = 9;
  co2_engine_t ok = nullptr;
  EXPECT_STATUS(CO2_OK, co2_engine_create(comm_, &c, &ok));
  EXPECT_EQ(co2_engine_destroy(ok), CO2_OK);

  co2_engine_t flat = make_engine();
  void* storage = nullptr;
  ASSERT_OK(co2_engine_alloc_flat(flat, 8, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &storage));
  co2_segment_t s = segment("s", 0, 8);
  s.reserved0 = 3;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_add_segment(flat, &s));
  EXPECT_NE(std::string(co2_last_error_message()).find("reserved0"), std::string::npos) << co2_last_error_message();
  s.reserved0 = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(flat, &s));
}

// get_stats says which layout it wrote: the library's CO2_ABI_VERSION, whatever the caller's.
TEST_F(BadInput, StatsVersionIsTheLibrarys) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  stats.version = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_get_stats(e, &stats));
  EXPECT_EQ(stats.version, uint32_t(CO2_ABI_VERSION));
  EXPECT_GE(CO2_ABI_VERSION, 3) << "1.2's structs grew: its header is ABI version 3";
}

// tau is bounded as co2_engine_set_param bounds it (an integer in [1, 1e9]) at create too.
TEST_F(BadInput, TauAboveTheSetParamBoundIsRefusedAtCreate) {
  co2_engine_t e = kSentinelEngine;
  for (uint32_t tau : {uint32_t(1000000001), uint32_t(0xFFFFFFFFu)}) {
    co2_engine_config_t c = engine_config(CO2_ALGO_CO2, tau);
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, &e)) << tau;
    EXPECT_NE(std::string(co2_last_error_message()).find("tau"), std::string::npos) << co2_last_error_message();
  }
  EXPECT_EQ(e, kSentinelEngine);
  co2_engine_t ok = make_engine(CO2_ALGO_CO2, 1000000000);
  ASSERT_NE(ok, nullptr);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_set_param(ok, CO2_PARAM_TAU, 1000000001.0));
}

// shard_outer_state (added in 1.1) is 0 or 1; a caller whose 1.1 header ends at error_feedback
// does not pass it, and gets the default (replicated) whatever lies past its struct.
TEST_F(BadInput, ShardOuterStateIsZeroOrOne) {
  co2_engine_t e = kSentinelEngine;
  for (int32_t bad : {2, -1}) {
    co2_engine_config_t c = engine_config();
    c.shard_outer_state = bad;
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, &e)) << bad;
    EXPECT_NE(std::string(co2_last_error_message()).find("shard_outer_state"), std::string::npos)
        << co2_last_error_message();
  }
  EXPECT_EQ(e, kSentinelEngine);

  co2_engine_config_t older = engine_config();
  older.size = offsetof(co2_engine_config_t, shard_outer_state);
  older.shard_outer_state = 2;  // not the caller's: read, it would be refused
  co2_engine_t ok = nullptr;
  EXPECT_STATUS(CO2_OK, co2_engine_create(comm_, &older, &ok));
  EXPECT_EQ(co2_engine_destroy(ok), CO2_OK);
}

// apply_step (added in 1.2): CO2_APPLY_AT_BOUNDARY, CO2_APPLY_ON_ARRIVAL or a step k >= 1, for
// co2 only (create); sharded outer state on host tensors takes it too (on CUDA tensors it is
// refused at commit: runtime/backends/device/host_executor). A 1.1 caller's struct ends before
// it: the default, whatever lies past its struct.
TEST_F(BadInput, ApplyStepValuesAndWhereItApplies) {
  auto message_names_apply_step = [] {
    return std::string(co2_last_error_message()).find("apply_step") != std::string::npos;
  };
  co2_engine_t e = kSentinelEngine;
  for (int32_t bad : {-2, std::numeric_limits<int32_t>::min()}) {
    co2_engine_config_t c = engine_config();
    c.apply_step = bad;
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, &e)) << bad;
    EXPECT_TRUE(message_names_apply_step()) << co2_last_error_message();
  }
  co2_engine_config_t diloco = engine_config(CO2_ALGO_DILOCO);
  diloco.apply_step = CO2_APPLY_ON_ARRIVAL;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &diloco, &e));
  EXPECT_TRUE(message_names_apply_step()) << co2_last_error_message();
  EXPECT_EQ(e, kSentinelEngine);
  for (int32_t good : {CO2_APPLY_ON_ARRIVAL, 1, 5}) {
    co2_engine_config_t c = engine_config();
    c.apply_step = good;
    co2_engine_t ok = nullptr;
    EXPECT_STATUS(CO2_OK, co2_engine_create(comm_, &c, &ok)) << good;
    EXPECT_EQ(co2_engine_destroy(ok), CO2_OK);
  }

  // Sharded outer state on host tensors: committed.
  co2_engine_config_t sharded = engine_config();
  sharded.shard_outer_state = 1;
  sharded.apply_step = CO2_APPLY_ON_ARRIVAL;
  co2_engine_t committed = nullptr;
  ASSERT_OK(co2_engine_create(comm_, &sharded, &committed));
  engines_.push_back(committed);
  float w[4] = {1, 2, 3, 4};
  const co2_tensor_t t = tensor("w", w, 4);
  ASSERT_OK(co2_engine_register_tensor(committed, &t));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(committed));

  // A 1.1 caller (version 2, its struct ending at hierarchy): neither field is read.
  co2_engine_config_t older = engine_config();
  older.version = 2;
  older.size = offsetof(co2_engine_config_t, apply_step);
  older.apply_step = -2;  // not the caller's: read, they would be refused
  older.reserved2 = 1;
  co2_engine_t ok = nullptr;
  EXPECT_STATUS(CO2_OK, co2_engine_create(comm_, &older, &ok));
  EXPECT_EQ(co2_engine_destroy(ok), CO2_OK);
}

TEST_F(BadInput, HierarchyIsFlatOrNodesAndShardsOnlyCo2) {
  co2_engine_t e = kSentinelEngine;
  for (int32_t bad : {2, -1}) {
    co2_engine_config_t c = engine_config();
    c.hierarchy = bad;
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &c, &e)) << bad;
    EXPECT_NE(std::string(co2_last_error_message()).find("hierarchy"), std::string::npos) << co2_last_error_message();
  }
  co2_engine_config_t diloco = engine_config();
  diloco.algorithm = CO2_ALGO_DILOCO;
  diloco.hierarchy = CO2_HIERARCHY_NODES;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_create(comm_, &diloco, &e));
  EXPECT_NE(std::string(co2_last_error_message()).find("co2"), std::string::npos) << co2_last_error_message();
  EXPECT_EQ(e, kSentinelEngine);
}

// ------------------------------------------------------------------------------------------
// Layout: registered tensors
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, RegisterTensorArguments) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  float data[8] = {0};
  co2_tensor_t t;

  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, nullptr));
  t = tensor("w", data, 8); t.size = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 8); t.size = sizeof(size_t);
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_register_tensor(e, &t));
  t = tensor(nullptr, data, 8);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("", data, 8);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("w", nullptr, 8);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 0);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 8); t.dtype = 99;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_register_tensor(e, &t));
  // fp64 parameters: refused with what to do instead (bf16/fp16 are accepted: mixed_precision_test).
  t = tensor("w", data, 8); t.dtype = CO2_DTYPE_FP64;
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_register_tensor(e, &t));
  EXPECT_NE(std::string(co2_last_error_message()).find("fp64 parameters are not supported: train in float32"),
            std::string::npos)
      << co2_last_error_message();
  t = tensor("w", data, 8); t.dtype = CO2_DTYPE_INT32;  // raw collectives only
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 8); t.device = 5;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_register_tensor(e, &t));
  // Host memory declared CUDA: unsupported without CUDA or a GPU, else not device memory.
  t = tensor("w", data, 8); t.device = CO2_DEVICE_CUDA;
  const co2_status_t cuda = co2_engine_register_tensor(e, &t);
  EXPECT_TRUE(cuda == CO2_ERR_UNSUPPORTED || cuda == CO2_ERR_INVALID_ARGUMENT) << co2_status_string(cuda);
  t = tensor("w", data, 8); t.device_index = -1;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 8); t.role = 3;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_register_tensor(e, &t));
  t = tensor("w", data, 8); t.role = -1;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_register_tensor(e, &t));

  // None of that registered anything: the same tensor now goes in, and the layout has 8.
  t = tensor("w", data, 8);
  EXPECT_STATUS(CO2_OK, co2_engine_register_tensor(e, &t));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  size_t n = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_num_elements(e, &n));
  EXPECT_EQ(n, 8u);
  run_steps(e, 4);
}

TEST_F(BadInput, LargerTensorStructIsAccepted) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  float data[3] = {1, 2, 3};
  struct Newer {
    co2_tensor_t v1;
    unsigned char extra[24];
  } n;
  std::memset(&n, 0x77, sizeof n);
  n.v1 = tensor("w", data, 3);
  n.v1.size = sizeof n;
  EXPECT_STATUS(CO2_OK, co2_engine_register_tensor(e, &n.v1));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
}

TEST_F(BadInput, DuplicateTensors) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> a(16, 1.0f), b(4, 2.0f);
  co2_tensor_t t = tensor("a", a.data(), 8);
  ASSERT_OK(co2_engine_register_tensor(e, &t));

  t = tensor("a_again", a.data(), 8);  // the same memory under another name (tied weights)
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));
  t = tensor("a_inner", a.data() + 2, 2);  // inside
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));
  t = tensor("a_tail", a.data() + 7, 4);  // overlaps the last element
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));
  t = tensor("a_cover", a.data(), 16);  // covers it
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));
  t = tensor("a", b.data(), 4);  // same name, other memory
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));

  // Adjacent memory is not an overlap.
  t = tensor("a_next", a.data() + 8, 8);
  EXPECT_STATUS(CO2_OK, co2_engine_register_tensor(e, &t));
  t = tensor("b", b.data(), 4);
  EXPECT_STATUS(CO2_OK, co2_engine_register_tensor(e, &t));

  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  size_t n = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_num_elements(e, &n));
  EXPECT_EQ(n, 20u);
  run_steps(e, 4);
}

// ------------------------------------------------------------------------------------------
// Layout: flat storage
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, AllocFlatArguments) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  void* out = &out;
  void* const sentinel = out;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_alloc_flat(e, 0, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_alloc_flat(e, 16, 99, CO2_DEVICE_HOST, 0, &out));
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP64, CO2_DEVICE_HOST, 0, &out));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP32, 9, 0, &out));
  {  // CUDA flat storage: unsupported without CUDA or a GPU (its own engine: one flat per engine)
    co2_engine_t g = make_engine();
    void* device = &out;
    const co2_status_t cuda = co2_engine_alloc_flat(g, 16, CO2_DTYPE_FP32, CO2_DEVICE_CUDA, 0, &device);
    EXPECT_TRUE(cuda == CO2_ERR_UNSUPPORTED || cuda == CO2_OK) << co2_status_string(cuda);
    if (cuda != CO2_OK) { EXPECT_EQ(device, static_cast<void*>(&out)); }
  }
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP32, CO2_DEVICE_HOST, -1, &out));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT,
                co2_engine_alloc_flat(e, SIZE_MAX, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  EXPECT_EQ(out, sentinel);

  ASSERT_OK(co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  ASSERT_NE(out, sentinel);
  ASSERT_NE(out, nullptr);
  const float* flat = static_cast<const float*>(out);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(flat[i], 0.0f) << "not zero-initialised at " << i;

  void* again = sentinel;
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_alloc_flat(e, 16, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &again));
  EXPECT_EQ(again, sentinel);
  float other[4];
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_adopt_flat(e, other, 4, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));

  // The first storage is intact and usable.
  const co2_segment_t s = segment("all", 0, 16);
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(e, &s));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  run_steps(e, 2);
}

TEST_F(BadInput, AllocFlatOutOfMemory) {
  if (CO2_TEST_ASAN) GTEST_SKIP() << "AddressSanitizer aborts on huge allocations";
  FILE* f = std::fopen("/proc/sys/vm/overcommit_memory", "r");
  int mode = -1;
  if (f) {
    if (std::fscanf(f, "%d", &mode) != 1) mode = -1;
    std::fclose(f);
  }
  if (mode != 0) GTEST_SKIP() << "needs vm.overcommit_memory = 0 (heuristic) to refuse 4 TiB";
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  void* out = nullptr;
  // 2^40 elements = 4 TiB: within the accepted range, beyond any machine of ours.
  EXPECT_STATUS(CO2_ERR_OUT_OF_MEMORY,
                co2_engine_alloc_flat(e, size_t(1) << 40, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  EXPECT_EQ(out, nullptr);
  // Still usable: a small allocation then works.
  EXPECT_STATUS(CO2_OK, co2_engine_alloc_flat(e, 8, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
}

TEST_F(BadInput, AdoptFlatArguments) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> buf(32, 0.5f);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_adopt_flat(e, nullptr, 32, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_adopt_flat(e, buf.data(), 0, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_adopt_flat(e, buf.data(), 32, 17, CO2_DEVICE_HOST, 0));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_adopt_flat(e, buf.data(), 32, CO2_DTYPE_FP32, -3, 0));
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED,
                co2_engine_adopt_flat(e, buf.data(), 32, CO2_DTYPE_FP64, CO2_DEVICE_HOST, 0));

  ASSERT_OK(co2_engine_adopt_flat(e, buf.data(), 32, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE,
                co2_engine_adopt_flat(e, buf.data(), 32, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  void* out = nullptr;
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_alloc_flat(e, 8, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  EXPECT_EQ(out, nullptr);

  // A registered tensor inside the adopted storage is the same memory twice.
  co2_tensor_t t = tensor("alias", buf.data() + 4, 4);
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_register_tensor(e, &t));

  const co2_segment_t s = segment("w", 0, 32);
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(e, &s));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  run_steps(e, 2);
  EXPECT_EQ(buf[0], 0.5f);  // world of one, no inner steps: unchanged
}

TEST_F(BadInput, AdoptFlatOverARegisteredTensor) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> buf(32, 0.5f);
  const co2_tensor_t t = tensor("t", buf.data() + 8, 8);
  ASSERT_OK(co2_engine_register_tensor(e, &t));
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR,
                co2_engine_adopt_flat(e, buf.data(), 32, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  // Storage that does not overlap is fine.
  EXPECT_STATUS(CO2_OK, co2_engine_adopt_flat(e, buf.data() + 16, 16, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
}

TEST_F(BadInput, AddSegmentArguments) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  co2_segment_t s = segment("s", 0, 4);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_add_segment(e, &s));  // no flat storage yet

  void* flat = nullptr;
  ASSERT_OK(co2_engine_alloc_flat(e, 100, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, nullptr));
  s = segment("s", 0, 4); s.size = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_add_segment(e, &s));
  s = segment("s", 0, 4); s.size = 3;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_add_segment(e, &s));
  s = segment(nullptr, 0, 4);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("", 0, 4);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 0, 0);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 0, 101);  // longer than the storage
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 100, 1);  // starts at the end
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 90, 11);  // runs one past the end
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", SIZE_MAX - 1, 4);  // offset + count wraps around
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 4, SIZE_MAX);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_add_segment(e, &s));
  s = segment("s", 0, 4); s.role = 12;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_add_segment(e, &s));

  s = segment("first", 10, 20);
  ASSERT_OK(co2_engine_add_segment(e, &s));
  s = segment("overlap_head", 0, 11);
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_add_segment(e, &s));
  s = segment("overlap_tail", 29, 5);
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_add_segment(e, &s));
  s = segment("same_range", 10, 20);
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_add_segment(e, &s));
  s = segment("first", 50, 10);  // same name, elsewhere
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_add_segment(e, &s));

  // Adjacent segments and the end of the storage are fine; gaps are allowed.
  s = segment("before", 0, 10);
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(e, &s));
  s = segment("after", 30, 10);
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(e, &s));
  s = segment("last", 99, 1);
  EXPECT_STATUS(CO2_OK, co2_engine_add_segment(e, &s));

  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  size_t n = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_num_elements(e, &n));
  EXPECT_EQ(n, 41u);
  run_steps(e, 2);
}

TEST_F(BadInput, SegmentAndTensorNamesShareOneNamespace) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> t_data(4, 1.0f);
  const co2_tensor_t t = tensor("shared_name", t_data.data(), 4);
  ASSERT_OK(co2_engine_register_tensor(e, &t));
  void* flat = nullptr;
  ASSERT_OK(co2_engine_alloc_flat(e, 8, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
  const co2_segment_t s = segment("shared_name", 0, 8);
  EXPECT_STATUS(CO2_ERR_DUPLICATE_TENSOR, co2_engine_add_segment(e, &s));
}

// ------------------------------------------------------------------------------------------
// Wrong state
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, CallsBeforeCommit) {
  co2_engine_t e = make_engine(CO2_ALGO_CO2);
  ASSERT_NE(e, nullptr);
  int boundary = 7;
  size_t n = 7;
  float out[4];
  void* grads[1] = {out};
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_step(e, nullptr, &boundary));
  EXPECT_EQ(boundary, 7);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_reduce_gradients(e, grads, 1, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_synchronize(e));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_finalize(e));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_leave(e));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out, 4));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_num_elements(e, &n));
  EXPECT_EQ(n, 7u);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_state_size(e, &n));
  EXPECT_EQ(n, 7u);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE,
                co2_engine_save(e, [](void*, const void*, size_t) { return 0; }, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE,
                co2_engine_save_portable(e, [](void*, const void*, size_t) { return 0; }, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_portable_state_size(e, &n));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_load(e, [](void*, void*, size_t) { return 0; }, nullptr));
  // Nothing registered: commit refuses an empty layout.
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_commit(e));

  // Parameters and statistics are available before commit.
  double tau = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_set_param(e, CO2_PARAM_TAU, 3));
  EXPECT_STATUS(CO2_OK, co2_engine_get_param(e, CO2_PARAM_TAU, &tau));
  EXPECT_EQ(tau, 3.0);
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  EXPECT_STATUS(CO2_OK, co2_engine_get_stats(e, &stats));
  EXPECT_EQ(stats.steps, 0u);
  EXPECT_EQ(stats.world_size, 1);

  // And the engine recovers: register, commit, step.
  std::vector<float> w(5, 1.0f);
  const co2_tensor_t t = tensor("w", w.data(), w.size());
  EXPECT_STATUS(CO2_OK, co2_engine_register_tensor(e, &t));
  EXPECT_STATUS(CO2_OK, co2_engine_commit(e));
  run_steps(e, 6);
}

TEST_F(BadInput, OnlyExcludedTensorsIsNothingToTrain) {
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> w(5, 1.0f);
  co2_tensor_t t = tensor("rng_state", w.data(), w.size());
  t.role = CO2_ROLE_EXCLUDED;
  ASSERT_OK(co2_engine_register_tensor(e, &t));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_commit(e));
}

TEST_F(BadInput, LayoutCallsAfterCommit) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  std::vector<float> other(4, 0.0f);
  const co2_tensor_t t = tensor("late", other.data(), 4);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_register_tensor(e, &t));
  void* out = &out;
  void* const sentinel = out;
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_alloc_flat(e, 4, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &out));
  EXPECT_EQ(out, sentinel);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE,
                co2_engine_adopt_flat(e, other.data(), 4, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0));
  const co2_segment_t s = segment("late", 0, 4);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_add_segment(e, &s));
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_commit(e));  // twice

  // The committed engine is unaffected.
  size_t n = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_num_elements(e, &n));
  EXPECT_EQ(n, params_.size());
  run_steps(e, 4);
  EXPECT_STATUS(CO2_OK, co2_engine_synchronize(e));
}

TEST_F(BadInput, LeaveNeedsAnElasticGroupAndLeavesTheEngineAsItWas) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  // The fixture's group is not elastic: a rank that went would end it.
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_leave(e));
  EXPECT_NE(std::string(co2_last_error_message()).find("elastic_min_ranks"), std::string::npos)
      << co2_last_error_message();
  run_steps(e, 4);
  EXPECT_STATUS(CO2_OK, co2_engine_finalize(e));
}

TEST_F(BadInput, StepAcceptsNullBoundaryOutput) {
  co2_engine_t e = committed_engine(CO2_ALGO_CO2, 1);
  ASSERT_NE(e, nullptr);
  EXPECT_STATUS(CO2_OK, co2_engine_step(e, nullptr, nullptr));
  int boundary = -1;
  EXPECT_STATUS(CO2_OK, co2_engine_step(e, nullptr, &boundary));
  EXPECT_EQ(boundary, 1);  // tau = 1: every step is a boundary
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  EXPECT_STATUS(CO2_OK, co2_engine_get_stats(e, &stats));
  EXPECT_EQ(stats.steps, 2u);
  EXPECT_EQ(stats.rounds, 2u);
}

TEST_F(BadInput, ReduceGradientsArguments) {
  co2_engine_t e = committed_engine(CO2_ALGO_SYNC, 1);
  ASSERT_NE(e, nullptr);
  std::vector<float> g(params_.size(), 2.0f);
  void* grads[2] = {g.data(), g.data()};
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_reduce_gradients(e, nullptr, 1, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_reduce_gradients(e, grads, 0, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_reduce_gradients(e, grads, 2, nullptr));
  EXPECT_EQ(g[0], 2.0f);
  // A NULL entry contributes zeros and receives nothing.
  void* none[1] = {nullptr};
  EXPECT_STATUS(CO2_OK, co2_engine_reduce_gradients(e, none, 1, nullptr));
  EXPECT_STATUS(CO2_OK, co2_engine_reduce_gradients(e, grads, 1, nullptr));
  EXPECT_EQ(g[0], 2.0f);  // average over a world of one
  run_steps(e, 2);
}

TEST_F(BadInput, ConsensusArguments) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  const size_t n = params_.size();
  std::vector<float> out(n + 1, -9.0f);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, nullptr, n));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), 0));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), n - 1));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), n + 1));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_consensus(e, 2, out.data(), n));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_consensus(e, -1, out.data(), n));
  EXPECT_EQ(out[0], -9.0f);

  EXPECT_STATUS(CO2_OK, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), n));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], params_[i]) << i;
  EXPECT_EQ(out[n], -9.0f);  // nothing written past count
  EXPECT_STATUS(CO2_OK, co2_engine_consensus(e, CO2_CONSENSUS_LOCAL_AVERAGE, out.data(), n));
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(out[i], params_[i]) << i;
}

TEST_F(BadInput, ConsensusAnchorUnderLocalSgdIsUnsupported) {
  co2_engine_t e = committed_engine(CO2_ALGO_LOCALSGD);
  ASSERT_NE(e, nullptr);
  std::vector<float> out(params_.size());
  EXPECT_STATUS(CO2_ERR_UNSUPPORTED, co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), out.size()));
  EXPECT_STATUS(CO2_OK, co2_engine_consensus(e, CO2_CONSENSUS_LOCAL_AVERAGE, out.data(), out.size()));
}

TEST_F(BadInput, NumElementsAndStateSizeRejectNullOutputs) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_num_elements(e, nullptr));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_state_size(e, nullptr));
  size_t bytes = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_state_size(e, &bytes));
  EXPECT_GT(bytes, params_.size() * sizeof(float));
}

// ------------------------------------------------------------------------------------------
// Parameters and statistics
// ------------------------------------------------------------------------------------------

TEST_F(BadInput, SetParamBounds) {
  co2_engine_t e = committed_engine(CO2_ALGO_CO2, 4);
  ASSERT_NE(e, nullptr);
  struct Case {
    co2_param_t key;
    double value;
  };
  const Case invalid[] = {
      {CO2_PARAM_TAU, 0},          {CO2_PARAM_TAU, -1},         {CO2_PARAM_TAU, 2.5},
      {CO2_PARAM_TAU, kNaN},       {CO2_PARAM_TAU, kInf},       {CO2_PARAM_OUTER_LR, -0.5},
      {CO2_PARAM_OUTER_LR, kNaN},  {CO2_PARAM_OUTER_LR, kInf},  {CO2_PARAM_OUTER_MOMENTUM, 1.0},
      {CO2_PARAM_OUTER_MOMENTUM, -0.25}, {CO2_PARAM_OUTER_MOMENTUM, kNaN},
      {CO2_PARAM_CLIP_THRESHOLD, 0},     {CO2_PARAM_CLIP_THRESHOLD, -1},
      {CO2_PARAM_PENALTY_CONSTANT, 0},   {CO2_PARAM_PENALTY_CONSTANT, kNaN},
      {CO2_PARAM_INNER_LR, -1},          {CO2_PARAM_ANCHOR_CHECK_INTERVAL, -1},
      {CO2_PARAM_ANCHOR_CHECK_INTERVAL, 0.5},
  };
  for (const Case& c : invalid) {
    double before = -123, after = -456;
    ASSERT_OK(co2_engine_get_param(e, c.key, &before));
    EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_set_param(e, c.key, c.value))
        << "key " << c.key << " value " << c.value;
    ASSERT_OK(co2_engine_get_param(e, c.key, &after));
    EXPECT_EQ(before, after) << "a refused set_param changed key " << c.key;
  }
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_set_param(e, 7, 1.0));
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_set_param(e, -1, 1.0));
  double v = 42;
  EXPECT_STATUS(CO2_ERR_UNKNOWN_ENUM, co2_engine_get_param(e, 99, &v));
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_get_param(e, CO2_PARAM_TAU, nullptr));
  EXPECT_EQ(v, 42.0);

  // Valid values still go in and read back.
  EXPECT_STATUS(CO2_OK, co2_engine_set_param(e, CO2_PARAM_TAU, 2));
  EXPECT_STATUS(CO2_OK, co2_engine_get_param(e, CO2_PARAM_TAU, &v));
  EXPECT_EQ(v, 2.0);
  EXPECT_STATUS(CO2_OK, co2_engine_set_param(e, CO2_PARAM_OUTER_LR, 0.5));
  EXPECT_STATUS(CO2_OK, co2_engine_get_param(e, CO2_PARAM_OUTER_LR, &v));
  EXPECT_EQ(v, 0.5);
  run_steps(e, 8);
}

TEST_F(BadInput, GetStatsSizes) {
  co2_engine_t e = committed_engine(CO2_ALGO_CO2, 2);
  ASSERT_NE(e, nullptr);
  run_steps(e, 3);
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_get_stats(e, nullptr));
  co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
  stats.size = 0;
  stats.steps = 777;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_get_stats(e, &stats));
  EXPECT_EQ(stats.steps, 777u);
  stats.size = sizeof(size_t);
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_get_stats(e, &stats));
  EXPECT_EQ(stats.steps, 777u);

  // A larger struct from a newer header: only sizeof(co2_engine_stats_t) bytes are written.
  struct Newer {
    co2_engine_stats_t v1;
    unsigned char extra[32];
  } n;
  std::memset(&n, 0xCD, sizeof n);
  n.v1.size = sizeof n;
  n.v1.version = CO2_ABI_VERSION;
  EXPECT_STATUS(CO2_OK, co2_engine_get_stats(e, &n.v1));
  EXPECT_EQ(n.v1.steps, 3u);
  EXPECT_EQ(n.v1.rounds, 1u);
  EXPECT_EQ(n.v1.world_size, 1);
  for (unsigned char byte : n.extra) EXPECT_EQ(byte, 0xCD) << "wrote past the library's struct";

  // A 1.1 header from before outer_state_bytes: the field is not the caller's, so not written.
  co2_engine_stats_t older = CO2_ENGINE_STATS_INIT;
  older.size = offsetof(co2_engine_stats_t, outer_state_bytes);
  older.outer_state_bytes = 0xABCD;
  EXPECT_STATUS(CO2_OK, co2_engine_get_stats(e, &older));
  EXPECT_EQ(older.steps, 3u);
  EXPECT_EQ(older.size, offsetof(co2_engine_stats_t, outer_state_bytes));
  EXPECT_EQ(older.outer_state_bytes, 0xABCDu);
}

// ------------------------------------------------------------------------------------------
// Checkpoint
// ------------------------------------------------------------------------------------------

struct Blob {
  std::vector<unsigned char> bytes;
  size_t read_pos = 0;
  bool fail_write = false;
  bool fail_read = false;
};

int blob_write(void* user, const void* data, size_t length) {
  auto* b = static_cast<Blob*>(user);
  if (b->fail_write) return 1;
  const auto* p = static_cast<const unsigned char*>(data);
  b->bytes.insert(b->bytes.end(), p, p + length);
  return 0;
}

int blob_read(void* user, void* data, size_t length) {
  auto* b = static_cast<Blob*>(user);
  if (b->fail_read || b->read_pos + length > b->bytes.size()) return 1;
  std::memcpy(data, b->bytes.data() + b->read_pos, length);
  b->read_pos += length;
  return 0;
}

std::vector<float> anchor_of(co2_engine_t e, size_t n) {
  std::vector<float> out(n, -1.0f);
  EXPECT_EQ(co2_engine_consensus(e, CO2_CONSENSUS_ANCHOR, out.data(), n), CO2_OK)
      << co2_last_error_message();
  return out;
}

TEST_F(BadInput, SaveArguments) {
  co2_engine_t e = committed_engine();
  ASSERT_NE(e, nullptr);
  run_steps(e, 3);
  Blob blob;
  blob.fail_write = true;
  EXPECT_STATUS(CO2_ERR_CALLBACK, co2_engine_save(e, blob_write, &blob));
  // write = NULL: a rank that does not write. Fine.
  EXPECT_STATUS(CO2_OK, co2_engine_save(e, nullptr, nullptr));
  blob.fail_write = false;
  EXPECT_STATUS(CO2_OK, co2_engine_save(e, blob_write, &blob));
  size_t bytes = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_state_size(e, &bytes));
  EXPECT_EQ(blob.bytes.size(), bytes);
  // An engine that does not shard writes the same portable blob either way.
  Blob portable;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_portable_state_size(e, nullptr));
  EXPECT_STATUS(CO2_OK, co2_engine_save_portable(e, blob_write, &portable));
  EXPECT_EQ(portable.bytes, blob.bytes);
  EXPECT_STATUS(CO2_OK, co2_engine_portable_state_size(e, &bytes));
  EXPECT_EQ(portable.bytes.size(), bytes);
  run_steps(e, 2);
}

TEST_F(BadInput, LoadRejectsBadBlobsAndLeavesTheEngineAsItWas) {
  co2_engine_t e = committed_engine(CO2_ALGO_CO2, 2);
  ASSERT_NE(e, nullptr);
  const size_t n = params_.size();
  // Move the anchor away from the initial values: local steps, two boundaries.
  for (int s = 0; s < 4; ++s) {
    for (float& p : params_) p -= 0.125f;
    ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
  }
  Blob good;
  ASSERT_OK(co2_engine_save(e, blob_write, &good));
  ASSERT_GT(good.bytes.size(), 16u);

  // More training after the save, so that a wrongly successful load would be visible.
  for (int s = 0; s < 2; ++s) {
    for (float& p : params_) p -= 0.25f;
    ASSERT_OK(co2_engine_step(e, nullptr, nullptr));
  }
  const std::vector<float> anchor_before = anchor_of(e, n);
  co2_engine_stats_t stats_before = CO2_ENGINE_STATS_INIT;
  ASSERT_OK(co2_engine_get_stats(e, &stats_before));

  auto expect_unchanged = [&](const char* what) {
    EXPECT_EQ(anchor_of(e, n), anchor_before) << what;
    co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
    ASSERT_OK(co2_engine_get_stats(e, &stats));
    EXPECT_EQ(stats.rounds, stats_before.rounds) << what;
    EXPECT_EQ(stats.outer_updates, stats_before.outer_updates) << what;
  };

  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_load(e, nullptr, nullptr));
  expect_unchanged("NULL read");

  Blob failing = good;
  failing.fail_read = true;
  EXPECT_STATUS(CO2_ERR_CALLBACK, co2_engine_load(e, blob_read, &failing));
  expect_unchanged("read callback fails");

  Blob truncated = good;
  truncated.bytes.resize(good.bytes.size() / 2);
  co2_status_t s = co2_engine_load(e, blob_read, &truncated);
  EXPECT_TRUE(s == CO2_ERR_CALLBACK || s == CO2_ERR_CHECKPOINT_CORRUPT)
      << "truncated blob: " << co2_status_string(s);
  EXPECT_STRNE(co2_last_error_message(), "");
  expect_unchanged("truncated");

  Blob bad_magic = good;
  bad_magic.bytes[0] ^= 0xFF;
  EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, co2_engine_load(e, blob_read, &bad_magic));
  expect_unchanged("bad magic");

  // A bit flipped in the fp32 payload: the last byte before the trailing CRC (u32) and end
  // marker (8 bytes) belongs to the last float array of the last segment.
  Blob flipped = good;
  flipped.bytes[flipped.bytes.size() - 8 - 4 - 1] ^= 0x10;
  EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, co2_engine_load(e, blob_read, &flipped));
  expect_unchanged("flipped payload bit");

  Blob flipped_header = good;
  flipped_header.bytes[8 + 4 + 1] ^= 0x01;  // inside the header, after magic and version
  EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, co2_engine_load(e, blob_read, &flipped_header));
  expect_unchanged("flipped header bit");

  Blob flipped_last = good;
  flipped_last.bytes.back() ^= 0x01;  // the end marker
  EXPECT_STATUS(CO2_ERR_CHECKPOINT_CORRUPT, co2_engine_load(e, blob_read, &flipped_last));
  expect_unchanged("flipped last bit");

  Blob empty;
  s = co2_engine_load(e, blob_read, &empty);
  EXPECT_TRUE(s == CO2_ERR_CALLBACK || s == CO2_ERR_CHECKPOINT_CORRUPT) << co2_status_string(s);
  expect_unchanged("empty blob");

  // A valid blob from another layout.
  co2_engine_t other = make_engine(CO2_ALGO_CO2, 2);
  ASSERT_NE(other, nullptr);
  std::vector<float> other_params(n + 3, 0.5f);
  const co2_tensor_t t = tensor("w", other_params.data(), other_params.size());
  ASSERT_OK(co2_engine_register_tensor(other, &t));
  ASSERT_OK(co2_engine_commit(other));
  Blob foreign;
  ASSERT_OK(co2_engine_save(other, blob_write, &foreign));
  EXPECT_STATUS(CO2_ERR_CHECKPOINT_MISMATCH, co2_engine_load(e, blob_read, &foreign));
  expect_unchanged("other layout");

  // The good blob still loads, and the engine trains on.
  good.read_pos = 0;
  EXPECT_STATUS(CO2_OK, co2_engine_load(e, blob_read, &good));
  run_steps(e, 4);
}

// After an abort, the engine's next collective fails with CO2_ERR_ABORTED and the engine can
// still be destroyed.
TEST_F(BadInput, EngineAfterCommAbort) {
  co2_engine_t e = committed_engine(CO2_ALGO_CO2, 1);
  ASSERT_NE(e, nullptr);
  run_steps(e, 2);
  ASSERT_OK(co2_comm_abort(comm_));
  co2_status_t s = CO2_OK;
  for (int i = 0; i < 3 && s == CO2_OK; ++i) s = co2_engine_step(e, nullptr, nullptr);
  EXPECT_EQ(s, CO2_ERR_ABORTED) << co2_status_string(s) << ": " << co2_last_error_message();
  EXPECT_STRNE(co2_last_error_message(), "");
  // Stays failed.
  EXPECT_STATUS(CO2_ERR_ABORTED, co2_engine_synchronize(e));
  destroy(e);
}

}  // namespace

// ------------------------------------------------------------------------------------------
// Device allocator
// ------------------------------------------------------------------------------------------

namespace {
void* never_allocate(void*, size_t, int32_t, void*) { return nullptr; }
void never_release(void*, void*, size_t, int32_t, void*) {}
}  // namespace

TEST_F(BadInput, SetAllocator) {
  co2_allocator_t a = CO2_ALLOCATOR_INIT;
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_set_allocator(nullptr, &a));
  co2_engine_t e = make_engine();
  ASSERT_NE(e, nullptr);
  const co2_status_t plain = co2_engine_set_allocator(e, nullptr);  // back to cudaMalloc
  if (plain == CO2_ERR_UNSUPPORTED) return;  // a build without CUDA: nothing else to check
  EXPECT_STATUS(CO2_OK, plain);
  a.size = 0;
  EXPECT_STATUS(CO2_ERR_INVALID_CONFIG, co2_engine_set_allocator(e, &a));
  a = co2_allocator_t CO2_ALLOCATOR_INIT;
  a.allocate = never_allocate;  // release missing
  EXPECT_STATUS(CO2_ERR_INVALID_ARGUMENT, co2_engine_set_allocator(e, &a));
  a.release = never_release;
  EXPECT_STATUS(CO2_OK, co2_engine_set_allocator(e, &a));
  co2_engine_t committed = committed_engine();
  ASSERT_NE(committed, nullptr);
  EXPECT_STATUS(CO2_ERR_INVALID_STATE, co2_engine_set_allocator(committed, &a));
}

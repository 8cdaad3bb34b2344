// Pins the binary layout of ABI v1: sizeof/offsetof of every public struct (x86_64 / LP64
// values) and the numeric value of every enumerator and status code. A failure here means a
// change to co2.h broke binary compatibility with programs built against an earlier co2.h:
// add fields only at the end of a struct, never renumber, never reuse a value.
#include <co2/co2.h>

#include <gtest/gtest.h>

#include "capi/abi_v1.h"
#include "guard_page.h"

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

#if defined(__x86_64__) || defined(_M_X64)
#define CO2_ABI_PINNED 1
#else
#define CO2_ABI_PINNED 0
#endif

#define EXPECT_OFFSET(type, field, value) EXPECT_EQ(offsetof(type, field), size_t(value)) << #type "." #field
#define EXPECT_FIELD_SIZE(type, field, value) \
  EXPECT_EQ(sizeof(static_cast<type*>(nullptr)->field), size_t(value)) << #type "." #field

TEST(AbiLayout, StructsAreStandardLayoutPlainData) {
  EXPECT_TRUE(std::is_standard_layout<co2_comm_config_t>::value);
  EXPECT_TRUE(std::is_standard_layout<co2_unique_id_t>::value);
  EXPECT_TRUE(std::is_standard_layout<co2_engine_config_t>::value);
  EXPECT_TRUE(std::is_standard_layout<co2_tensor_t>::value);
  EXPECT_TRUE(std::is_standard_layout<co2_segment_t>::value);
  EXPECT_TRUE(std::is_standard_layout<co2_engine_stats_t>::value);
  EXPECT_TRUE(std::is_trivially_copyable<co2_engine_config_t>::value);
  EXPECT_TRUE(std::is_trivially_copyable<co2_engine_stats_t>::value);
}

TEST(AbiLayout, ScalarTypedefs) {
  EXPECT_TRUE((std::is_same<co2_status_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_dtype_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_device_kind_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_reduce_op_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_transport_kind_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_algorithm_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_penalty_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_clip_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_tensor_role_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_param_t, int32_t>::value));
  EXPECT_TRUE((std::is_same<co2_consensus_t, int32_t>::value));
  // Handles are pointers to incomplete structs.
  EXPECT_EQ(sizeof(co2_comm_t), sizeof(void*));
  EXPECT_EQ(sizeof(co2_engine_t), sizeof(void*));
  EXPECT_EQ(sizeof(co2_request_t), sizeof(void*));
}

TEST(AbiLayout, CommConfig) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_comm_config_t), 80u);  // 48 in 1.0 (CO2_COMM_CONFIG_V1_SIZE), 64 in 1.1
  EXPECT_EQ(alignof(co2_comm_config_t), 8u);
  EXPECT_OFFSET(co2_comm_config_t, size, 0);
  EXPECT_OFFSET(co2_comm_config_t, version, 8);
  EXPECT_OFFSET(co2_comm_config_t, transport, 12);
  EXPECT_OFFSET(co2_comm_config_t, rank, 16);
  EXPECT_OFFSET(co2_comm_config_t, world_size, 20);
  EXPECT_OFFSET(co2_comm_config_t, group_name, 24);
  EXPECT_OFFSET(co2_comm_config_t, timeout_ms, 32);
  EXPECT_OFFSET(co2_comm_config_t, reserved0, 36);
  EXPECT_OFFSET(co2_comm_config_t, chunk_bytes, 40);
  EXPECT_OFFSET(co2_comm_config_t, device_index, 48);  // 1.1
  EXPECT_OFFSET(co2_comm_config_t, reserved1, 52);
  EXPECT_OFFSET(co2_comm_config_t, node_id, 56);  // 1.1: co2_comm_split_nodes
  EXPECT_OFFSET(co2_comm_config_t, reserved2, 60);
  EXPECT_OFFSET(co2_comm_config_t, connections_per_peer, 64);  // 1.2: striped UCX connections
  EXPECT_OFFSET(co2_comm_config_t, reserved3, 68);
  EXPECT_OFFSET(co2_comm_config_t, elastic_min_ranks, 72);  // 1.2: elastic membership
  EXPECT_OFFSET(co2_comm_config_t, reserved4, 76);
  EXPECT_FIELD_SIZE(co2_comm_config_t, node_id, 4);
  EXPECT_FIELD_SIZE(co2_comm_config_t, size, 8);
  EXPECT_FIELD_SIZE(co2_comm_config_t, version, 4);
  EXPECT_FIELD_SIZE(co2_comm_config_t, timeout_ms, 4);
  EXPECT_FIELD_SIZE(co2_comm_config_t, chunk_bytes, 8);
}

TEST(AbiLayout, UniqueId) {
  EXPECT_EQ(CO2_UNIQUE_ID_BYTES, 128);
  EXPECT_EQ(sizeof(co2_unique_id_t), 128u);
  EXPECT_EQ(alignof(co2_unique_id_t), 1u);
  EXPECT_OFFSET(co2_unique_id_t, internal, 0);
}

TEST(AbiLayout, EngineConfig) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_engine_config_t), 120u);  // 112 in 1.1
  EXPECT_EQ(alignof(co2_engine_config_t), 8u);
  EXPECT_OFFSET(co2_engine_config_t, size, 0);
  EXPECT_OFFSET(co2_engine_config_t, version, 8);
  EXPECT_OFFSET(co2_engine_config_t, algorithm, 12);
  EXPECT_OFFSET(co2_engine_config_t, tau, 16);
  EXPECT_OFFSET(co2_engine_config_t, warmup_sync_rounds, 20);
  EXPECT_OFFSET(co2_engine_config_t, outer_lr, 24);
  EXPECT_OFFSET(co2_engine_config_t, outer_momentum, 32);
  EXPECT_OFFSET(co2_engine_config_t, nesterov, 40);
  EXPECT_OFFSET(co2_engine_config_t, penalty, 44);
  EXPECT_OFFSET(co2_engine_config_t, penalty_constant, 48);
  EXPECT_OFFSET(co2_engine_config_t, clip, 56);
  EXPECT_OFFSET(co2_engine_config_t, anchor_check_interval, 60);
  EXPECT_OFFSET(co2_engine_config_t, clip_threshold, 64);
  EXPECT_OFFSET(co2_engine_config_t, inner_lr, 72);
  EXPECT_OFFSET(co2_engine_config_t, state_dtype, 80);
  EXPECT_OFFSET(co2_engine_config_t, reserved0, 84);
  EXPECT_OFFSET(co2_engine_config_t, eager, 88);
  EXPECT_OFFSET(co2_engine_config_t, reserved1, 92);
  EXPECT_OFFSET(co2_engine_config_t, wire_format, 96);  // 1.1: compressed outer all-reduce
  EXPECT_OFFSET(co2_engine_config_t, error_feedback, 100);
  EXPECT_OFFSET(co2_engine_config_t, shard_outer_state, 104);  // 1.1: sharded outer state
  EXPECT_OFFSET(co2_engine_config_t, hierarchy, 108);  // 1.1: hierarchical co2
  EXPECT_OFFSET(co2_engine_config_t, apply_step, 112);  // 1.2: applying the average on arrival
  EXPECT_OFFSET(co2_engine_config_t, reserved2, 116);
  EXPECT_FIELD_SIZE(co2_engine_config_t, apply_step, 4);
  EXPECT_FIELD_SIZE(co2_engine_config_t, outer_lr, 8);
  EXPECT_FIELD_SIZE(co2_engine_config_t, tau, 4);
}

TEST(AbiLayout, Tensor) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_tensor_t), 48u);
  EXPECT_EQ(alignof(co2_tensor_t), 8u);
  EXPECT_OFFSET(co2_tensor_t, size, 0);
  EXPECT_OFFSET(co2_tensor_t, name, 8);
  EXPECT_OFFSET(co2_tensor_t, data, 16);
  EXPECT_OFFSET(co2_tensor_t, count, 24);
  EXPECT_OFFSET(co2_tensor_t, dtype, 32);
  EXPECT_OFFSET(co2_tensor_t, device, 36);
  EXPECT_OFFSET(co2_tensor_t, device_index, 40);
  EXPECT_OFFSET(co2_tensor_t, role, 44);
}

TEST(AbiLayout, Segment) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_segment_t), 40u);
  EXPECT_EQ(alignof(co2_segment_t), 8u);
  EXPECT_OFFSET(co2_segment_t, size, 0);
  EXPECT_OFFSET(co2_segment_t, name, 8);
  EXPECT_OFFSET(co2_segment_t, offset, 16);
  EXPECT_OFFSET(co2_segment_t, count, 24);
  EXPECT_OFFSET(co2_segment_t, role, 32);
  EXPECT_OFFSET(co2_segment_t, reserved0, 36);
}

TEST(AbiLayout, EngineStats) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_engine_stats_t), 248u);  // 232 in 1.1
  EXPECT_EQ(alignof(co2_engine_stats_t), 8u);
  EXPECT_OFFSET(co2_engine_stats_t, size, 0);
  EXPECT_OFFSET(co2_engine_stats_t, version, 8);
  EXPECT_OFFSET(co2_engine_stats_t, world_size, 12);
  EXPECT_OFFSET(co2_engine_stats_t, steps, 16);
  EXPECT_OFFSET(co2_engine_stats_t, rounds, 24);
  EXPECT_OFFSET(co2_engine_stats_t, outer_updates, 32);
  EXPECT_OFFSET(co2_engine_stats_t, bytes_reduced, 40);
  EXPECT_OFFSET(co2_engine_stats_t, collective_ns, 48);
  EXPECT_OFFSET(co2_engine_stats_t, boundary_wait_ns, 56);
  EXPECT_OFFSET(co2_engine_stats_t, last_boundary_wait_ns, 64);
  EXPECT_OFFSET(co2_engine_stats_t, nonfinite_rounds, 72);
  EXPECT_OFFSET(co2_engine_stats_t, nonfinite_local, 80);
  EXPECT_OFFSET(co2_engine_stats_t, anchor_checks, 88);
  EXPECT_OFFSET(co2_engine_stats_t, resolved_outer_momentum, 96);
  EXPECT_OFFSET(co2_engine_stats_t, last_penalty_min, 104);
  EXPECT_OFFSET(co2_engine_stats_t, last_penalty_max, 112);
  EXPECT_OFFSET(co2_engine_stats_t, last_clip_scale_min, 120);
  EXPECT_OFFSET(co2_engine_stats_t, last_clip_fraction, 128);
  EXPECT_OFFSET(co2_engine_stats_t, step_time_ns, 136);
  EXPECT_OFFSET(co2_engine_stats_t, allreduce_time_ns, 144);
  EXPECT_OFFSET(co2_engine_stats_t, advised_tau, 152);
  EXPECT_OFFSET(co2_engine_stats_t, reserved0, 156);
  // 1.1: observability
  EXPECT_OFFSET(co2_engine_stats_t, last_collective_ns, 160);
  EXPECT_OFFSET(co2_engine_stats_t, last_round_ns, 168);
  EXPECT_OFFSET(co2_engine_stats_t, hidden_fraction, 176);
  EXPECT_OFFSET(co2_engine_stats_t, last_hidden_fraction, 184);
  EXPECT_OFFSET(co2_engine_stats_t, rank_step_time_ns, 192);
  EXPECT_OFFSET(co2_engine_stats_t, rank_allreduce_time_ns, 200);
  EXPECT_OFFSET(co2_engine_stats_t, wire_bytes_last_round, 208);  // 1.1: compressed outer all-reduce
  EXPECT_OFFSET(co2_engine_stats_t, wire_bytes_total, 216);
  EXPECT_OFFSET(co2_engine_stats_t, outer_state_bytes, 224);  // 1.1: sharded outer state
  EXPECT_OFFSET(co2_engine_stats_t, arrival_updates, 232);  // 1.2: applying the average on arrival
  EXPECT_OFFSET(co2_engine_stats_t, last_apply_step, 240);
  EXPECT_OFFSET(co2_engine_stats_t, reserved1, 244);
  EXPECT_FIELD_SIZE(co2_engine_stats_t, arrival_updates, 8);
  EXPECT_FIELD_SIZE(co2_engine_stats_t, last_apply_step, 4);
}

TEST(AbiLayout, Allocator) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(sizeof(co2_allocator_t), 32u);
  EXPECT_OFFSET(co2_allocator_t, size, 0);
  EXPECT_OFFSET(co2_allocator_t, user, 8);
  EXPECT_OFFSET(co2_allocator_t, allocate, 16);
  EXPECT_OFFSET(co2_allocator_t, release, 24);
}

// The v1 sizes the library accepts as the least `size` (capi/abi_v1.h) are the first published
// layouts: they never change, and no struct is ever smaller than its v1 size.
TEST(AbiLayout, V1SizesArePinned) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  EXPECT_EQ(CO2_COMM_CONFIG_V1_SIZE, 48u);
  EXPECT_EQ(CO2_ENGINE_CONFIG_V1_SIZE, 88u);
  EXPECT_EQ(CO2_TENSOR_V1_SIZE, 48u);
  EXPECT_EQ(CO2_SEGMENT_V1_SIZE, 40u);
  EXPECT_EQ(CO2_ALLOCATOR_V1_SIZE, 32u);
  EXPECT_EQ(CO2_ENGINE_STATS_V1_SIZE, 136u);
  EXPECT_GE(sizeof(co2_comm_config_t), size_t(CO2_COMM_CONFIG_V1_SIZE));
  EXPECT_GE(sizeof(co2_engine_config_t), size_t(CO2_ENGINE_CONFIG_V1_SIZE));
  EXPECT_GE(sizeof(co2_tensor_t), size_t(CO2_TENSOR_V1_SIZE));
  EXPECT_GE(sizeof(co2_segment_t), size_t(CO2_SEGMENT_V1_SIZE));
  EXPECT_GE(sizeof(co2_allocator_t), size_t(CO2_ALLOCATOR_V1_SIZE));
  EXPECT_GE(sizeof(co2_engine_stats_t), size_t(CO2_ENGINE_STATS_V1_SIZE));
  // The first field after v1 starts where v1 ended.
  EXPECT_EQ(offsetof(co2_engine_stats_t, step_time_ns), size_t(CO2_ENGINE_STATS_V1_SIZE));
}

// A program built against the 1.1 header (CO2_ABI_VERSION 2) runs on this library: its engine
// config ends at `hierarchy` and its stats at `outer_state_bytes`. As abi_v1_test.c does for 1.0,
// the config sits flush against an inaccessible page and the stats right before a canary and
// one: reading (config) or writing (stats) a byte past the caller's struct crashes or fails here.
constexpr size_t kEngineConfigV2Size = 112;
constexpr size_t kEngineStatsV2Size = 232;

TEST(AbiLayout, V2CallerRunsOnThisLibrary) {
  if (!CO2_ABI_PINNED) GTEST_SKIP() << "layout values are pinned for x86_64 only";
  // 1.2's fields begin where 1.1's structs ended.
  EXPECT_EQ(offsetof(co2_engine_config_t, apply_step), kEngineConfigV2Size);
  EXPECT_EQ(offsetof(co2_engine_stats_t, arrival_updates), kEngineStatsV2Size);

  co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
  cc.transport = CO2_TRANSPORT_LOCAL;
  cc.group_name = "abi-layout-v2";
  co2_comm_t comm = nullptr;
  ASSERT_EQ(co2_comm_create(&cc, &comm), CO2_OK) << co2_last_error_message();

  co2_engine_config_t v2 = CO2_ENGINE_CONFIG_INIT;
  v2.size = kEngineConfigV2Size;
  v2.version = 2;
  v2.tau = 3;
  // diloco refuses any apply_step but the default at create: the create below passing is the
  // default taking the place of the field the caller does not have.
  v2.algorithm = CO2_ALGO_DILOCO;
  auto* config = static_cast<co2_engine_config_t*>(co2_flush_at_page_end(&v2, kEngineConfigV2Size));
  ASSERT_NE(config, nullptr);
  co2_engine_t engine = nullptr;
  ASSERT_EQ(co2_engine_create(comm, config, &engine), CO2_OK) << co2_last_error_message();
  float w[4] = {1, 2, 3, 4};
  co2_tensor_t t = CO2_TENSOR_INIT;
  t.name = "w";
  t.data = w;
  t.count = 4;
  EXPECT_EQ(co2_engine_register_tensor(engine, &t), CO2_OK) << co2_last_error_message();
  EXPECT_EQ(co2_engine_commit(engine), CO2_OK) << co2_last_error_message();
  for (int i = 0; i < 6; ++i) {
    w[0] -= 1.0f;
    EXPECT_EQ(co2_engine_step(engine, nullptr, nullptr), CO2_OK) << co2_last_error_message();
  }

  auto* stats = static_cast<co2_engine_stats_t*>(co2_at_page_end(kEngineStatsV2Size));
  ASSERT_NE(stats, nullptr);
  stats->size = kEngineStatsV2Size;
  stats->version = 2;
  EXPECT_EQ(co2_engine_get_stats(engine, stats), CO2_OK) << co2_last_error_message();
  EXPECT_TRUE(co2_canary_intact(stats, kEngineStatsV2Size)) << "wrote past the 1.1 caller's stats";
  EXPECT_EQ(stats->size, kEngineStatsV2Size);
  EXPECT_EQ(stats->version, uint32_t(CO2_ABI_VERSION));
  EXPECT_EQ(stats->steps, 6u);
  EXPECT_EQ(stats->rounds, 2u);
  EXPECT_GT(stats->outer_state_bytes, 0u) << "1.1's last field is the caller's: written";

  EXPECT_EQ(co2_engine_destroy(engine), CO2_OK);
  EXPECT_EQ(co2_comm_destroy(comm), CO2_OK);
}

// Every struct begins with `size`; every config/stats struct has `version` right after it.
TEST(AbiLayout, SizeFirst) {
  EXPECT_EQ(offsetof(co2_comm_config_t, size), 0u);
  EXPECT_EQ(offsetof(co2_engine_config_t, size), 0u);
  EXPECT_EQ(offsetof(co2_tensor_t, size), 0u);
  EXPECT_EQ(offsetof(co2_segment_t, size), 0u);
  EXPECT_EQ(offsetof(co2_engine_stats_t, size), 0u);
  EXPECT_EQ(offsetof(co2_allocator_t, size), 0u);
  EXPECT_EQ(offsetof(co2_comm_config_t, version), sizeof(size_t));
  EXPECT_EQ(offsetof(co2_engine_config_t, version), sizeof(size_t));
  EXPECT_EQ(offsetof(co2_engine_stats_t, version), sizeof(size_t));
}

TEST(AbiLayout, StatusValues) {
  EXPECT_EQ(CO2_OK, 0);
  EXPECT_EQ(CO2_ERR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(CO2_ERR_INVALID_STATE, 2);
  EXPECT_EQ(CO2_ERR_UNSUPPORTED, 3);
  EXPECT_EQ(CO2_ERR_INVALID_CONFIG, 4);
  EXPECT_EQ(CO2_ERR_UNKNOWN_ENUM, 5);
  EXPECT_EQ(CO2_ERR_DUPLICATE_TENSOR, 6);
  EXPECT_EQ(CO2_ERR_OUT_OF_MEMORY, 7);
  EXPECT_EQ(CO2_ERR_NONFINITE, 20);
  EXPECT_EQ(CO2_ERR_LAYOUT_MISMATCH, 21);
  EXPECT_EQ(CO2_ERR_ANCHOR_MISMATCH, 22);
  EXPECT_EQ(CO2_ERR_CHECKPOINT_CORRUPT, 23);
  EXPECT_EQ(CO2_ERR_CHECKPOINT_MISMATCH, 24);
  EXPECT_EQ(CO2_ERR_CALLBACK, 25);
  EXPECT_EQ(CO2_ERR_TIMEOUT, 40);
  EXPECT_EQ(CO2_ERR_PEER_LOST, 100);
  EXPECT_EQ(CO2_ERR_PEER_TIMEOUT, 101);
  EXPECT_EQ(CO2_ERR_COLLECTIVE_MISMATCH, 102);
  EXPECT_EQ(CO2_ERR_ABORTED, 103);
  EXPECT_EQ(CO2_ERR_TRANSPORT, 104);
  EXPECT_EQ(CO2_ERR_RENDEZVOUS, 105);
  EXPECT_EQ(CO2_ERR_INTERNAL, 199);
}

TEST(AbiLayout, EnumValues) {
  EXPECT_EQ(CO2_DTYPE_FP32, 0);
  EXPECT_EQ(CO2_DTYPE_BF16, 1);
  EXPECT_EQ(CO2_DTYPE_FP16, 2);
  EXPECT_EQ(CO2_DTYPE_FP64, 3);
  EXPECT_EQ(CO2_DTYPE_INT32, 4);
  EXPECT_EQ(CO2_DTYPE_INT64, 5);

  EXPECT_EQ(CO2_DEVICE_HOST, 0);
  EXPECT_EQ(CO2_DEVICE_CUDA, 1);

  EXPECT_EQ(CO2_REDUCE_SUM, 0);
  EXPECT_EQ(CO2_REDUCE_AVG, 1);
  EXPECT_EQ(CO2_REDUCE_MIN, 2);
  EXPECT_EQ(CO2_REDUCE_MAX, 3);

  EXPECT_EQ(CO2_TRANSPORT_AUTO, 0);
  EXPECT_EQ(CO2_TRANSPORT_LOCAL, 1);
  EXPECT_EQ(CO2_TRANSPORT_UCX, 2);
  EXPECT_EQ(CO2_TRANSPORT_NCCL, 3);

  EXPECT_EQ(CO2_ALGO_CO2, 0);
  EXPECT_EQ(CO2_ALGO_SYNC, 1);
  EXPECT_EQ(CO2_ALGO_LOCALSGD, 2);
  EXPECT_EQ(CO2_ALGO_DILOCO, 3);

  EXPECT_EQ(CO2_PENALTY_NONE, 0);
  EXPECT_EQ(CO2_PENALTY_CONSTANT, 1);
  EXPECT_EQ(CO2_PENALTY_GAP, 2);

  EXPECT_EQ(CO2_CLIP_NONE, 0);
  EXPECT_EQ(CO2_CLIP_VALUE, 1);
  EXPECT_EQ(CO2_CLIP_NORM, 2);

  EXPECT_EQ(CO2_ROLE_PARAMETER, 0);
  EXPECT_EQ(CO2_ROLE_BUFFER, 1);
  EXPECT_EQ(CO2_ROLE_EXCLUDED, 2);

  EXPECT_EQ(CO2_PARAM_OUTER_LR, 0);
  EXPECT_EQ(CO2_PARAM_OUTER_MOMENTUM, 1);
  EXPECT_EQ(CO2_PARAM_TAU, 2);
  EXPECT_EQ(CO2_PARAM_CLIP_THRESHOLD, 3);
  EXPECT_EQ(CO2_PARAM_PENALTY_CONSTANT, 4);
  EXPECT_EQ(CO2_PARAM_INNER_LR, 5);
  EXPECT_EQ(CO2_PARAM_ANCHOR_CHECK_INTERVAL, 6);

  EXPECT_EQ(CO2_CONSENSUS_ANCHOR, 0);
  EXPECT_EQ(CO2_CONSENSUS_LOCAL_AVERAGE, 1);
}

TEST(AbiLayout, PinnedConstants) {
  EXPECT_EQ(CO2_ABI_VERSION, 3);  // 1.1: three structs grew, 1.2: two (docs/capi.md, "The size rule")
  EXPECT_EQ(CO2_DEFAULT_TIMEOUT_MS, 300000u);
  EXPECT_EQ(CO2_DEFAULT_CHUNK_BYTES, uint64_t(1) << 20);
  EXPECT_EQ(CO2_DEVICE_INDEX_AUTO, -1);
  EXPECT_EQ(CO2_NODE_ID_AUTO, -1);
  EXPECT_EQ(CO2_DEFAULT_TAU, 12u);
  EXPECT_EQ(CO2_DEFAULT_OUTER_LR, 1.0);
  EXPECT_EQ(CO2_OUTER_MOMENTUM_AUTO, -1.0);
  EXPECT_EQ(CO2_DEFAULT_CLIP_THRESHOLD, 1.0);
  EXPECT_EQ(CO2_DEFAULT_ANCHOR_CHECK_INTERVAL, 100u);
  EXPECT_EQ(CO2_APPLY_AT_BOUNDARY, 0);
  EXPECT_EQ(CO2_APPLY_ON_ARRIVAL, -1);
  EXPECT_EQ(CO2_DEFAULT_APPLY_STEP, CO2_APPLY_AT_BOUNDARY);
}

}  // namespace

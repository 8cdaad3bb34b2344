// co2.h as a C++ user sees it. Used twice (tests/capi/meson.build):
//  - header_cpp_strict: compiled at test time alone with -std=c++11 and -std=c++17,
//    -pedantic -Wall -Wextra -Werror (no other include paths), so the header must be clean C++;
//  - header_cpp: built against libco2 and run: the INIT macros work as C++ aggregate
//    initialisers (also constexpr), the declarations have C linkage, and the functions resolve.
// co2.h comes first: it must be self-contained. No GoogleTest here, so that the strict compile
// needs nothing but the header.
#include <co2/co2.h>
#include <co2/co2.h>  // the include guard works

#include <cstdio>
#include <cstring>
#include <type_traits>

namespace {

int g_failures = 0;

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

// INIT macros are constant expressions in C++ too.
constexpr co2_comm_config_t kCommConfig = CO2_COMM_CONFIG_INIT;
constexpr co2_engine_config_t kEngineConfig = CO2_ENGINE_CONFIG_INIT;
constexpr co2_tensor_t kTensor = CO2_TENSOR_INIT;
constexpr co2_segment_t kSegment = CO2_SEGMENT_INIT;
constexpr co2_engine_stats_t kStats = CO2_ENGINE_STATS_INIT;

static_assert(kCommConfig.size == sizeof(co2_comm_config_t), "comm config size");
static_assert(kCommConfig.version == CO2_ABI_VERSION, "comm config version");
static_assert(kCommConfig.world_size == 1, "comm config world_size");
static_assert(kEngineConfig.size == sizeof(co2_engine_config_t), "engine config size");
static_assert(kEngineConfig.tau == CO2_DEFAULT_TAU, "engine config tau");
static_assert(kEngineConfig.outer_momentum == CO2_OUTER_MOMENTUM_AUTO, "engine momentum");
static_assert(kTensor.size == sizeof(co2_tensor_t), "tensor size");
static_assert(kTensor.role == CO2_ROLE_PARAMETER, "tensor role");
static_assert(kSegment.size == sizeof(co2_segment_t), "segment size");
static_assert(kStats.size == sizeof(co2_engine_stats_t), "stats size");
static_assert(kStats.version == CO2_ABI_VERSION, "stats version");

// The handles are distinct opaque pointer types.
static_assert(!std::is_same<co2_comm_t, co2_engine_t>::value, "distinct handle types");
static_assert(!std::is_same<co2_engine_t, co2_request_t>::value, "distinct handle types");
static_assert(std::is_pointer<co2_comm_t>::value, "handles are pointers");

// Function pointer types as a C++ binding would spell them.
using StepFn = co2_status_t (*)(co2_engine_t, void*, int*);
using StringFn = const char* (*)(co2_status_t);

}  // namespace

// C linkage: declaring with extern "C" again must agree with the header (a C++-linkage
// declaration in the header would conflict with this one and fail to compile).
extern "C" co2_status_t co2_engine_step(co2_engine_t engine, void* stream, int* out_boundary);
extern "C" const char* co2_status_string(co2_status_t status);

int main() {
  // Brace-initialisation in a local, then modification, as a C++ caller does.
  co2_comm_config_t comm = CO2_COMM_CONFIG_INIT;
  comm.transport = CO2_TRANSPORT_LOCAL;
  comm.group_name = "header_cpp";
  CHECK(comm.size == sizeof comm);
  CHECK(comm.timeout_ms == CO2_DEFAULT_TIMEOUT_MS);
  CHECK(comm.chunk_bytes == CO2_DEFAULT_CHUNK_BYTES);
  CHECK(comm.device_index == CO2_DEVICE_INDEX_AUTO);
  CHECK(comm.node_id == CO2_NODE_ID_AUTO);

  co2_engine_config_t engine = CO2_ENGINE_CONFIG_INIT;
  CHECK(engine.algorithm == CO2_ALGO_CO2);
  CHECK(engine.outer_lr == CO2_DEFAULT_OUTER_LR);
  CHECK(engine.clip_threshold == CO2_DEFAULT_CLIP_THRESHOLD);
  CHECK(engine.anchor_check_interval == CO2_DEFAULT_ANCHOR_CHECK_INTERVAL);
  CHECK(engine.state_dtype == CO2_DTYPE_FP32);

  // The init functions agree with the macros.
  co2_engine_config_t from_fn;
  std::memset(&from_fn, 0x5A, sizeof from_fn);
  CHECK(co2_engine_config_init(&from_fn) == CO2_OK);
  CHECK(from_fn.size == kEngineConfig.size);
  CHECK(from_fn.version == kEngineConfig.version);
  CHECK(from_fn.algorithm == kEngineConfig.algorithm);
  CHECK(from_fn.tau == kEngineConfig.tau);
  CHECK(from_fn.warmup_sync_rounds == kEngineConfig.warmup_sync_rounds);
  CHECK(from_fn.outer_lr == kEngineConfig.outer_lr);
  CHECK(from_fn.outer_momentum == kEngineConfig.outer_momentum);
  CHECK(from_fn.nesterov == kEngineConfig.nesterov);
  CHECK(from_fn.penalty == kEngineConfig.penalty);
  CHECK(from_fn.penalty_constant == kEngineConfig.penalty_constant);
  CHECK(from_fn.clip == kEngineConfig.clip);
  CHECK(from_fn.anchor_check_interval == kEngineConfig.anchor_check_interval);
  CHECK(from_fn.clip_threshold == kEngineConfig.clip_threshold);
  CHECK(from_fn.inner_lr == kEngineConfig.inner_lr);
  CHECK(from_fn.state_dtype == kEngineConfig.state_dtype);

  co2_comm_config_t comm_fn;
  std::memset(&comm_fn, 0x5A, sizeof comm_fn);
  CHECK(co2_comm_config_init(&comm_fn) == CO2_OK);
  CHECK(comm_fn.size == kCommConfig.size);
  CHECK(comm_fn.version == kCommConfig.version);
  CHECK(comm_fn.transport == kCommConfig.transport);
  CHECK(comm_fn.rank == kCommConfig.rank);
  CHECK(comm_fn.world_size == kCommConfig.world_size);
  CHECK(comm_fn.group_name == kCommConfig.group_name);
  CHECK(comm_fn.timeout_ms == kCommConfig.timeout_ms);
  CHECK(comm_fn.chunk_bytes == kCommConfig.chunk_bytes);

  // The structs without config fields: memcmp is exact, they have no padding (abi_layout pins
  // every offset).
  const co2_tensor_t tensor_macro = CO2_TENSOR_INIT;
  co2_tensor_t tensor_fn;
  std::memset(&tensor_fn, 0x5A, sizeof tensor_fn);
  CHECK(co2_tensor_init(&tensor_fn) == CO2_OK);
  CHECK(std::memcmp(&tensor_fn, &tensor_macro, sizeof tensor_fn) == 0);
  const co2_segment_t segment_macro = CO2_SEGMENT_INIT;
  co2_segment_t segment_fn;
  std::memset(&segment_fn, 0x5A, sizeof segment_fn);
  CHECK(co2_segment_init(&segment_fn) == CO2_OK);
  CHECK(std::memcmp(&segment_fn, &segment_macro, sizeof segment_fn) == 0);
  const co2_engine_stats_t stats_macro = CO2_ENGINE_STATS_INIT;
  co2_engine_stats_t stats_fn;
  std::memset(&stats_fn, 0x5A, sizeof stats_fn);
  CHECK(co2_engine_stats_init(&stats_fn) == CO2_OK);
  CHECK(std::memcmp(&stats_fn, &stats_macro, sizeof stats_fn) == 0);

  StepFn step = &co2_engine_step;
  StringFn str = &co2_status_string;
  CHECK(step != nullptr);
  CHECK(str(CO2_OK) != nullptr);
  // A NULL engine is refused, not dereferenced.
  int boundary = 7;
  CHECK(step(nullptr, nullptr, &boundary) == CO2_ERR_INVALID_ARGUMENT);
  CHECK(boundary == 7);

  int major = -1, minor = -1, patch = -1;
  CHECK(co2_get_version(&major, &minor, &patch) == CO2_OK);
  CHECK(major == CO2_VERSION_MAJOR);
  CHECK(minor == CO2_VERSION_MINOR);
  CHECK(patch == CO2_VERSION_PATCH);

  if (g_failures != 0) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("header_cpp: all checks passed\n");
  return 0;
}

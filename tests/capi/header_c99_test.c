/*
 * co2.h as a C99 user sees it. This file is used twice (tests/capi/meson.build):
 *  - header_c99_strict: the compiler is run on it at test time with
 *    -std=c99 -pedantic -Wall -Wextra -Werror (and a few more warnings), so a header that is not
 *    clean C99 fails a test instead of breaking everybody's build;
 *  - header_c99: it is built against libco2 and run: every INIT macro yields the documented
 *    defaults and agrees with the matching init function, and the C linkage works.
 * co2.h must come first: it has to be self-contained.
 */
#include <co2/co2.h>
#include <co2/co2.h> /* the include guard works */

#include <stdio.h>
#include <string.h>

/* Compile-time checks in plain C99 (negative array size on failure). */
typedef char co2_check_status_is_32bit[sizeof(co2_status_t) == 4 ? 1 : -1];
typedef char co2_check_size_first[offsetof(co2_engine_config_t, size) == 0 ? 1 : -1];
typedef char co2_check_unique_id[sizeof(co2_unique_id_t) == CO2_UNIQUE_ID_BYTES ? 1 : -1];

/* INIT macros as static initialisers (constant expressions in C). */
static const co2_comm_config_t g_comm_config = CO2_COMM_CONFIG_INIT;
static const co2_engine_config_t g_engine_config = CO2_ENGINE_CONFIG_INIT;

static int g_failures = 0;

#define CHECK(cond)                                                           \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                     \
        }                                                                     \
    } while (0)

static void check_comm_config(const co2_comm_config_t *c) {
    CHECK(c->size == sizeof(co2_comm_config_t));
    CHECK(c->version == CO2_ABI_VERSION);
    CHECK(c->transport == CO2_TRANSPORT_AUTO);
    CHECK(c->rank == 0);
    CHECK(c->world_size == 1);
    CHECK(c->group_name == NULL);
    CHECK(c->timeout_ms == CO2_DEFAULT_TIMEOUT_MS);
    CHECK(c->reserved0 == 0);
    CHECK(c->chunk_bytes == CO2_DEFAULT_CHUNK_BYTES);
    CHECK(c->device_index == CO2_DEVICE_INDEX_AUTO);
    CHECK(c->node_id == CO2_NODE_ID_AUTO);
}

static void check_engine_config(const co2_engine_config_t *c) {
    CHECK(c->size == sizeof(co2_engine_config_t));
    CHECK(c->version == CO2_ABI_VERSION);
    CHECK(c->algorithm == CO2_ALGO_CO2);
    CHECK(c->tau == CO2_DEFAULT_TAU);
    CHECK(c->warmup_sync_rounds == 0);
    CHECK(c->outer_lr == CO2_DEFAULT_OUTER_LR);
    CHECK(c->outer_momentum == CO2_OUTER_MOMENTUM_AUTO);
    CHECK(c->nesterov == 0);
    CHECK(c->penalty == CO2_PENALTY_NONE);
    CHECK(c->penalty_constant == 1.0);
    CHECK(c->clip == CO2_CLIP_NONE);
    CHECK(c->anchor_check_interval == CO2_DEFAULT_ANCHOR_CHECK_INTERVAL);
    CHECK(c->clip_threshold == CO2_DEFAULT_CLIP_THRESHOLD);
    CHECK(c->inner_lr == 0.0);
    CHECK(c->state_dtype == CO2_DTYPE_FP32);
    CHECK(c->reserved0 == 0);
}

int main(void) {
    co2_comm_config_t comm_config = CO2_COMM_CONFIG_INIT;
    co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
    co2_tensor_t tensor = CO2_TENSOR_INIT;
    co2_segment_t segment = CO2_SEGMENT_INIT;
    co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
    co2_comm_config_t from_fn;
    co2_engine_config_t engine_from_fn;
    int major = -1, minor = -1, patch = -1;

    check_comm_config(&comm_config);
    check_comm_config(&g_comm_config);
    check_engine_config(&engine_config);
    check_engine_config(&g_engine_config);

    CHECK(tensor.size == sizeof(co2_tensor_t));
    CHECK(tensor.name == NULL);
    CHECK(tensor.data == NULL);
    CHECK(tensor.count == 0);
    CHECK(tensor.dtype == CO2_DTYPE_FP32);
    CHECK(tensor.device == CO2_DEVICE_HOST);
    CHECK(tensor.device_index == 0);
    CHECK(tensor.role == CO2_ROLE_PARAMETER);

    CHECK(segment.size == sizeof(co2_segment_t));
    CHECK(segment.name == NULL);
    CHECK(segment.offset == 0);
    CHECK(segment.count == 0);
    CHECK(segment.role == CO2_ROLE_PARAMETER);
    CHECK(segment.reserved0 == 0);

    CHECK(stats.size == sizeof(co2_engine_stats_t));
    CHECK(stats.version == CO2_ABI_VERSION);
    CHECK(stats.steps == 0);
    CHECK(stats.last_clip_fraction == 0.0);

    /* The init functions produce what the macros produce (garbage in first). */
    memset(&from_fn, 0xA5, sizeof from_fn);
    CHECK(co2_comm_config_init(&from_fn) == CO2_OK);
    check_comm_config(&from_fn);
    memset(&engine_from_fn, 0xA5, sizeof engine_from_fn);
    CHECK(co2_engine_config_init(&engine_from_fn) == CO2_OK);
    check_engine_config(&engine_from_fn);

    /* C linkage: the symbols resolve and behave. */
    CHECK(co2_get_version(&major, &minor, &patch) == CO2_OK);
    CHECK(major == CO2_VERSION_MAJOR && minor == CO2_VERSION_MINOR && patch == CO2_VERSION_PATCH);
    CHECK(co2_status_string(CO2_OK) != NULL);
    CHECK(co2_last_error_message() != NULL);

    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("header_c99: all checks passed\n");
    return 0;
}

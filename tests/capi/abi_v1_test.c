/* A program built against the first published co2.h runs on this library (docs/capi.md, "The
 * size rule"). The v1 layouts are declared here, not taken from co2.h, so that this file keeps
 * testing the oldest callers however the header grows. Each struct sits at the very end of a
 * readable page, right before an inaccessible one (guard_page.h): reading or writing one byte
 * past the caller's struct crashes the test. */
#define _DEFAULT_SOURCE /* mmap flags under -std=c99 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "capi/abi_v1.h"
#include "co2/co2.h"
#include "guard_page.h"

typedef struct {
    size_t size;
    uint32_t version;
    int32_t transport, rank, world_size;
    const char *group_name;
    uint32_t timeout_ms, reserved0;
    uint64_t chunk_bytes;
} comm_config_v1;

typedef struct {
    size_t size;
    uint32_t version;
    int32_t algorithm;
    uint32_t tau, warmup_sync_rounds;
    double outer_lr, outer_momentum;
    int32_t nesterov, penalty;
    double penalty_constant;
    int32_t clip;
    uint32_t anchor_check_interval;
    double clip_threshold, inner_lr;
    int32_t state_dtype, reserved0;
} engine_config_v1;

typedef struct {
    size_t size;
    uint32_t version;
    int32_t world_size;
    uint64_t steps, rounds, outer_updates, bytes_reduced, collective_ns, boundary_wait_ns,
        last_boundary_wait_ns, nonfinite_rounds, nonfinite_local, anchor_checks;
    double resolved_outer_momentum, last_penalty_min, last_penalty_max, last_clip_scale_min,
        last_clip_fraction;
} engine_stats_v1;

typedef char comm_config_is_v1[sizeof(comm_config_v1) == CO2_COMM_CONFIG_V1_SIZE ? 1 : -1];
typedef char engine_config_is_v1[sizeof(engine_config_v1) == CO2_ENGINE_CONFIG_V1_SIZE ? 1 : -1];
typedef char engine_stats_is_v1[sizeof(engine_stats_v1) == CO2_ENGINE_STATS_V1_SIZE ? 1 : -1];

static int failures = 0;
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "abi_v1_test:%d: %s failed (%s)\n", __LINE__, #cond,       \
                    co2_last_error_message());                                         \
            ++failures;                                                                \
        }                                                                              \
    } while (0)

int main(void) {
    /* A v1 communicator config: accepted, its fields honoured. */
    comm_config_v1 cc;
    memset(&cc, 0, sizeof cc);
    cc.size = sizeof cc;
    cc.version = 1;
    cc.transport = CO2_TRANSPORT_LOCAL;
    cc.rank = 0;
    cc.world_size = 1;
    cc.group_name = "abi-v1";
    cc.timeout_ms = CO2_DEFAULT_TIMEOUT_MS;
    cc.chunk_bytes = CO2_DEFAULT_CHUNK_BYTES;
    comm_config_v1 *ccp = co2_flush_at_page_end(&cc, sizeof cc);
    CHECK(ccp != NULL);
    if (!ccp) return 1;
    co2_comm_t comm = NULL;
    CHECK(co2_comm_create((const co2_comm_config_t *)ccp, &comm) == CO2_OK);
    if (!comm) return 1;

    /* A v1 engine config: accepted; v1 fields honoured, later fields take their defaults. */
    engine_config_v1 ec;
    memset(&ec, 0, sizeof ec);
    ec.size = sizeof ec;
    ec.version = 1;
    ec.algorithm = CO2_ALGO_CO2;
    ec.tau = 5;
    ec.outer_lr = 0.75;
    ec.outer_momentum = 0.25;
    ec.penalty_constant = 1.0;
    ec.anchor_check_interval = 7;
    ec.clip_threshold = 2.0;
    ec.state_dtype = CO2_DTYPE_FP32;
    engine_config_v1 *ecp = co2_flush_at_page_end(&ec, sizeof ec);
    CHECK(ecp != NULL);
    if (!ecp) return 1;
    co2_engine_t engine = NULL;
    CHECK(co2_engine_create(comm, (const co2_engine_config_t *)ecp, &engine) == CO2_OK);
    if (!engine) return 1;
    double value = 0;
    CHECK(co2_engine_get_param(engine, CO2_PARAM_TAU, &value) == CO2_OK && value == 5.0);
    CHECK(co2_engine_get_param(engine, CO2_PARAM_OUTER_LR, &value) == CO2_OK && value == 0.75);
    CHECK(co2_engine_get_param(engine, CO2_PARAM_OUTER_MOMENTUM, &value) == CO2_OK && value == 0.25);
    CHECK(co2_engine_get_param(engine, CO2_PARAM_CLIP_THRESHOLD, &value) == CO2_OK && value == 2.0);
    CHECK(co2_engine_get_param(engine, CO2_PARAM_ANCHOR_CHECK_INTERVAL, &value) == CO2_OK && value == 7.0);
    /* Fields added after v1 are checked here against their defaults as they are added. */
    /* 1.1 eager: observable at the first boundary (nothing has arrived, W = 1): the parameters
     * restart from the anchor (delayed) or from the anchor minus alpha times the round's delta. */
    const int eager_default = CO2_DEFAULT_EAGER;

    float w[4] = {1, 2, 3, 4};
    co2_tensor_t t = CO2_TENSOR_INIT;
    t.name = "w";
    t.data = w;
    t.count = 4;
    CHECK(co2_engine_register_tensor(engine, &t) == CO2_OK);
    CHECK(co2_engine_commit(engine) == CO2_OK);
    for (int i = 0; i < 5; ++i) {
        w[0] -= 1.0f;  /* the round's delta on w[0]: 5 */
        CHECK(co2_engine_step(engine, NULL, NULL) == CO2_OK);
    }
    CHECK(w[0] == (eager_default ? 1.0f - 0.75f * 5.0f : 1.0f));

    /* v1 stats: written up to the v1 size and not a byte further. */
    engine_stats_v1 *stats = co2_at_page_end(sizeof *stats);
    CHECK(stats != NULL);
    if (!stats) return 1;
    stats->size = sizeof *stats;
    CHECK(co2_engine_get_stats(engine, (co2_engine_stats_t *)stats) == CO2_OK);
    CHECK(co2_canary_intact(stats, sizeof *stats));
    CHECK(stats->size == CO2_ENGINE_STATS_V1_SIZE);
    CHECK(stats->version == CO2_ABI_VERSION);
    CHECK(stats->world_size == 1);
    CHECK(stats->steps == 5);
    CHECK(stats->rounds == 1);
    CHECK(stats->resolved_outer_momentum == 0.25);

    /* Below the v1 size: CO2_ERR_INVALID_CONFIG naming the struct and both sizes. */
    char expected[32];
    ecp->size = CO2_ENGINE_CONFIG_V1_SIZE - 8;
    co2_engine_t refused = NULL;
    CHECK(co2_engine_create(comm, (const co2_engine_config_t *)ecp, &refused) == CO2_ERR_INVALID_CONFIG);
    CHECK(refused == NULL);
    CHECK(strstr(co2_last_error_message(), "co2_engine_config_t") != NULL);
    snprintf(expected, sizeof expected, "%zu", CO2_ENGINE_CONFIG_V1_SIZE - 8);
    CHECK(strstr(co2_last_error_message(), expected) != NULL);
    snprintf(expected, sizeof expected, "%zu", CO2_ENGINE_CONFIG_V1_SIZE);
    CHECK(strstr(co2_last_error_message(), expected) != NULL);
    ccp->size = CO2_COMM_CONFIG_V1_SIZE - 8;
    co2_comm_t refused_comm = NULL;
    CHECK(co2_comm_create((const co2_comm_config_t *)ccp, &refused_comm) == CO2_ERR_INVALID_CONFIG);
    CHECK(strstr(co2_last_error_message(), "co2_comm_config_t") != NULL);
    memset(stats, 0, sizeof *stats);
    stats->size = CO2_ENGINE_STATS_V1_SIZE - 8;
    CHECK(co2_engine_get_stats(engine, (co2_engine_stats_t *)stats) == CO2_ERR_INVALID_CONFIG);
    CHECK(strstr(co2_last_error_message(), "co2_engine_stats_t") != NULL);
    CHECK(stats->steps == 0); /* nothing written on failure */

    CHECK(co2_engine_destroy(engine) == CO2_OK);
    CHECK(co2_comm_destroy(comm) == CO2_OK);
    if (failures) return 1;
    printf("abi_v1_test: v1 structs accepted, stats written up to %zu bytes\n", CO2_ENGINE_STATS_V1_SIZE);
    return 0;
}

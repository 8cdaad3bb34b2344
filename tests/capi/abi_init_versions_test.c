/* The init functions of the structs that grew in 1.2 exist once per layout (capi/capi.cpp, "The
 * init functions"; capi/libco2.map). A binary linked before 1.2 is bound to co2_*_init@CO2_1:
 * this file binds those symbols explicitly, as such a binary's references are, and checks that
 * they write 1.1's layout and not one byte more (each struct sits right before an inaccessible
 * page, with a canary), while the default symbols (what a program linked today gets) write the
 * current layout. */
#define _DEFAULT_SOURCE /* mmap flags under -std=c99 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "co2/co2.h"
#include "guard_page.h"

/* The references a binary linked against 1.1's libco2 carries. */
__asm__(".symver init_comm_config_1_1, co2_comm_config_init@CO2_1");
__asm__(".symver init_engine_config_1_1, co2_engine_config_init@CO2_1");
__asm__(".symver init_engine_stats_1_1, co2_engine_stats_init@CO2_1");
co2_status_t init_comm_config_1_1(void *config);
co2_status_t init_engine_config_1_1(void *config);
co2_status_t init_engine_stats_1_1(void *stats);

/* 1.1's sizes: where the first field added in 1.2 begins. */
#define COMM_CONFIG_1_1 offsetof(co2_comm_config_t, connections_per_peer)
#define ENGINE_CONFIG_1_1 offsetof(co2_engine_config_t, apply_step)
#define ENGINE_STATS_1_1 offsetof(co2_engine_stats_t, arrival_updates)

static int failures = 0;
#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "abi_init_versions_test:%d: %s failed\n", __LINE__, #cond); \
            ++failures;                                                          \
        }                                                                        \
    } while (0)

int main(void) {
    CHECK(COMM_CONFIG_1_1 == 64 && ENGINE_CONFIG_1_1 == 112 && ENGINE_STATS_1_1 == 232);

    /* 1.1 callers: 1.1's bytes, size and ABI version 2, the 1.1 defaults. */
    co2_comm_config_t *comm = (co2_comm_config_t *)co2_at_page_end(COMM_CONFIG_1_1);
    CHECK(comm != NULL);
    CHECK(init_comm_config_1_1(comm) == CO2_OK);
    CHECK(comm->size == COMM_CONFIG_1_1 && comm->version == 2);
    CHECK(comm->timeout_ms == CO2_DEFAULT_TIMEOUT_MS && comm->world_size == 1);
    CHECK(comm->device_index == CO2_DEVICE_INDEX_AUTO && comm->node_id == CO2_NODE_ID_AUTO);
    CHECK(co2_canary_intact(comm, COMM_CONFIG_1_1));

    co2_engine_config_t *engine = (co2_engine_config_t *)co2_at_page_end(ENGINE_CONFIG_1_1);
    CHECK(engine != NULL);
    CHECK(init_engine_config_1_1(engine) == CO2_OK);
    CHECK(engine->size == ENGINE_CONFIG_1_1 && engine->version == 2);
    CHECK(engine->algorithm == CO2_ALGO_CO2 && engine->tau == CO2_DEFAULT_TAU);
    CHECK(co2_canary_intact(engine, ENGINE_CONFIG_1_1));

    co2_engine_stats_t *stats = (co2_engine_stats_t *)co2_at_page_end(ENGINE_STATS_1_1);
    CHECK(stats != NULL);
    CHECK(init_engine_stats_1_1(stats) == CO2_OK);
    CHECK(stats->size == ENGINE_STATS_1_1 && stats->version == 2);
    CHECK(co2_canary_intact(stats, ENGINE_STATS_1_1));

    CHECK(init_comm_config_1_1(NULL) == CO2_ERR_INVALID_ARGUMENT);

    /* A program linked today: the whole current struct, equal to the macro. */
    co2_comm_config_t *now = (co2_comm_config_t *)co2_at_page_end(sizeof(co2_comm_config_t));
    const co2_comm_config_t macro = CO2_COMM_CONFIG_INIT;
    CHECK(now != NULL);
    CHECK(co2_comm_config_init(now) == CO2_OK);
    CHECK(memcmp(now, &macro, sizeof macro) == 0);
    CHECK(co2_canary_intact(now, sizeof(co2_comm_config_t)));
    co2_engine_stats_t *stats_now = (co2_engine_stats_t *)co2_at_page_end(sizeof(co2_engine_stats_t));
    CHECK(stats_now != NULL);
    CHECK(co2_engine_stats_init(stats_now) == CO2_OK);
    CHECK(stats_now->size == sizeof(co2_engine_stats_t) && stats_now->version == CO2_ABI_VERSION);

    /* The 1.1 config is accepted by the library as it is (its size, version 2). */
    co2_engine_config_t *config = (co2_engine_config_t *)co2_at_page_end(sizeof(co2_engine_config_t));
    CHECK(config != NULL);
    CHECK(co2_engine_config_init(config) == CO2_OK);
    CHECK(config->size == sizeof(co2_engine_config_t) && config->version == CO2_ABI_VERSION);

    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else printf("the 1.1 init symbols write 1.1's layouts; the default ones the current layouts\n");
    return failures ? 1 : 0;
}

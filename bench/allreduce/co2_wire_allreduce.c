/* The outer all-reduce of an engine per wire format (fp32, bf16, int8, fp4), through the public C
 * API: a diloco engine with tau = 1 runs one blocking outer average of the whole model per step,
 * so the engine's collective time per round is one all-reduce of the model in that format,
 * encoding and decoding included. One process per rank, launched like any co2 program (co2run,
 * or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): transport AUTO picks UCX.
 *   co2run --nproc-per-node W co2_wire_allreduce FORMAT [MIN_MIB MAX_MIB]
 * Columns (rank 0): fp32 bytes of the model, seconds per all-reduce, GB/s of payload (the bytes
 * in the wire format, count x its bytes per value), GB/s of fp32 equivalent (count x 4), bytes
 * this rank sent per all-reduce. Same stopping rule as co2_allreduce.c. */
#define _POSIX_C_SOURCE 200809L
#include "co2_bench.h"

#include <string.h>

int main(int argc, char **argv) {
    co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
    co2_comm_t comm;
    int32_t rank, world;
    size_t mib, min_mib = 1, max_mib = 64;
    int wire;
    double payload_bytes_per_value;
    if (argc < 2) {
        fprintf(stderr, "usage: %s fp32|bf16|int8|fp4 [MIN_MIB MAX_MIB]\n", argv[0]);
        return 2;
    }
    if (strcmp(argv[1], "fp32") == 0) {
        wire = CO2_WIRE_FP32, payload_bytes_per_value = 4.0;
    } else if (strcmp(argv[1], "bf16") == 0) {
        wire = CO2_WIRE_BF16, payload_bytes_per_value = 2.0;
    } else if (strcmp(argv[1], "int8") == 0) {
        wire = CO2_WIRE_INT8, payload_bytes_per_value = 1.0 + 4.0 / 128.0;
    } else if (strcmp(argv[1], "fp4") == 0) {
        wire = CO2_WIRE_FP4, payload_bytes_per_value = 0.5 + 4.0 / 64.0;
    } else {
        fprintf(stderr, "unknown wire format '%s'\n", argv[1]);
        return 2;
    }
    if (argc >= 4) {
        min_mib = (size_t)atol(argv[2]);
        max_mib = (size_t)atol(argv[3]);
    }
    CHECK(co2_comm_create(&config, &comm));
    CHECK(co2_comm_rank(comm, &rank));
    CHECK(co2_comm_size(comm, &world));
    if (rank == 0)
        printf("# tool co2-%s ranks %d\n# fp32_bytes seconds payload_GBps fp32eq_GBps wire_bytes_sent\n",
               argv[1], world);
    for (mib = min_mib; mib <= max_mib; mib *= 4) {
        const size_t bytes = mib << 20, count = bytes / sizeof(float);
        co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
        co2_engine_t engine;
        co2_segment_t segment = CO2_SEGMENT_INIT;
        co2_engine_stats_t before = CO2_ENGINE_STATS_INIT, after = CO2_ENGINE_STATS_INIT;
        void *flat;
        float *params;
        double start, elapsed = 0.0, seconds;
        int32_t done = 0;
        int iters = 0;
        size_t i;
        ec.algorithm = CO2_ALGO_DILOCO;
        ec.tau = 1;
        ec.outer_momentum = 0.0;
        ec.anchor_check_interval = 0;
        ec.wire_format = wire;
        CHECK(co2_engine_create(comm, &ec, &engine));
        CHECK(co2_engine_alloc_flat(engine, count, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
        params = flat;
        for (i = 0; i < count; ++i) params[i] = (float)(i % 1000) * 1e-3f;
        segment.name = "model";
        segment.count = count;
        CHECK(co2_engine_add_segment(engine, &segment));
        CHECK(co2_engine_commit(engine));
        /* A local step: a small, rank-dependent change, so that the deltas are not zero. */
        for (i = 0; i < count; ++i) params[i] -= (float)(rank + 1) * 1e-4f * (float)((i % 7) + 1);
        CHECK(co2_engine_step(engine, NULL, NULL)); /* warm-up */
        CHECK(co2_engine_get_stats(engine, &before));
        start = now();
        while (!done) {
            for (i = 0; i < count; i += 64) params[i] -= 1e-5f * (float)(rank + 1);
            CHECK(co2_engine_step(engine, NULL, NULL));
            ++iters;
            elapsed = now() - start;
            done = rank == 0 && iters >= MIN_ITERS && elapsed >= MIN_SECONDS;
            allreduce(comm, &done, 1, CO2_DTYPE_INT32, CO2_REDUCE_MAX);
        }
        CHECK(co2_engine_get_stats(engine, &after));
        /* The all-reduce itself (submit to completion), slowest rank. */
        seconds = (double)(after.collective_ns - before.collective_ns) / 1e9 / (double)iters;
        allreduce(comm, &seconds, 1, CO2_DTYPE_FP64, CO2_REDUCE_MAX);
        if (rank == 0)
            printf("%zu %.6f %.3f %.3f %llu\n", bytes, seconds,
                   (double)count * payload_bytes_per_value / seconds / 1e9, (double)bytes / seconds / 1e9,
                   (unsigned long long)after.wire_bytes_last_round);
        fflush(stdout);
        CHECK(co2_engine_destroy(engine));
    }
    CHECK(co2_comm_destroy(comm));
    return 0;
}

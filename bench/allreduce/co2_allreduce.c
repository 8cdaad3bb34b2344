/* co2's all-reduce bandwidth through the public C API, one process per rank, launched like any
 * co2 program (co2run, or by hand with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): transport AUTO
 * picks UCX. Same sizes, stopping rule and columns as mpi_allreduce.c and gloo_allreduce.py.
 *   co2run --nproc-per-node W co2_allreduce [MIN_MIB MAX_MIB [CHUNK_BYTES]]  */
#define _POSIX_C_SOURCE 200809L
#include "co2_bench.h"

int main(int argc, char **argv) {
    co2_comm_config_t config = CO2_COMM_CONFIG_INIT;
    co2_comm_t comm;
    int32_t rank, world;
    size_t mib, min_mib = 1, max_mib = 256;
    if (argc >= 3) {
        min_mib = (size_t)atol(argv[1]);
        max_mib = (size_t)atol(argv[2]);
    }
    if (argc >= 4) config.chunk_bytes = (uint64_t)atoll(argv[3]);
    CHECK(co2_comm_create(&config, &comm));
    CHECK(co2_comm_rank(comm, &rank));
    CHECK(co2_comm_size(comm, &world));
    if (rank == 0) printf("# tool co2 ranks %d\n# bytes seconds algbw_GBps busbw_GBps cpu_seconds\n", world);
    for (mib = min_mib; mib <= max_mib; mib *= 4) {
        const size_t bytes = mib << 20, count = bytes / sizeof(float);
        float *buffer = malloc(bytes);
        double start, elapsed = 0.0, cpu_start, cpu;
        int32_t done = 0;
        int iters = 0;
        size_t i;
        for (i = 0; i < count; ++i) buffer[i] = (float)(rank + 1) * 1e-3f;
        allreduce(comm, buffer, count, CO2_DTYPE_FP32, CO2_REDUCE_SUM); /* warm-up */
        start = now();
        cpu_start = cpu_now();
        while (!done) {
            allreduce(comm, buffer, count, CO2_DTYPE_FP32, CO2_REDUCE_SUM);
            ++iters;
            elapsed = now() - start;
            /* every rank must agree on when to stop: rank 0 decides */
            done = rank == 0 && iters >= MIN_ITERS && elapsed >= MIN_SECONDS;
            allreduce(comm, &done, 1, CO2_DTYPE_INT32, CO2_REDUCE_MAX);
        }
        elapsed /= iters;
        cpu = (cpu_now() - cpu_start) / iters;
        allreduce(comm, &elapsed, 1, CO2_DTYPE_FP64, CO2_REDUCE_MAX);
        allreduce(comm, &cpu, 1, CO2_DTYPE_FP64, CO2_REDUCE_SUM);
        if (rank == 0)
            printf("%zu %.6f %.3f %.3f %.6f\n", bytes, elapsed, (double)bytes / elapsed / 1e9,
                   2.0 * (world - 1) / world * (double)bytes / elapsed / 1e9, cpu / world);
        fflush(stdout);
        free(buffer);
    }
    CHECK(co2_comm_destroy(comm));
    return 0;
}

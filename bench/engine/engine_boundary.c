/* Host time of one engine boundary through the public API, at W = 1 (the local transport: the
 * all-reduce is a copy), so that the engine's own work is what is measured: the wait for the
 * prepared update, the apply pass, the submission, the round logic around them. Built against
 * the installed header only, so that two libco2 builds can be compared side by side in one run
 * (LD_LIBRARY_PATH=<build> ./engine_boundary), e.g. before and after an engine refactor:
 *
 *   bash bench/engine/compare.sh <old-build-dir> <new-build-dir>
 *
 * Prints one line per (algorithm, N): median and minimum microseconds per boundary step. */
#define _POSIX_C_SOURCE 199309L
#include <string.h>

#include "../allreduce/co2_bench.h" /* check, CHECK, now */

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median and minimum seconds per boundary over `boundaries` boundaries at tau = 1. */
static void measure(co2_comm_t comm, co2_algorithm_t algorithm, int eager, size_t n, int boundaries,
                    double *median, double *minimum) {
    co2_engine_config_t config = CO2_ENGINE_CONFIG_INIT;
    config.algorithm = algorithm;
    config.tau = 1;
    config.eager = eager;
    config.outer_momentum = 0.5;
    config.anchor_check_interval = 0;
    co2_engine_t engine;
    CHECK(co2_engine_create(comm, &config, &engine));
    void *flat;
    CHECK(co2_engine_alloc_flat(engine, n, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
    co2_segment_t segment = CO2_SEGMENT_INIT;
    segment.name = "all";
    segment.count = n;
    CHECK(co2_engine_add_segment(engine, &segment));
    CHECK(co2_engine_commit(engine));
    float *p = (float *)flat;
    double *times = (double *)malloc(sizeof(double) * (size_t)boundaries);
    for (int b = -3; b < boundaries; ++b) { /* 3 warm-up boundaries */
        for (size_t i = 0; i < n; i += 1024) p[i] += 1e-3f; /* a local step that touches the state */
        const double start = now();
        CHECK(co2_engine_step(engine, NULL, NULL));
        if (b >= 0) times[b] = now() - start;
    }
    CHECK(co2_engine_finalize(engine));
    CHECK(co2_engine_destroy(engine));
    qsort(times, (size_t)boundaries, sizeof(double), by_value);
    *median = times[boundaries / 2];
    *minimum = times[0];
    free(times);
}

int main(int argc, char **argv) {
    const int boundaries = argc > 1 ? atoi(argv[1]) : 30;
    co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
    cc.transport = CO2_TRANSPORT_LOCAL;
    cc.group_name = "engine-boundary-bench";
    co2_comm_t comm;
    CHECK(co2_comm_create(&cc, &comm));
    const size_t sizes[] = {(size_t)1 << 20, (size_t)16 << 20};
    static const struct {
        const char *name;
        co2_algorithm_t algorithm;
        int eager;
    } kinds[] = {{"co2", CO2_ALGO_CO2, 0}, {"co2-eager", CO2_ALGO_CO2, 1}, {"diloco", CO2_ALGO_DILOCO, 0}};
    printf("%-10s %10s %12s %12s\n", "algorithm", "N", "median_us", "min_us");
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k)
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
            double median, minimum;
            measure(comm, kinds[k].algorithm, kinds[k].eager, sizes[s], boundaries, &median, &minimum);
            printf("%-10s %10zu %12.1f %12.1f\n", kinds[k].name, sizes[s], 1e6 * median, 1e6 * minimum);
            fflush(stdout);
        }
    CHECK(co2_comm_destroy(comm));
    return 0;
}

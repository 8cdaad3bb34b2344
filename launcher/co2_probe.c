/* co2-probe: what a user runs on a new cluster before a long job (`co2run ... --probe`). Across
 * the launched group, it times the engine's outer all-reduce of a model of --params fp32 values
 * in each wire format (encoding and decoding included: a diloco engine with tau = 1 averages
 * the whole model at every step), and prints, for a training step of --step-ms, the smallest
 * tau that hides each all-reduce (tau * step >= all-reduce, the tau advisor's rule) and the
 * first format, in the order fp32, bf16, int8, fp4 (most to least exact), that hides behind
 * --tau steps. Through the public C API only; launched like any co2 program. */
#define _POSIX_C_SOURCE 200809L
#include <co2/co2.h>

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long the probe waits for its own small all-reduces (the slowest rank's time) before it
 * gives up: far beyond any round of a model that fits in memory. */
#define PROBE_WAIT_TIMEOUT_MS 600000
#define DEFAULT_ROUNDS 5
#define MAX_ROUNDS 1000

static const struct {
    const char *name;
    co2_wire_format_t wire;
} kFormats[] = {{"fp32", CO2_WIRE_FP32}, {"bf16", CO2_WIRE_BF16}, {"int8", CO2_WIRE_INT8}, {"fp4", CO2_WIRE_FP4}};
enum { kFormatCount = sizeof(kFormats) / sizeof(kFormats[0]) };

static const char kUsage[] =
    "usage: co2run [CO2RUN OPTIONS] --probe --params N --step-ms T [--tau K] [--rounds R]\n"
    "       (or co2-probe with the same options, under any launcher)\n"
    "\n"
    "Times the outer all-reduce of N fp32 parameters in each wire format across the launched\n"
    "ranks and prints the tau that hides each behind training steps of T ms, and the first\n"
    "format (fp32, bf16, int8, fp4) that hides behind K steps.\n"
    "\n"
    "  --params N     parameters of the model (suffixes k, M, G: 124M); each rank holds about\n"
    "                 5 x 4 N bytes while it runs\n"
    "  --step-ms T    one training step (forward, backward, optimizer), in milliseconds\n"
    "  --tau K        the tau you would like to train with (default %u, the library's)\n"
    "  --rounds R     all-reduces timed per format, the median is reported (default %d)\n"
    "  --formats F    a comma-separated subset of fp32,bf16,int8,fp4 (default all)\n";

static void usage_error(const char *message, const char *value) {
    fprintf(stderr, "co2-probe: error: %s%s%s%s\n", message, value ? " '" : "", value ? value : "", value ? "'" : "");
    fprintf(stderr, "run 'co2-probe --help' for the options\n");
    exit(2);
}

static void check(co2_status_t status, const char *call) {
    if (status == CO2_OK) return;
    fprintf(stderr, "co2-probe: %s: %s: %s\n", call, co2_status_string(status), co2_last_error_message());
    exit(1);
}
#define CHECK(call) check((call), #call)

/* "124M", "1.5G", "4096" -> a count; 0 for text that is not one. */
static uint64_t parse_count(const char *text) {
    char *end = NULL;
    double value, scale = 1.0;
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text || !isfinite(value) || value <= 0) return 0;
    if (*end == 'k' || *end == 'K') scale = 1e3, ++end;
    else if (*end == 'm' || *end == 'M') scale = 1e6, ++end;
    else if (*end == 'g' || *end == 'G') scale = 1e9, ++end;
    if (*end != '\0' || value * scale >= 9e15) return 0;
    return (uint64_t)llround(value * scale);
}

static double parse_positive(const char *text, const char *flag) {
    char *end = NULL;
    double value;
    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value <= 0) usage_error(flag, text);
    return value;
}

/* The slowest rank's value (every rank gets it). */
static double slowest(co2_comm_t comm, double value) {
    co2_request_t request;
    CHECK(co2_allreduce(comm, &value, 1, CO2_DTYPE_FP64, CO2_REDUCE_MAX, NULL, &request));
    CHECK(co2_request_wait(request, PROBE_WAIT_TIMEOUT_MS));
    CHECK(co2_request_free(request));
    return value;
}

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median all-reduce of `count` values in `wire`, in seconds (the slowest rank's of each
 * round), and the bytes this rank sent in one. */
static double time_allreduce(co2_comm_t comm, co2_wire_format_t wire, uint64_t count, int rounds, int rank,
                             uint64_t *sent) {
    co2_engine_config_t config = CO2_ENGINE_CONFIG_INIT;
    co2_segment_t segment = CO2_SEGMENT_INIT;
    co2_engine_t engine;
    co2_engine_stats_t stats = CO2_ENGINE_STATS_INIT;
    double seconds[MAX_ROUNDS], median;
    uint64_t before, i;
    void *flat;
    float *params;
    int round;
    config.algorithm = CO2_ALGO_DILOCO;
    config.tau = 1;
    config.outer_momentum = 0.0;
    config.anchor_check_interval = 0;
    config.wire_format = wire;
    CHECK(co2_engine_create(comm, &config, &engine));
    CHECK(co2_engine_alloc_flat(engine, count, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
    params = flat;
    for (i = 0; i < count; ++i) params[i] = (float)(i % 1000) * 1e-3f;
    segment.name = "model";
    segment.count = count;
    CHECK(co2_engine_add_segment(engine, &segment));
    CHECK(co2_engine_commit(engine));
    /* One untimed round first (connections, page faults); every round a small rank-dependent
     * change, so that the deltas are not zero and the groups' scales are not degenerate. */
    for (round = -1; round < rounds; ++round) {
        for (i = 0; i < count; ++i) params[i] -= (float)(rank + 1) * 1e-4f * (float)((i + (uint64_t)round) % 7 + 1);
        CHECK(co2_engine_get_stats(engine, &stats));
        before = stats.collective_ns;
        CHECK(co2_engine_step(engine, NULL, NULL));
        CHECK(co2_engine_get_stats(engine, &stats));
        if (round >= 0) seconds[round] = slowest(comm, (double)(stats.collective_ns - before) / 1e9);
    }
    *sent = stats.wire_bytes_last_round;
    CHECK(co2_engine_destroy(engine));
    qsort(seconds, (size_t)rounds, sizeof(double), compare_doubles);
    median = rounds % 2 ? seconds[rounds / 2] : 0.5 * (seconds[rounds / 2 - 1] + seconds[rounds / 2]);
    return median;
}

/* The smallest tau with tau * step >= allreduce (runtime/engine/tau_advisor.hpp's rule). */
static uint64_t tau_to_hide(double allreduce_s, double step_s) {
    const double tau = ceil(allreduce_s / step_s - 1e-12);
    return tau < 1 ? 1 : (uint64_t)tau;
}

int main(int argc, char **argv) {
    static const struct option options[] = {{"params", required_argument, NULL, 'p'},
                                            {"step-ms", required_argument, NULL, 's'},
                                            {"tau", required_argument, NULL, 't'},
                                            {"rounds", required_argument, NULL, 'r'},
                                            {"formats", required_argument, NULL, 'f'},
                                            {"help", no_argument, NULL, 'h'},
                                            {NULL, 0, NULL, 0}};
    co2_comm_config_t comm_config = CO2_COMM_CONFIG_INIT;
    co2_comm_t comm;
    uint64_t count = 0, tau = CO2_DEFAULT_TAU, hide[kFormatCount], sent[kFormatCount];
    double step_s = 0.0, allreduce_s[kFormatCount];
    int rounds = DEFAULT_ROUNDS, wanted[kFormatCount] = {1, 1, 1, 1}, option, f, advice = -1;
    int32_t rank, world;
    opterr = 0;
    while ((option = getopt_long(argc, argv, "+:h", options, NULL)) != -1) {
        switch (option) {
            case 'p':
                count = parse_count(optarg);
                if (count == 0) usage_error("--params wants a positive count (124M, 1.5G, 4096), not", optarg);
                break;
            case 's': step_s = parse_positive(optarg, "--step-ms wants positive milliseconds, not") / 1e3; break;
            case 't':
                tau = (uint64_t)parse_positive(optarg, "--tau wants a positive integer, not");
                if ((double)tau != strtod(optarg, NULL) || tau > 1000000) usage_error("--tau wants an integer in [1, 1e6], not", optarg);
                break;
            case 'r':
                rounds = (int)parse_positive(optarg, "--rounds wants an integer in [1, 1000], not");
                if ((double)rounds != strtod(optarg, NULL) || rounds > MAX_ROUNDS)
                    usage_error("--rounds wants an integer in [1, 1000], not", optarg);
                break;
            case 'f': {
                char *copy = strdup(optarg), *name, *save = NULL;
                memset(wanted, 0, sizeof(wanted));
                for (name = strtok_r(copy, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
                    for (f = 0; f < kFormatCount && strcmp(name, kFormats[f].name) != 0; ++f) {}
                    if (f == kFormatCount) usage_error("--formats: not one of fp32, bf16, int8, fp4:", name);
                    wanted[f] = 1;
                }
                free(copy);
                break;
            }
            case 'h': printf(kUsage, CO2_DEFAULT_TAU, DEFAULT_ROUNDS); return 0;
            case ':': usage_error("an option needs a value:", argv[optind - 1]); break;
            default: usage_error("unknown option", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_error("unexpected argument", argv[optind]);
    if (count == 0) usage_error("--params is required (the model's parameter count)", NULL);
    if (step_s == 0.0) usage_error("--step-ms is required (one training step, in milliseconds)", NULL);

    CHECK(co2_comm_create(&comm_config, &comm));
    CHECK(co2_comm_rank(comm, &rank));
    CHECK(co2_comm_size(comm, &world));
    if (rank == 0) {
        printf("co2 probe: %d ranks, %llu parameters (%.1f MB in fp32), step %.1f ms, median of %d all-reduces\n",
               world, (unsigned long long)count, (double)count * 4.0 / 1e6, step_s * 1e3, rounds);
        printf("%-6s %14s %14s %12s %12s\n", "format", "sent/rank MB", "all-reduce ms", "fp32eq GB/s", "tau to hide");
        fflush(stdout);
    }
    for (f = 0; f < kFormatCount; ++f) {
        if (!wanted[f]) continue;
        allreduce_s[f] = time_allreduce(comm, kFormats[f].wire, count, rounds, rank, &sent[f]);
        hide[f] = tau_to_hide(allreduce_s[f], step_s);
        if (advice < 0 && hide[f] <= tau) advice = f;
        if (rank == 0) {
            printf("%-6s %14.2f %14.2f %12.3f %12llu\n", kFormats[f].name, (double)sent[f] / 1e6, allreduce_s[f] * 1e3,
                   (double)count * 4.0 / allreduce_s[f] / 1e9, (unsigned long long)hide[f]);
            fflush(stdout);
        }
    }
    if (rank == 0) {
        if (world == 1) {
            printf("advice: one rank sends nothing; every format hides (launch the ranks you will train with)\n");
        } else if (advice >= 0) {
            printf("advice: tau %llu with wire format %s (the most exact format whose all-reduce hides behind "
                   "%llu steps of %.1f ms)\n",
                   (unsigned long long)tau, kFormats[advice].name, (unsigned long long)tau, step_s * 1e3);
        } else {
            int last = -1;
            for (f = 0; f < kFormatCount; ++f)
                if (wanted[f] && (last < 0 || hide[f] < hide[last])) last = f;
            printf("advice: no format hides behind %llu steps; the fewest are %llu steps with %s (tau %llu), or a "
                   "faster link\n",
                   (unsigned long long)tau, (unsigned long long)hide[last], kFormats[last].name,
                   (unsigned long long)hide[last]);
        }
    }
    CHECK(co2_comm_destroy(comm));
    return 0;
}

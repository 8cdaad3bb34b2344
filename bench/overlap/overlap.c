/*
 * overlap — throughput of one training loop under an algorithm, against the same loop without
 * communication. One JSON line per rank on stdout; bench/overlap/run.py turns them into tables.
 *
 * The "training step" is either
 *   wait: a timed wait of --step-us microseconds (deadline-based). This is what a GPU step looks
 *         like to the host: the CPU is free while the device computes, so the progress thread
 *         that runs the collectives gets the cores. The primary model here (2 shared cores).
 *   burn: --burn-iters iterations of a dependent floating-point chain on this thread (a fixed
 *         amount of CPU work; --calibrate-burn US prints the count that takes US alone). Here
 *         compute and communication compete for the same cores: the secondary model.
 * Each step also writes a few parameters (so deltas are not zero) and, under sync, hands the
 * full gradient to co2_engine_reduce_gradients (blocking, like DDP without bucketing). Under
 * --hierarchy nodes (hierarchical co2) the same per-step call averages the gradient inside the
 * node, as the engine requires; it is part of the measured step. Every rank writes the same
 * parameters, so a node's ranks stay equal as hierarchical co2 checks.
 *
 * Ranks: --mode threads runs --world ranks as threads on the in-process local transport, whose
 * link model (--bandwidth bytes/s per directed link, CO2_LOCAL_TEST_BANDWIDTH) stands in for a
 * network; --mode process is one rank of a multi-process group, RANK / WORLD_SIZE (and
 * MASTER_ADDR / MASTER_PORT for the transport) from the environment, transport AUTO.
 * --algo none is the compute-only reference: the same loop, no engine, no communicator.
 *
 * Exit status: 0 ok, 1 failure, 2 bad arguments, 77 the requested transport is not built.
 */
#define _POSIX_C_SOURCE 200809L
#include <co2/co2.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum work_kind { WORK_WAIT, WORK_BURN };
enum rank_mode { MODE_THREADS, MODE_PROCESS };

struct options {
    enum rank_mode mode;
    int world;
    const char *algo_name;
    int algo; /* -1 = none */
    uint32_t tau;
    size_t params;
    int64_t step_us;
    enum work_kind work;
    uint64_t burn_iters;
    int64_t steps;
    int64_t warmup_steps;
    double bandwidth; /* threads mode: bytes/s per link, 0 = unlimited */
    uint32_t timeout_ms;
    int wire_format; /* co2_wire_format_t of the outer all-reduce */
    int error_feedback;
    int shard_outer_state; /* co2_engine_config_t.shard_outer_state */
    int hierarchy;         /* CO2_HIERARCHY_FLAT / NODES; NODES: nodes from GROUP_RANK (process
                              mode) or --ranks-per-node (threads mode) */
    int ranks_per_node;    /* threads mode with --hierarchy nodes: node id = rank / this */
};

struct rank_result {
    int ok;
    double seconds;
    int64_t measured_steps;
    co2_engine_stats_t stats;
    double burn_sink;
    double engine_seconds; /* inside co2_engine_* calls during the measured steps */
    int64_t boundaries;    /* measured steps that were boundaries */
    double late_seconds;   /* wait work: how late the timed waits woke, summed (CPU contention) */
};

static void usage(void) {
    fprintf(stderr,
            "usage: overlap --algo none|sync|localsgd|diloco|co2 [--tau T] [--params N]\n"
            "               [--step-us US] [--work wait|burn] [--burn-iters K]\n"
            "               [--steps S] [--warmup-steps S0]\n"
            "               [--mode threads|process] [--world W] [--bandwidth BYTES_PER_S]\n"
            "               [--timeout-ms MS] [--wire-format fp32|bf16|int8] [--no-error-feedback]\n"
            "               [--shard] [--hierarchy flat|nodes] [--ranks-per-node L]\n"
            "       overlap --calibrate-burn US\n");
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Returns how late it woke (ns): on 2 shared cores, what the progress threads cost a waiting
 * training thread. */
static int64_t sleep_until_ns(int64_t deadline) {
    struct timespec ts;
    ts.tv_sec = deadline / 1000000000;
    ts.tv_nsec = deadline % 1000000000;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    return now_ns() - deadline;
}

/* A dependent chain the compiler cannot shorten: iters multiply-adds. */
static double burn(uint64_t iters, double seed) {
    double x = seed;
    for (uint64_t i = 0; i < iters; ++i) x = x * 0.999999999 + 1e-9;
    return x;
}

static uint64_t calibrate_burn(int64_t us) {
    uint64_t iters = 1u << 16;
    double sink = 0.0;
    for (;;) { /* grow until one run takes >= 50 ms, then scale */
        const int64_t t0 = now_ns();
        sink += burn(iters, 1.0 + sink * 1e-30);
        const int64_t dt = now_ns() - t0;
        if (dt >= 50000000 || iters >= ((uint64_t)1 << 40)) {
            /* best of three at this size, for a quiet-machine figure */
            int64_t best = dt;
            for (int r = 0; r < 2; ++r) {
                const int64_t t1 = now_ns();
                sink += burn(iters, 1.0 + sink * 1e-30);
                const int64_t d = now_ns() - t1;
                if (d < best) best = d;
            }
            if (sink == 42.0) fprintf(stderr, " ");
            return (uint64_t)((double)iters * (double)us * 1000.0 / (double)best);
        }
        iters *= 2;
    }
}

static int parse_algo(const char *name) {
    if (strcmp(name, "none") == 0) return -1;
    if (strcmp(name, "sync") == 0) return CO2_ALGO_SYNC;
    if (strcmp(name, "localsgd") == 0) return CO2_ALGO_LOCALSGD;
    if (strcmp(name, "diloco") == 0) return CO2_ALGO_DILOCO;
    if (strcmp(name, "co2") == 0) return CO2_ALGO_CO2;
    return -2;
}

static int parse_i64(const char *text, int64_t min, int64_t max, int64_t *out) {
    char *end = NULL;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0' || v < min || v > max) return 0;
    *out = v;
    return 1;
}

static int check(co2_status_t status, const char *what, int rank) {
    if (status == CO2_OK) return 1;
    fprintf(stderr, "overlap: rank %d: %s: %s: %s\n", rank, what, co2_status_string(status),
            co2_last_error_message());
    return 0;
}

/* One step of the model: the work, then a write to a few parameters. Returns the wait's
 * lateness (ns; 0 for burn work). */
static int64_t model_step(const struct options *o, float *params, int64_t step, int64_t start_ns,
                          double *sink) {
    int64_t late = 0;
    if (o->work == WORK_WAIT)
        late = sleep_until_ns(start_ns + o->step_us * 1000);
    else
        *sink += burn(o->burn_iters, 1.0 + (double)step * 1e-12);
    for (size_t i = 0; i < 16 && i < o->params; ++i) params[(size_t)(step * 16 + (int64_t)i) % o->params] += 1e-3f;
    return late;
}

/* The loop. comm == NULL: compute only. */
static int train(const struct options *o, co2_comm_t comm, int rank, struct rank_result *out) {
    co2_engine_t engine = NULL;
    float *params = NULL;
    float *grad = NULL;
    int ok = 0;
    if (comm) {
        co2_engine_config_t cfg = CO2_ENGINE_CONFIG_INIT;
        co2_segment_t seg = CO2_SEGMENT_INIT;
        void *flat = NULL;
        cfg.algorithm = o->algo;
        cfg.tau = o->algo == CO2_ALGO_SYNC ? 1 : o->tau;
        cfg.wire_format = o->wire_format;
        cfg.error_feedback = o->error_feedback;
        cfg.shard_outer_state = o->shard_outer_state;
        cfg.hierarchy = o->hierarchy;
        if (!check(co2_engine_create(comm, &cfg, &engine), "co2_engine_create", rank)) goto done;
        if (!check(co2_engine_alloc_flat(engine, o->params, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat),
                   "co2_engine_alloc_flat", rank))
            goto done;
        params = flat;
        seg.name = "model";
        seg.count = o->params;
        if (!check(co2_engine_add_segment(engine, &seg), "co2_engine_add_segment", rank)) goto done;
        if (!check(co2_engine_commit(engine), "co2_engine_commit", rank)) goto done;
        if (o->algo == CO2_ALGO_SYNC || o->hierarchy == CO2_HIERARCHY_NODES) {
            grad = malloc(o->params * sizeof(float));
            if (!grad) {
                fprintf(stderr, "overlap: rank %d: out of memory for the gradient\n", rank);
                goto done;
            }
            for (size_t i = 0; i < o->params; ++i) grad[i] = 1e-3f * (float)(rank + 1);
        }
    } else {
        params = calloc(o->params, sizeof(float));
        if (!params) {
            fprintf(stderr, "overlap: rank %d: out of memory for the parameters\n", rank);
            goto done;
        }
    }
    {
        double sink = 0.0;
        int64_t t_measure = now_ns(), engine_ns = 0, late_ns = 0;
        for (int64_t step = 0; step < o->steps; ++step) {
            if (step == o->warmup_steps) {
                t_measure = now_ns();
                engine_ns = 0;
                late_ns = 0;
                out->boundaries = 0;
            }
            late_ns += model_step(o, params, step, now_ns(), &sink);
            if (engine) {
                const int64_t t0 = now_ns();
                int boundary = 0;
                if (grad) {
                    void *grads[1] = {grad};
                    if (!check(co2_engine_reduce_gradients(engine, grads, 1, NULL),
                               "co2_engine_reduce_gradients", rank))
                        goto done;
                }
                if (!check(co2_engine_step(engine, NULL, &boundary), "co2_engine_step", rank)) goto done;
                engine_ns += now_ns() - t0;
                out->boundaries += boundary;
            }
        }
        out->engine_seconds = (double)engine_ns / 1e9;
        out->late_seconds = (double)late_ns / 1e9;
        out->seconds = (double)(now_ns() - t_measure) / 1e9;
        out->measured_steps = o->steps - o->warmup_steps;
        out->burn_sink = sink;
    }
    if (engine) {
        co2_engine_stats_t st = CO2_ENGINE_STATS_INIT;
        if (!check(co2_engine_get_stats(engine, &st), "co2_engine_get_stats", rank)) goto done;
        out->stats = st;
        if (!check(co2_engine_finalize(engine), "co2_engine_finalize", rank)) goto done;
    }
    ok = 1;
done:
    if (engine) co2_engine_destroy(engine);
    if (!comm) free(params);
    free(grad);
    out->ok = ok;
    return ok;
}

static void print_result(const struct options *o, int rank, int world, const struct rank_result *r) {
    const co2_engine_stats_t *s = &r->stats;
    const double allreduces =
        s->bytes_reduced && o->params ? (double)s->bytes_reduced / ((double)o->params * 4.0) : 0.0;
    printf("{\"rank\": %d, \"world\": %d, \"algo\": \"%s\", \"tau\": %u, \"params\": %zu, "
           "\"work\": \"%s\", \"step_us\": %lld, \"burn_iters\": %llu, \"steps\": %lld, "
           "\"seconds\": %.6f, \"steps_per_s\": %.4f, \"boundary_wait_ms\": %.3f, "
           "\"collective_ms\": %.3f, \"allreduces\": %.0f, \"step_time_ms\": %.4f, "
           "\"allreduce_time_ms\": %.4f, \"advised_tau\": %u, \"engine_ms\": %.3f, "
           "\"boundaries\": %lld, \"late_ms\": %.3f, \"wire_bytes_per_round\": %llu, "
           "\"shard\": %d, \"hierarchy\": \"%s\", \"outer_state_bytes\": %llu}\n",
           rank, world, o->algo_name, o->algo == CO2_ALGO_SYNC ? 1u : o->tau, o->params,
           o->work == WORK_WAIT ? "wait" : "burn", (long long)o->step_us,
           (unsigned long long)o->burn_iters, (long long)r->measured_steps, r->seconds,
           r->seconds > 0 ? (double)r->measured_steps / r->seconds : 0.0,
           (double)s->boundary_wait_ns / 1e6, (double)s->collective_ns / 1e6, allreduces,
           (double)s->step_time_ns / 1e6, (double)s->allreduce_time_ns / 1e6, s->advised_tau,
           r->engine_seconds * 1e3, (long long)r->boundaries, r->late_seconds * 1e3,
           (unsigned long long)s->wire_bytes_last_round, o->shard_outer_state,
           o->hierarchy == CO2_HIERARCHY_NODES ? "nodes" : "flat",
           (unsigned long long)s->outer_state_bytes);
    fflush(stdout);
}

struct thread_arg {
    const struct options *o;
    int rank;
    char group[64];
    struct rank_result result;
};

static void *rank_thread(void *p) {
    struct thread_arg *a = p;
    co2_comm_t comm = NULL;
    if (a->o->algo >= 0) {
        co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
        cc.transport = CO2_TRANSPORT_LOCAL;
        cc.rank = a->rank;
        cc.world_size = a->o->world;
        cc.group_name = a->group;
        cc.timeout_ms = a->o->timeout_ms;
        if (a->o->hierarchy == CO2_HIERARCHY_NODES) cc.node_id = a->rank / a->o->ranks_per_node;
        if (!check(co2_comm_create(&cc, &comm), "co2_comm_create", a->rank)) {
            a->result.ok = 0;
            return NULL;
        }
    }
    train(a->o, comm, a->rank, &a->result);
    if (!a->result.ok && comm) co2_comm_abort(comm); /* the others fail fast instead of waiting */
    co2_comm_destroy(comm);
    return NULL;
}

static int run_threads(const struct options *o) {
    char bandwidth[64];
    struct thread_arg *args = calloc((size_t)o->world, sizeof *args);
    pthread_t *threads = calloc((size_t)o->world, sizeof *threads);
    int ok = 1;
    if (!args || !threads) {
        fprintf(stderr, "overlap: out of memory\n");
        return 1;
    }
    /* Read by the local transport when a communicator is created. */
    snprintf(bandwidth, sizeof bandwidth, "%.0f", o->bandwidth);
    if (o->bandwidth > 0)
        setenv("CO2_LOCAL_TEST_BANDWIDTH", bandwidth, 1);
    else
        unsetenv("CO2_LOCAL_TEST_BANDWIDTH");
    for (int r = 0; r < o->world; ++r) {
        args[r].o = o;
        args[r].rank = r;
        snprintf(args[r].group, sizeof args[r].group, "overlap-%ld", (long)getpid());
        if (pthread_create(&threads[r], NULL, rank_thread, &args[r]) != 0) {
            fprintf(stderr, "overlap: cannot start rank thread %d\n", r);
            return 1; /* the started ranks are stuck in rendezvous until their timeout: exit */
        }
    }
    for (int r = 0; r < o->world; ++r) pthread_join(threads[r], NULL);
    for (int r = 0; r < o->world; ++r) {
        if (args[r].result.ok)
            print_result(o, r, o->world, &args[r].result);
        else
            ok = 0;
    }
    free(args);
    free(threads);
    return ok ? 0 : 1;
}

static int env_int(const char *name, int min, int max, int *out) {
    const char *text = getenv(name);
    int64_t v;
    if (!text || !parse_i64(text, min, max, &v)) return 0;
    *out = (int)v;
    return 1;
}

static int run_process(const struct options *o) {
    int rank = 0, world = 1;
    struct rank_result result;
    co2_comm_t comm = NULL;
    memset(&result, 0, sizeof result);
    if (!env_int("RANK", 0, 1 << 20, &rank) || !env_int("WORLD_SIZE", 1, 1 << 20, &world) ||
        rank >= world) {
        fprintf(stderr, "overlap: --mode process needs RANK and WORLD_SIZE (0 <= RANK < WORLD_SIZE) "
                        "in the environment, as a launcher sets them\n");
        return 2;
    }
    if (o->algo >= 0) {
        co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
        co2_status_t s;
        cc.transport = CO2_TRANSPORT_AUTO;
        cc.rank = rank;
        cc.world_size = world;
        cc.timeout_ms = o->timeout_ms;
        s = co2_comm_create(&cc, &comm);
        if (s == CO2_ERR_UNSUPPORTED) {
            fprintf(stderr, "overlap: this build has no multi-process transport (%s); "
                            "use --mode threads\n", co2_last_error_message());
            return 77;
        }
        if (!check(s, "co2_comm_create", rank)) return 1;
    }
    train(o, comm, rank, &result);
    if (!result.ok && comm) co2_comm_abort(comm);
    co2_comm_destroy(comm);
    if (!result.ok) return 1;
    print_result(o, rank, world, &result);
    return 0;
}

int main(int argc, char **argv) {
    struct options o;
    memset(&o, 0, sizeof o);
    o.mode = MODE_THREADS;
    o.world = 2;
    o.algo_name = NULL;
    o.tau = 12;
    o.params = 1u << 20;
    o.step_us = 10000;
    o.work = WORK_WAIT;
    o.steps = 120;
    o.warmup_steps = -1;
    o.timeout_ms = 120000;
    o.wire_format = CO2_WIRE_FP32;
    o.error_feedback = 1;
    for (int i = 1; i < argc; ++i) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (strcmp(a, "--calibrate-burn") == 0 && v && parse_i64(v, 1, 100000000, &n)) {
            printf("%llu\n", (unsigned long long)calibrate_burn(n));
            return 0;
        } else if (strcmp(a, "--algo") == 0 && v) {
            o.algo_name = v;
            o.algo = parse_algo(v);
        } else if (strcmp(a, "--tau") == 0 && v && parse_i64(v, 1, 1000000, &n)) {
            o.tau = (uint32_t)n;
        } else if (strcmp(a, "--params") == 0 && v && parse_i64(v, 1, (int64_t)1 << 34, &n)) {
            o.params = (size_t)n;
        } else if (strcmp(a, "--step-us") == 0 && v && parse_i64(v, 0, 60000000, &n)) {
            o.step_us = n;
        } else if (strcmp(a, "--work") == 0 && v && (strcmp(v, "wait") == 0 || strcmp(v, "burn") == 0)) {
            o.work = strcmp(v, "wait") == 0 ? WORK_WAIT : WORK_BURN;
        } else if (strcmp(a, "--burn-iters") == 0 && v && parse_i64(v, 0, INT64_MAX, &n)) {
            o.burn_iters = (uint64_t)n;
        } else if (strcmp(a, "--steps") == 0 && v && parse_i64(v, 1, 100000000, &n)) {
            o.steps = n;
        } else if (strcmp(a, "--warmup-steps") == 0 && v && parse_i64(v, 0, 100000000, &n)) {
            o.warmup_steps = n;
        } else if (strcmp(a, "--mode") == 0 && v && (strcmp(v, "threads") == 0 || strcmp(v, "process") == 0)) {
            o.mode = strcmp(v, "threads") == 0 ? MODE_THREADS : MODE_PROCESS;
        } else if (strcmp(a, "--world") == 0 && v && parse_i64(v, 1, 256, &n)) {
            o.world = (int)n;
        } else if (strcmp(a, "--bandwidth") == 0 && v && parse_i64(v, 0, INT64_MAX, &n)) {
            o.bandwidth = (double)n;
        } else if (strcmp(a, "--wire-format") == 0 && v &&
                   (strcmp(v, "fp32") == 0 || strcmp(v, "bf16") == 0 || strcmp(v, "int8") == 0)) {
            o.wire_format = strcmp(v, "fp32") == 0 ? CO2_WIRE_FP32 : strcmp(v, "bf16") == 0 ? CO2_WIRE_BF16 : CO2_WIRE_INT8;
        } else if (strcmp(a, "--shard") == 0) {
            o.shard_outer_state = 1;
            continue; /* takes no value */
        } else if (strcmp(a, "--hierarchy") == 0 && v && (strcmp(v, "flat") == 0 || strcmp(v, "nodes") == 0)) {
            o.hierarchy = strcmp(v, "flat") == 0 ? CO2_HIERARCHY_FLAT : CO2_HIERARCHY_NODES;
        } else if (strcmp(a, "--ranks-per-node") == 0 && v && parse_i64(v, 1, 256, &n)) {
            o.ranks_per_node = (int)n;
        } else if (strcmp(a, "--no-error-feedback") == 0) {
            o.error_feedback = 0;
            continue; /* takes no value */
        } else if (strcmp(a, "--timeout-ms") == 0 && v && parse_i64(v, 1, 3600000, &n)) {
            o.timeout_ms = (uint32_t)n;
        } else {
            fprintf(stderr, "overlap: bad or incomplete argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
            usage();
            return 2;
        }
        ++i;
    }
    if (!o.algo_name || o.algo == -2) {
        fprintf(stderr, "overlap: --algo must be one of none, sync, localsgd, diloco, co2\n");
        usage();
        return 2;
    }
    if (o.hierarchy == CO2_HIERARCHY_NODES && o.mode == MODE_THREADS &&
        (o.ranks_per_node < 1 || o.world % o.ranks_per_node != 0)) {
        fprintf(stderr, "overlap: --hierarchy nodes in threads mode needs --ranks-per-node L dividing "
                        "--world (process mode takes the node from GROUP_RANK)\n");
        return 2;
    }
    if (o.work == WORK_BURN && o.burn_iters == 0) {
        fprintf(stderr, "overlap: --work burn needs --burn-iters (see --calibrate-burn)\n");
        return 2;
    }
    /* Default warm-up: one round (co2's first boundary has nothing to apply yet). */
    if (o.warmup_steps < 0) o.warmup_steps = o.algo == CO2_ALGO_SYNC || o.algo < 0 ? 1 : o.tau;
    if (o.warmup_steps >= o.steps) {
        fprintf(stderr, "overlap: --steps (%lld) must exceed the warm-up (%lld)\n",
                (long long)o.steps, (long long)o.warmup_steps);
        return 2;
    }
    return o.mode == MODE_THREADS ? run_threads(&o) : run_process(&o);
}

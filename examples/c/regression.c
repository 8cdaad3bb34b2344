/*
 * co2 example: least-squares linear regression trained data-parallel on several ranks.
 *
 * Two ways to run it:
 *   - as real processes under a launcher: `co2run --nproc-per-node 4 co2_example_regression`
 *     (or torchrun, mpirun, srun). Each process is one rank; CO2_TRANSPORT_AUTO picks UCX
 *     because the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) says the
 *     ranks are processes, and the default config takes rank and world size from it.
 *   - on its own: 4 ranks as threads of this process, each with its own communicator
 *     (CO2_TRANSPORT_LOCAL, one group name per run).
 * Every rank has its own shard of generated data (fixed seeds, the same in both modes). The inner optimizer is
 * plain minibatch SGD with a cosine learning-rate schedule, written here: it belongs to the
 * "framework", not to co2. The model is trained twice on the same data from the same start:
 *
 *   1. co2:  tau local SGD steps, then an outer update whose all-reduce runs in the background
 *            while the next tau steps compute (co2_engine_step). Parameters live in runtime-owned
 *            flat storage (co2_engine_alloc_flat + two segments).
 *   2. sync: the DDP baseline: gradients averaged every step (co2_engine_reduce_gradients).
 *            Parameters are the program's own arrays (co2_engine_register_tensor).
 *
 * It prints the loss of the consensus model over all shards after every round, the overlap
 * statistics (time the training thread waited at boundaries against the time the all-reduces
 * took), and the ratio of the final losses. Exit status: 0 on success, 1 on any co2 error
 * (its status string and co2_last_error_message are printed), 2 if the final co2 loss is more
 * than 1.05x the sync loss.
 *
 * Usage: co2_example_regression [--rounds N] [--tau N] [--quiet]
 * Under a launcher only rank 0 prints, and only rank 0's exit status reflects the loss target.
 */
#define _POSIX_C_SOURCE 200809L

#include <co2/co2.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREAD_WORLD 4 /* ranks when run on its own (threads) */
#define MAX_WORLD 16
#define FEATURES 64
#define DIM (FEATURES + 1) /* weights and one bias */
#define SAMPLES_PER_RANK 4096
#define BATCH 32
#define NOISE 0.1
#define LR0 0.05
#define TARGET_RATIO 1.05
#define PI 3.14159265358979323846

/* ---------------------------------------------------------------------------------------- */
/* Errors: any failing co2 call ends the program with status 1.                              */
/* ---------------------------------------------------------------------------------------- */

static void die(const char *call, co2_status_t status) {
    /* Read the message first: it is valid until the next co2 call on this thread. */
    const char *message = co2_last_error_message();
    fprintf(stderr, "error: %s failed: %s (status %d)\n  detail: %s\n", call,
            co2_status_string(status), (int)status, message);
    fflush(NULL);
    _Exit(1); /* other ranks may be blocked in a collective: do not wait for them */
}

#define CHECK(call)                                    \
    do {                                               \
        co2_status_t check_status_ = (call);           \
        if (check_status_ != CO2_OK) die(#call, check_status_); \
    } while (0)

/* ---------------------------------------------------------------------------------------- */
/* Data: y = X w* + b* + noise, features N(0, 1), one shard per rank.                        */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    uint64_t state;
} rng_t;

static uint64_t rng_next(rng_t *r) { /* xorshift64* */
    r->state ^= r->state >> 12;
    r->state ^= r->state << 25;
    r->state ^= r->state >> 27;
    return r->state * 2685821657736338717ULL;
}

static double rng_uniform(rng_t *r) { /* (0, 1) */
    return ((double)(rng_next(r) >> 11) + 0.5) / 9007199254740992.0;
}

static double rng_normal(rng_t *r) {
    return sqrt(-2.0 * log(rng_uniform(r))) * cos(2.0 * PI * rng_uniform(r));
}

typedef struct {
    float x[SAMPLES_PER_RANK][FEATURES];
    float y[SAMPLES_PER_RANK];
} shard_t;

static shard_t g_shards[MAX_WORLD];
static int g_world = THREAD_WORLD;

static void make_data(void) {
    double w_true[FEATURES], b_true;
    rng_t truth = {0x9E3779B97F4A7C15ULL};
    int i, j, r;
    for (j = 0; j < FEATURES; ++j) w_true[j] = rng_normal(&truth);
    b_true = 0.5;
    for (r = 0; r < g_world; ++r) {
        rng_t rng = {0xC02C02ULL + 7919ULL * (uint64_t)(r + 1)};
        for (i = 0; i < SAMPLES_PER_RANK; ++i) {
            double y = b_true + NOISE * rng_normal(&rng);
            for (j = 0; j < FEATURES; ++j) {
                const double x = rng_normal(&rng);
                g_shards[r].x[i][j] = (float)x;
                y += w_true[j] * x;
            }
            g_shards[r].y[i] = (float)y;
        }
    }
}

/* Sum of squared residuals of model (w, b) over a shard. */
static double shard_sse(const shard_t *s, const float *w, float b) {
    double sse = 0.0;
    int i, j;
    for (i = 0; i < SAMPLES_PER_RANK; ++i) {
        double pred = b;
        for (j = 0; j < FEATURES; ++j) pred += (double)w[j] * s->x[i][j];
        sse += (pred - s->y[i]) * (pred - s->y[i]);
    }
    return sse;
}

/* Loss of the exact least-squares solution over all shards (normal equations, Cholesky in
 * double precision): the best any optimizer can reach, to report excess loss against. */
static double optimal_loss(void) {
    static double a[DIM][DIM];
    double rhs[DIM], sol[DIM], z[DIM], sse = 0.0;
    float w[FEATURES];
    int r, i, j, k;
    memset(a, 0, sizeof a);
    memset(rhs, 0, sizeof rhs);
    for (r = 0; r < g_world; ++r) {
        for (i = 0; i < SAMPLES_PER_RANK; ++i) {
            double x[DIM];
            for (j = 0; j < FEATURES; ++j) x[j] = g_shards[r].x[i][j];
            x[FEATURES] = 1.0;
            for (j = 0; j < DIM; ++j) {
                rhs[j] += x[j] * g_shards[r].y[i];
                for (k = 0; k <= j; ++k) a[j][k] += x[j] * x[k];
            }
        }
    }
    for (j = 0; j < DIM; ++j) { /* in place: a = L L^T, L in the lower triangle */
        for (k = 0; k < j; ++k) a[j][j] -= a[j][k] * a[j][k];
        a[j][j] = sqrt(a[j][j]);
        for (i = j + 1; i < DIM; ++i) {
            for (k = 0; k < j; ++k) a[i][j] -= a[i][k] * a[j][k];
            a[i][j] /= a[j][j];
        }
    }
    for (i = 0; i < DIM; ++i) { /* L z = rhs */
        z[i] = rhs[i];
        for (k = 0; k < i; ++k) z[i] -= a[i][k] * z[k];
        z[i] /= a[i][i];
    }
    for (i = DIM - 1; i >= 0; --i) { /* L^T sol = z */
        sol[i] = z[i];
        for (k = i + 1; k < DIM; ++k) sol[i] -= a[k][i] * sol[k];
        sol[i] /= a[i][i];
    }
    for (j = 0; j < FEATURES; ++j) w[j] = (float)sol[j];
    for (r = 0; r < g_world; ++r) sse += shard_sse(&g_shards[r], w, (float)sol[FEATURES]);
    return 0.5 * sse / (double)(g_world * SAMPLES_PER_RANK);
}

/* Minibatch gradient of 1/(2B) sum (x.w + b - y)^2 into (gw, gb). */
static void minibatch_gradient(const shard_t *s, rng_t *rng, const float *w, float b, float *gw,
                               float *gb) {
    int k, j;
    memset(gw, 0, FEATURES * sizeof(float));
    *gb = 0.0f;
    for (k = 0; k < BATCH; ++k) {
        const int i = (int)(rng_next(rng) % SAMPLES_PER_RANK);
        double residual = b - s->y[i];
        for (j = 0; j < FEATURES; ++j) residual += (double)w[j] * s->x[i][j];
        for (j = 0; j < FEATURES; ++j) gw[j] += (float)(residual * s->x[i][j] / BATCH);
        *gb += (float)(residual / BATCH);
    }
}

/* Global loss (mean squared error / 2 over every shard) of the model (w, b): a collective. */
static double global_loss(co2_comm_t comm, const shard_t *s, const float *w, float b) {
    double sums[2];
    co2_request_t request;
    sums[0] = shard_sse(s, w, b);
    sums[1] = SAMPLES_PER_RANK;
    CHECK(co2_allreduce(comm, sums, 2, CO2_DTYPE_FP64, CO2_REDUCE_SUM, NULL, &request));
    CHECK(co2_request_wait(request, -1));
    CHECK(co2_request_free(request));
    return 0.5 * sums[0] / sums[1];
}

/* Inner learning rate: cosine decay from LR0 to LR0/20 over the run. */
static float inner_lr(int step, int total_steps) {
    const double progress = (double)step / (double)total_steps;
    return (float)(LR0 * (0.05 + 0.95 * 0.5 * (1.0 + cos(PI * progress))));
}

/* Initial model: each rank draws its own (different!) values; commit broadcasts rank 0's. */
static void initial_model(int rank, float *w, float *b) {
    rng_t rng = {0xABCDEF12345ULL + (uint64_t)rank * 104729ULL};
    int j;
    for (j = 0; j < FEATURES; ++j) w[j] = (float)(0.1 * rng_normal(&rng));
    *b = 0.0f;
}

/* ---------------------------------------------------------------------------------------- */
/* One rank                                                                                  */
/* ---------------------------------------------------------------------------------------- */

typedef struct {
    int rank;       /* -1 under a launcher: the communicator says which */
    co2_algorithm_t algorithm;
    const char *group; /* NULL under a launcher */
    int rounds, tau;
    int quiet;
    /* results (rank 0's are printed) */
    double loss_per_round[1024];
    double final_loss;
    co2_engine_stats_t stats;
} rank_job_t;

static void *run_rank(void *arg) {
    rank_job_t *job = (rank_job_t *)arg;
    const shard_t *shard;
    const int total_steps = job->rounds * job->tau;
    rng_t batches;
    co2_comm_config_t comm_config = CO2_COMM_CONFIG_INIT;
    co2_engine_config_t engine_config = CO2_ENGINE_CONFIG_INIT;
    co2_comm_t comm;
    co2_engine_t engine;
    float own_w[FEATURES], own_b; /* sync: the program's own parameter arrays */
    float *w, *b;                 /* the parameters, wherever they live */
    float grad_w[FEATURES], grad_b;
    float consensus[DIM];
    size_t num_elements;
    int step, round = 0;

    if (job->group) {
        /* Threads: one communicator per rank; equal group names form one group. */
        comm_config.transport = CO2_TRANSPORT_LOCAL;
        comm_config.rank = job->rank;
        comm_config.world_size = g_world;
        comm_config.group_name = job->group;
    } /* else processes: the defaults (AUTO, rank 0 of 1) defer to the launcher's environment */
    CHECK(co2_comm_create(&comm_config, &comm));
    CHECK(co2_comm_rank(comm, &job->rank));
    shard = &g_shards[job->rank];
    batches.state = 0x5A5A5A5AULL + 31ULL * (uint64_t)job->rank;

    engine_config.algorithm = job->algorithm;
    engine_config.tau = (uint32_t)job->tau;
    engine_config.outer_lr = 1.0;                          /* alpha */
    engine_config.outer_momentum = CO2_OUTER_MOMENTUM_AUTO; /* beta = 0 for 4 ranks */
    CHECK(co2_engine_create(comm, &engine_config, &engine));

    if (job->algorithm == CO2_ALGO_CO2) {
        /* Runtime-owned flat storage: the parameters are views into it. */
        void *flat;
        co2_segment_t weight = CO2_SEGMENT_INIT, bias = CO2_SEGMENT_INIT;
        CHECK(co2_engine_alloc_flat(engine, DIM, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat));
        w = (float *)flat;
        b = w + FEATURES;
        weight.name = "weight";
        weight.offset = 0;
        weight.count = FEATURES;
        bias.name = "bias";
        bias.offset = FEATURES;
        bias.count = 1;
        CHECK(co2_engine_add_segment(engine, &weight));
        CHECK(co2_engine_add_segment(engine, &bias));
    } else {
        /* Framework-owned tensors, registered by pointer. */
        co2_tensor_t weight = CO2_TENSOR_INIT, bias = CO2_TENSOR_INIT;
        w = own_w;
        b = &own_b;
        weight.name = "weight";
        weight.data = own_w;
        weight.count = FEATURES;
        bias.name = "bias";
        bias.data = &own_b;
        bias.count = 1;
        CHECK(co2_engine_register_tensor(engine, &weight));
        CHECK(co2_engine_register_tensor(engine, &bias));
    }
    initial_model(job->rank, w, b);
    /* Collective: checks that all ranks registered the same layout and broadcasts rank 0's
     * parameters into every rank's parameters (and the anchor). */
    CHECK(co2_engine_commit(engine));
    CHECK(co2_engine_num_elements(engine, &num_elements));
    if (num_elements != DIM) {
        fprintf(stderr, "error: engine holds %zu elements, expected %d\n", num_elements, DIM);
        _Exit(1);
    }

    for (step = 0; step < total_steps; ++step) {
        const float lr = inner_lr(step, total_steps);
        int j, boundary = 0;
        minibatch_gradient(shard, &batches, w, *b, grad_w, &grad_b);
        if (job->algorithm == CO2_ALGO_SYNC) {
            /* Pointers are passed on every call, in registration order. */
            void *grads[2];
            grads[0] = grad_w;
            grads[1] = &grad_b;
            CHECK(co2_engine_reduce_gradients(engine, grads, 2, NULL));
        }
        for (j = 0; j < FEATURES; ++j) w[j] -= lr * grad_w[j];
        *b -= lr * grad_b;
        /* After every inner optimizer step. A co2 boundary launches the all-reduce of this
         * round's deltas and returns without waiting for it. */
        CHECK(co2_engine_step(engine, NULL, &boundary));
        if (boundary) {
            /* The consensus model (the anchor; for sync, the parameters): no communication. */
            CHECK(co2_engine_consensus(engine, CO2_CONSENSUS_ANCHOR, consensus, DIM));
            job->loss_per_round[round] = global_loss(comm, shard, consensus, consensus[FEATURES]);
            if (job->rank == 0 && !job->quiet)
                printf("  %-4s round %3d  step %4d  loss %.6f\n",
                       job->algorithm == CO2_ALGO_CO2 ? "co2" : "sync", round + 1, step + 1,
                       job->loss_per_round[round]);
            ++round;
        }
    }
    /* End of training: apply the average still in flight; parameters = anchor on every rank. */
    CHECK(co2_engine_finalize(engine));
    job->final_loss = global_loss(comm, shard, w, *b);

    job->stats.size = sizeof job->stats;
    job->stats.version = CO2_ABI_VERSION;
    CHECK(co2_engine_get_stats(engine, &job->stats));
    CHECK(co2_engine_destroy(engine));
    CHECK(co2_comm_destroy(comm));
    return NULL;
}

static void train(co2_algorithm_t algorithm, const char *group, int rounds, int tau, int quiet,
                  rank_job_t jobs[THREAD_WORLD]) {
    pthread_t threads[THREAD_WORLD];
    int r;
    for (r = 0; r < THREAD_WORLD; ++r) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].rank = r;
        jobs[r].algorithm = algorithm;
        jobs[r].group = group;
        jobs[r].rounds = rounds;
        jobs[r].tau = tau;
        jobs[r].quiet = quiet;
        if (pthread_create(&threads[r], NULL, run_rank, &jobs[r]) != 0) {
            fprintf(stderr, "error: pthread_create failed\n");
            exit(1);
        }
    }
    for (r = 0; r < THREAD_WORLD; ++r) pthread_join(threads[r], NULL);
    for (r = 1; r < THREAD_WORLD; ++r) {
        if (jobs[r].final_loss != jobs[0].final_loss) {
            fprintf(stderr, "error: ranks disagree on the final loss (%.9g vs %.9g)\n",
                    jobs[r].final_loss, jobs[0].final_loss);
            exit(1);
        }
    }
}

static void print_stats(const char *name, const co2_engine_stats_t *s) {
    const double wait_ms = (double)s->boundary_wait_ns / 1e6;
    const double coll_ms = (double)s->collective_ns / 1e6;
    printf("  %-4s steps %llu, rounds %llu, outer updates %llu, %.1f KiB all-reduced\n", name,
           (unsigned long long)s->steps, (unsigned long long)s->rounds,
           (unsigned long long)s->outer_updates, (double)s->bytes_reduced / 1024.0);
    printf("       training thread waited %.3f ms for collectives that took %.3f ms in total",
           wait_ms, coll_ms);
    if (coll_ms > 0.0) {
        double hidden = 1.0 - wait_ms / coll_ms;
        if (hidden < 0.0) hidden = 0.0;
        printf(" (%.0f%% of the communication hidden)", 100.0 * hidden);
    }
    printf("\n");
}

/* Under a launcher: this process is one rank; it runs both trainings as that rank. */
static void train_as_process(co2_algorithm_t algorithm, int rounds, int tau, int quiet, rank_job_t *job) {
    memset(job, 0, sizeof *job);
    job->rank = -1;
    job->algorithm = algorithm;
    job->rounds = rounds;
    job->tau = tau;
    job->quiet = quiet;
    run_rank(job);
    if (job->rank != 0) job->quiet = 1;
}

/* The first of the launchers' variables that is set (torchrun/co2run, Open MPI, Slurm), or -1. */
static int launcher_variable(const char *torchrun, const char *openmpi, const char *slurm) {
    const char *names[3];
    size_t k;
    names[0] = torchrun;
    names[1] = openmpi;
    names[2] = slurm;
    for (k = 0; k < 3; ++k) {
        const char *text = getenv(names[k]);
        if (text && *text) return atoi(text);
    }
    return -1;
}

int main(int argc, char **argv) {
    static rank_job_t co2_jobs[THREAD_WORLD], sync_jobs[THREAD_WORLD];
    int rounds = 40, tau = 8, quiet = 0, i, launched;
    int major, minor, patch;
    double ratio, best;

    for (i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
            rounds = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--tau") == 0 && i + 1 < argc) {
            tau = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else {
            fprintf(stderr, "usage: %s [--rounds N] [--tau N] [--quiet]\n", argv[0]);
            return 1;
        }
    }
    if (rounds < 1 || rounds > 1024 || tau < 1) {
        fprintf(stderr, "error: need 1 <= rounds <= 1024 and tau >= 1\n");
        return 1;
    }

    launched = launcher_variable("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS");
    if (launched > MAX_WORLD) {
        fprintf(stderr, "error: this example supports at most %d ranks\n", MAX_WORLD);
        return 1;
    }
    if (launched > 0) g_world = launched;
    CHECK(co2_get_version(&major, &minor, &patch));
    make_data();
    best = optimal_loss();
    if (launched > 0) {
        /* Rank 0 prints; the others train silently. */
        const int printer = launcher_variable("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") == 0;
        if (printer)
            printf("co2 %d.%d.%d: least-squares regression, %d features, %d processes x %d samples, "
                   "SGD batch %d, %d rounds of tau = %d steps\nloss of the exact least-squares "
                   "solution: %.6f\n\nCO2 (asynchronous outer all-reduce, one round stale):\n",
                   major, minor, patch, FEATURES, g_world, SAMPLES_PER_RANK, BATCH, rounds, tau, best);
        fflush(stdout);
        train_as_process(CO2_ALGO_CO2, rounds, tau, quiet || !printer, &co2_jobs[0]);
        if (co2_jobs[0].rank != 0) {
            train_as_process(CO2_ALGO_SYNC, rounds, tau, 1, &sync_jobs[0]);
            return 0;
        }
        printf("\nsync (gradients averaged every step, DDP):\n");
        fflush(stdout);
        train_as_process(CO2_ALGO_SYNC, rounds, tau, quiet, &sync_jobs[0]);
    } else {
        printf("co2 %d.%d.%d: least-squares regression, %d features, %d ranks (threads) x %d samples, "
               "SGD batch %d, %d rounds of tau = %d steps\n",
               major, minor, patch, FEATURES, g_world, SAMPLES_PER_RANK, BATCH, rounds, tau);
        printf("loss of the exact least-squares solution: %.6f\n\n", best);
        printf("CO2 (asynchronous outer all-reduce, one round stale):\n");
        train(CO2_ALGO_CO2, "co2-example-co2", rounds, tau, quiet, co2_jobs);
        printf("\nsync (gradients averaged every step, DDP):\n");
        train(CO2_ALGO_SYNC, "co2-example-sync", rounds, tau, quiet, sync_jobs);
    }

    printf("\noverlap statistics (rank 0):\n");
    print_stats("co2", &co2_jobs[0].stats);
    print_stats("sync", &sync_jobs[0].stats);

    printf("\nexcess over the least-squares optimum: co2 %.3g, sync %.3g\n",
           co2_jobs[0].final_loss - best, sync_jobs[0].final_loss - best);
    ratio = co2_jobs[0].final_loss / sync_jobs[0].final_loss;
    printf("final loss: co2 %.6f, sync %.6f, ratio co2/sync = %.4f (target <= %.2f): %s\n",
           co2_jobs[0].final_loss, sync_jobs[0].final_loss, ratio, TARGET_RATIO,
           ratio <= TARGET_RATIO ? "OK" : "MISSED");
    return ratio <= TARGET_RATIO ? 0 : 2;
}

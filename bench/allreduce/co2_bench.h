/* What the C benchmarks of bench/allreduce share: a status check that exits, a monotonic clock and the process's CPU clock,
 * and a blocking raw all-reduce (as the other tools' calls are). */
#ifndef CO2_BENCH_H
#define CO2_BENCH_H

#include <co2/co2.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MIN_SECONDS 1.0
#define MIN_ITERS 3

static inline void check(co2_status_t status, const char *call) {
    if (status == CO2_OK) return;
    fprintf(stderr, "%s: %s: %s\n", call, co2_status_string(status), co2_last_error_message());
    exit(1);
}
#define CHECK(call) check((call), #call)

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU seconds of every thread of this process (the progress thread and UCX's included). */
static inline double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static inline void allreduce(co2_comm_t comm, void *buffer, size_t count, co2_dtype_t dtype, co2_reduce_op_t op) {
    co2_request_t request;
    CHECK(co2_allreduce(comm, buffer, count, dtype, op, NULL, &request));
    CHECK(co2_request_wait(request, -1));
    CHECK(co2_request_free(request));
}

#endif

/* The outside reference for co2's all-reduce bandwidth: Open MPI's MPI_Allreduce (in place, float
 * sum) over the same sizes, printed in the same columns as co2's benchmark.
 *   mpirun -np W --mca pml ob1 --mca btl tcp,self mpi_allreduce [MIN_MIB MAX_MIB]  */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* CPU seconds of every thread of this process. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Each size runs until it took at least this long (and at least MIN_ITERS times). */
#define MIN_SECONDS 1.0
#define MIN_ITERS 3

int main(int argc, char **argv) {
    int rank, world;
    size_t mib, min_mib = 1, max_mib = 256;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc == 3) {
        min_mib = (size_t)atol(argv[1]);
        max_mib = (size_t)atol(argv[2]);
    }
    if (rank == 0) printf("# tool mpi ranks %d\n# bytes seconds algbw_GBps busbw_GBps cpu_seconds\n", world);
    for (mib = min_mib; mib <= max_mib; mib *= 4) {
        const size_t bytes = mib << 20, count = bytes / sizeof(float);
        float *buffer = malloc(bytes);
        double start, elapsed, slowest, cpu_start, cpu, cpu_sum;
        int iters = 0, done = 0;
        size_t i;
        for (i = 0; i < count; ++i) buffer[i] = (float)(rank + 1) * 1e-3f;
        MPI_Allreduce(MPI_IN_PLACE, buffer, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); /* warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
        cpu_start = cpu_now();
        while (!done) {
            MPI_Allreduce(MPI_IN_PLACE, buffer, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            ++iters;
            elapsed = MPI_Wtime() - start;
            /* every rank must agree on when to stop */
            done = iters >= MIN_ITERS && elapsed >= MIN_SECONDS;
            MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
        }
        elapsed /= iters;
        cpu = (cpu_now() - cpu_start) / iters;
        MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0)
            printf("%zu %.6f %.3f %.3f %.6f\n", bytes, slowest, bytes / slowest / 1e9,
                   2.0 * (world - 1) / world * bytes / slowest / 1e9, cpu_sum / world);
        fflush(stdout);
        free(buffer);
    }
    MPI_Finalize();
    return 0;
}

/* Checkpoints of format version 1 (written by co2 before the split boundary pass, with a raw
 * average in flight) still load, and the run continues exactly as it did in the library that
 * wrote them (docs/algorithm.md, "The split boundary pass").
 *
 *   checkpoint_v1_test make DIR    the scenario; writes DIR/co2_v1.blob (saved mid-round with
 *                                  the average in flight), DIR/p_at_save.f32, DIR/p_final.f32
 *   checkpoint_v1_test check DIR   loads the blob, restores p, continues; the result must equal
 *                                  p_final bit for bit; so must an uninterrupted run here
 *
 * The files in tests/capi/data/ were made by `make` linked against co2 at commit 7298d74 (the
 * last version-1 writer). One rank, co2 with Nesterov momentum, the gap penalty and norm clipping
 * (so every part of the outer update runs), two segments; the inner step is plain fp32. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "co2/co2.h"

enum { N_W = 50, N_B = 7, N = N_W + N_B, SAVE_STEP = 10, LAST_STEP = 18 };

static int fail(const char *what, co2_status_t s) {
    fprintf(stderr, "checkpoint_v1_test: %s: %s: %s\n", what, co2_status_string(s), co2_last_error_message());
    return 1;
}

/* The engine of the scenario on a fresh one-rank communicator; p gets the flat storage. */
static int make_engine(co2_comm_t *comm, co2_engine_t *engine, float **p) {
    co2_comm_config_t cc = CO2_COMM_CONFIG_INIT;
    co2_engine_config_t ec = CO2_ENGINE_CONFIG_INIT;
    co2_segment_t w = CO2_SEGMENT_INIT, b = CO2_SEGMENT_INIT;
    void *flat = NULL;
    co2_status_t s;
    cc.transport = CO2_TRANSPORT_LOCAL;
    cc.group_name = "checkpoint-v1";
    if ((s = co2_comm_create(&cc, comm)) != CO2_OK) return fail("co2_comm_create", s);
    ec.eager = 0; /* the scenario the format-1 library ran: the delayed update */
    ec.tau = 3;
    ec.outer_lr = 0.8;
    ec.outer_momentum = 0.5;
    ec.nesterov = 1;
    ec.penalty = CO2_PENALTY_GAP;
    ec.clip = CO2_CLIP_NORM;
    ec.clip_threshold = 0.05;
    if ((s = co2_engine_create(*comm, &ec, engine)) != CO2_OK) return fail("co2_engine_create", s);
    if ((s = co2_engine_alloc_flat(*engine, N, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, &flat)) != CO2_OK)
        return fail("co2_engine_alloc_flat", s);
    w.name = "w";
    w.count = N_W;
    b.name = "b";
    b.offset = N_W;
    b.count = N_B;
    if ((s = co2_engine_add_segment(*engine, &w)) != CO2_OK) return fail("add_segment w", s);
    if ((s = co2_engine_add_segment(*engine, &b)) != CO2_OK) return fail("add_segment b", s);
    *p = flat;
    for (int i = 0; i < N; ++i) (*p)[i] = sinf((float)i);
    if ((s = co2_engine_commit(*engine)) != CO2_OK) return fail("co2_engine_commit", s);
    return 0;
}

/* Inner steps first..last-1: a pull towards a target that moves with the step. */
static int train(co2_engine_t engine, float *p, int first, int last) {
    for (int k = first; k < last; ++k) {
        for (int i = 0; i < N; ++i) {
            const float target = cosf((float)(i + k)) * 0.5f;
            p[i] -= 0.1f * (p[i] - target);
        }
        const co2_status_t s = co2_engine_step(engine, NULL, NULL);
        if (s != CO2_OK) return fail("co2_engine_step", s);
    }
    return 0;
}

struct blob { unsigned char *data; size_t size, at; };

static int write_blob(void *user, const void *data, size_t length) {
    struct blob *b = user;
    unsigned char *grown = realloc(b->data, b->size + length);
    if (!grown) return 1;
    b->data = grown;
    memcpy(b->data + b->size, data, length);
    b->size += length;
    return 0;
}

static int read_blob(void *user, void *data, size_t length) {
    struct blob *b = user;
    if (b->at + length > b->size) return 1;
    memcpy(data, b->data + b->at, length);
    b->at += length;
    return 0;
}

static int save_file(const char *dir, const char *name, const void *data, size_t size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        fprintf(stderr, "checkpoint_v1_test: cannot write %s\n", path);
        return 1;
    }
    return 0;
}

/* Reads DIR/name into a new buffer; *size its length. */
static unsigned char *load_file(const char *dir, const char *name, size_t *size) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    long n;
    if (!f || fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0 ||
        !(data = malloc((size_t)n + 1)) || fread(data, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "checkpoint_v1_test: cannot read %s\n", path);
        if (f) fclose(f);
        free(data);
        return NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return data;
}

static int same_floats(const char *what, const float *got, const float *want) {
    for (int i = 0; i < N; ++i)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fprintf(stderr, "checkpoint_v1_test: %s: element %d is %.9g, the version-1 library gave %.9g\n",
                    what, i, got[i], want[i]);
            return 1;
        }
    return 0;
}

static int make(const char *dir) {
    co2_comm_t comm;
    co2_engine_t engine;
    float *p, p_at_save[N];
    struct blob blob = {NULL, 0, 0};
    co2_status_t s;
    if (make_engine(&comm, &engine, &p) || train(engine, p, 0, SAVE_STEP)) return 1;
    if ((s = co2_engine_save(engine, write_blob, &blob)) != CO2_OK) return fail("co2_engine_save", s);
    memcpy(p_at_save, p, sizeof p_at_save);
    if (train(engine, p, SAVE_STEP, LAST_STEP)) return 1;
    if ((s = co2_engine_finalize(engine)) != CO2_OK) return fail("co2_engine_finalize", s);
    if (save_file(dir, "co2_v1.blob", blob.data, blob.size) ||
        save_file(dir, "p_at_save.f32", p_at_save, sizeof p_at_save) ||
        save_file(dir, "p_final.f32", p, N * sizeof(float)))
        return 1;
    co2_engine_destroy(engine);
    co2_comm_destroy(comm);
    free(blob.data);
    return 0;
}

static int check(const char *dir) {
    size_t blob_size = 0, at_save_size = 0, final_size = 0;
    unsigned char *blob_data = load_file(dir, "co2_v1.blob", &blob_size);
    unsigned char *at_save = load_file(dir, "p_at_save.f32", &at_save_size);
    unsigned char *final = load_file(dir, "p_final.f32", &final_size);
    struct blob blob = {blob_data, blob_size, 0};
    co2_comm_t comm;
    co2_engine_t engine;
    float *p, want[N];
    uint32_t version = 0;
    co2_status_t s;
    int bad = 0;
    if (!blob_data || !at_save || !final) return 1;
    if (at_save_size != N * sizeof(float) || final_size != N * sizeof(float) || blob_size < 12) {
        fprintf(stderr, "checkpoint_v1_test: the fixture files have the wrong sizes\n");
        return 1;
    }
    memcpy(&version, blob_data + 8, sizeof version);
    if (version != 1) {
        fprintf(stderr, "checkpoint_v1_test: the fixture is format version %u, not 1\n", (unsigned)version);
        return 1;
    }
    memcpy(want, final, sizeof want);

    /* The restored run: load, restore the mid-round parameters, continue. */
    if (make_engine(&comm, &engine, &p)) return 1;
    if ((s = co2_engine_load(engine, read_blob, &blob)) != CO2_OK) return fail("co2_engine_load", s);
    memcpy(p, at_save, N * sizeof(float));
    if (train(engine, p, SAVE_STEP, LAST_STEP)) return 1;
    if ((s = co2_engine_finalize(engine)) != CO2_OK) return fail("co2_engine_finalize", s);
    bad |= same_floats("restored from the version-1 blob", p, want);
    co2_engine_destroy(engine);
    co2_comm_destroy(comm);

    /* The same run uninterrupted in this library: the split pass changes no bit. */
    if (make_engine(&comm, &engine, &p) || train(engine, p, 0, LAST_STEP)) return 1;
    if ((s = co2_engine_finalize(engine)) != CO2_OK) return fail("co2_engine_finalize", s);
    bad |= same_floats("uninterrupted", p, want);
    co2_engine_destroy(engine);
    co2_comm_destroy(comm);
    free(blob_data);
    free(at_save);
    free(final);
    if (!bad) printf("checkpoint_v1_test: the version-1 blob restored and continued bit for bit\n");
    return bad;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "make") == 0) return make(argv[2]);
    if (argc == 3 && strcmp(argv[1], "check") == 0) return check(argv[2]);
    fprintf(stderr, "usage: checkpoint_v1_test make|check DIR\n");
    return 2;
}

/*
 * co2.h — the public C ABI of co2, version 1.
 *
 * co2 runs communication-efficient data-parallel training (CO2: local steps, then an outer update
 * whose all-reduce is overlapped with the next round) behind a stable C ABI.
 *
 * Rules every function follows:
 *  - Every function returns a co2_status_t (except co2_status_string and
 *    co2_last_error_message). Outputs come last and are written only on success.
 *  - On failure, co2_last_error_message() returns a thread-local message saying what went wrong.
 *  - No C++ exception ever leaves the library.
 *  - destroy(NULL) is a no-op that returns CO2_OK.
 *  - Config and stats structs begin with `size`: fill them with their INIT macro or init
 *    function; the library reads/writes min(size, its own sizeof) bytes, so the ABI can grow.
 *    Structs grow only at their end; a size below a struct's first published (v1) size is
 *    CO2_ERR_INVALID_CONFIG, and fields beyond the caller's size take their INIT defaults
 *    (docs/capi.md, "The size rule"). A config's `version` (CO2_ABI_VERSION below) must be 1 up
 *    to the library's, and every reserved field 0; otherwise CO2_ERR_INVALID_CONFIG.
 *  - One engine is driven from one thread. co2_comm_abort may be called from any thread.
 *
 * This header includes only standard C headers and compiles as C99 and as C++.
 */
#ifndef CO2_CO2_H
#define CO2_CO2_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------------------------ */
/* Version                                                                                      */
/* ------------------------------------------------------------------------------------------ */

#define CO2_VERSION_MAJOR 1
#define CO2_VERSION_MINOR 2
#define CO2_VERSION_PATCH 0
/* Version of the config/stats struct family, stored in each struct's `version` field by its
 * INIT macro: 1 for the layouts of 1.0, 2 since 1.1 (co2_comm_config_t, co2_engine_config_t and
 * co2_engine_stats_t grew), 3 since 1.2 (co2_engine_config_t and co2_engine_stats_t grew). A config's version says which header the caller was built against:
 * the library accepts 1 up to its own and refuses 0 and newer ones (CO2_ERR_INVALID_CONFIG: a
 * newer header's fields would be ignored). co2_engine_get_stats writes the library's own. */
#define CO2_ABI_VERSION 3

/* ------------------------------------------------------------------------------------------ */
/* Status codes. Values are pinned and never renumbered.                                         */
/* ------------------------------------------------------------------------------------------ */

typedef int32_t co2_status_t;

enum {
    CO2_OK = 0,
    /* Caller errors. */
    CO2_ERR_INVALID_ARGUMENT = 1,   /* NULL pointer, zero/mismatched size, out-of-range value   */
    CO2_ERR_INVALID_STATE = 2,      /* call not allowed now (step before commit, register twice) */
    CO2_ERR_UNSUPPORTED = 3,        /* valid request this build cannot serve (bf16, CUDA, ...)   */
    CO2_ERR_INVALID_CONFIG = 4,     /* struct with a bad size/version or a non-zero reserved field */
    CO2_ERR_UNKNOWN_ENUM = 5,       /* enum value this library does not know                     */
    CO2_ERR_DUPLICATE_TENSOR = 6,   /* same memory (or name) registered twice                    */
    CO2_ERR_OUT_OF_MEMORY = 7,
    /* Training-state errors. */
    CO2_ERR_NONFINITE = 20,         /* NaN/Inf in a delta or an average: nothing was applied     */
    CO2_ERR_LAYOUT_MISMATCH = 21,   /* ranks registered different parameter layouts, or created
                                       their engines with different settings (commit)             */
    CO2_ERR_ANCHOR_MISMATCH = 22,   /* anchor checksums differ across ranks                       */
    CO2_ERR_CHECKPOINT_CORRUPT = 23,/* blob truncated, bad magic or bad CRC                       */
    CO2_ERR_CHECKPOINT_MISMATCH = 24,/* blob from another layout or an unknown format version     */
    CO2_ERR_CALLBACK = 25,          /* a user read/write callback reported failure                */
    /* Waiting. */
    CO2_ERR_TIMEOUT = 40,           /* a wait with a caller-given timeout expired; still pending  */
    CO2_MEMBERSHIP_CHANGED = 50,    /* added in 1.2: an elastic group lost a rank and re-formed;
                                       the call did not complete, the engine goes on at the new
                                       rank/size (co2_comm_rank/size) from the agreed state    */
    CO2_LEFT = 51,                  /* added in 1.2: this rank left its elastic group as it asked
                                       (co2_engine_leave); its parameters are the group's anchor
                                       after its last round; the engine takes no more steps      */
    /* Peer / transport failures: 100-199. The communicator is unusable afterwards: destroy it. */
    CO2_ERR_PEER_LOST = 100,        /* a peer disappeared (process died, endpoint closed)         */
    CO2_ERR_PEER_TIMEOUT = 101,     /* no progress for the communicator's timeout                 */
    CO2_ERR_COLLECTIVE_MISMATCH = 102, /* ranks issued different collectives at one sequence no. */
    CO2_ERR_ABORTED = 103,          /* co2_comm_abort was called (on this or another rank)        */
    CO2_ERR_TRANSPORT = 104,        /* other transport failure                                   */
    CO2_ERR_RENDEZVOUS = 105,       /* the group could not be formed (timeout, size conflict)     */
    CO2_ERR_INTERNAL = 199          /* a bug in co2: please report with the message               */
};

/* A static English description of `status` and what to do about it. Never NULL. */
const char *co2_status_string(co2_status_t status);

/* Thread-local detail about the last failed call on this thread ("" if none). Valid until the
 * next co2 call on this thread. */
const char *co2_last_error_message(void);

co2_status_t co2_get_version(int *major, int *minor, int *patch);

/* ------------------------------------------------------------------------------------------ */
/* Enumerations (all stored as int32_t in structs)                                               */
/* ------------------------------------------------------------------------------------------ */

typedef int32_t co2_dtype_t;
enum {
    CO2_DTYPE_FP32 = 0,
    CO2_DTYPE_BF16 = 1,   /* parameters (1.1; CUDA: co2, diloco), outer state fp32; not collectives */
    CO2_DTYPE_FP16 = 2,   /* parameters (1.1; CUDA: co2, diloco), outer state fp32; not collectives */
    CO2_DTYPE_FP64 = 3,   /* raw collectives only */
    CO2_DTYPE_INT32 = 4,  /* raw collectives only */
    CO2_DTYPE_INT64 = 5   /* raw collectives only */
};

typedef int32_t co2_device_kind_t;
enum { CO2_DEVICE_HOST = 0, CO2_DEVICE_CUDA = 1 };

typedef int32_t co2_reduce_op_t;
enum { CO2_REDUCE_SUM = 0, CO2_REDUCE_AVG = 1, CO2_REDUCE_MIN = 2, CO2_REDUCE_MAX = 3 };

typedef int32_t co2_transport_kind_t;
enum {
    CO2_TRANSPORT_AUTO = 0,   /* CO2_TRANSPORT env ("auto", "local", "ucx") if set; else UCX when
                                 a launcher (RANK/WORLD_SIZE, OMPI_*, SLURM_*) started several
                                 processes, else local. The choice is logged at CO2_LOG_LEVEL=info */
    CO2_TRANSPORT_LOCAL = 1,  /* ranks are threads of one process */
    CO2_TRANSPORT_UCX = 2,    /* ranks are processes: UCX tag send/recv over TCP or shared memory */
    CO2_TRANSPORT_NCCL = 3    /* ranks are CUDA devices: NCCL collectives on device memory
                                 (builds with the nccl option; CO2_ERR_UNSUPPORTED elsewhere) */
};

typedef int32_t co2_algorithm_t;
enum {
    CO2_ALGO_CO2 = 0,        /* tau local steps, asynchronous one-round-stale outer update */
    CO2_ALGO_SYNC = 1,       /* gradient averaging every step (DDP)                         */
    CO2_ALGO_LOCALSGD = 2,   /* parameter averaging every tau steps                         */
    CO2_ALGO_DILOCO = 3      /* blocking outer update with a fresh average (SlowMo/DiLoCo)  */
};

typedef int32_t co2_penalty_t;
enum {
    CO2_PENALTY_NONE = 0,     /* Lambda = 1                                   */
    CO2_PENALTY_CONSTANT = 1, /* Lambda = 1 / penalty_constant                */
    CO2_PENALTY_GAP = 2       /* Gap-Aware per segment, see docs/algorithm.md */
};

typedef int32_t co2_clip_t;
enum {
    CO2_CLIP_NONE = 0,
    CO2_CLIP_VALUE = 1,  /* element-wise clamp of the momentum to [-phi, phi]      */
    CO2_CLIP_NORM = 2    /* per segment, m <- m * min(1, phi / ||m||)               */
};

typedef int32_t co2_tensor_role_t;
enum {
    CO2_ROLE_PARAMETER = 0, /* trained: takes part in the outer update                       */
    CO2_ROLE_BUFFER = 1,    /* averaged, not trained (BatchNorm statistics): plain averaging  */
    CO2_ROLE_EXCLUDED = 2   /* known to the layout, never touched (per-rank state)           */
};

typedef int32_t co2_param_t;
enum {
    CO2_PARAM_OUTER_LR = 0,              /* alpha, >= 0                                  */
    CO2_PARAM_OUTER_MOMENTUM = 1,        /* beta, [0, 1)                                 */
    CO2_PARAM_TAU = 2,                   /* local steps per round, integer >= 1; takes effect at
                                            the next boundary                             */
    CO2_PARAM_CLIP_THRESHOLD = 3,        /* phi, > 0                                      */
    CO2_PARAM_PENALTY_CONSTANT = 4,      /* c of the constant policy, > 0                 */
    CO2_PARAM_INNER_LR = 5,              /* recorded for penalty policies that need it, >= 0 */
    CO2_PARAM_ANCHOR_CHECK_INTERVAL = 6  /* K rounds between anchor checksum checks, 0 = off */
};

typedef int32_t co2_consensus_t;
enum {
    CO2_CONSENSUS_ANCHOR = 0,       /* the current anchor (no communication; sharded or
                                       hierarchical: waits for this rank's average in flight
                                       and includes it)                             */
    CO2_CONSENSUS_LOCAL_AVERAGE = 1 /* the average of the ranks' current parameters (collective) */
};

/* How the outer all-reduce of co2 and diloco travels (added in 1.1; docs/capi.md, "Wire
 * formats"). Accumulation is always fp32 and the result is bit-identical on every rank. */
typedef int32_t co2_wire_format_t;
enum {
    CO2_WIRE_FP32 = 0, /* 4 bytes per value, exact                                          */
    CO2_WIRE_BF16 = 1, /* 2 bytes per value, round to nearest even                          */
    CO2_WIRE_INT8 = 2, /* 1 byte per value + one fp32 scale per group (max|x| / 127): groups
                          of at most 128 values of one tensor                               */
    CO2_WIRE_FP4 = 3   /* added in 1.2: 4 bits per value (FP4 E2M1: sign, 0, 0.5, 1, 1.5, 2,
                          3, 4, 6) + one fp32 scale per group (max|x| / 6) of at most 64
                          values of one tensor; use it with error feedback                  */
};

/* ------------------------------------------------------------------------------------------ */
/* Handles                                                                                      */
/* ------------------------------------------------------------------------------------------ */

typedef struct co2_comm *co2_comm_t;
typedef struct co2_engine *co2_engine_t;
typedef struct co2_request *co2_request_t;

/* ------------------------------------------------------------------------------------------ */
/* Communicator                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Default "no progress" timeout of a communicator: a blocked operation fails with
 * CO2_ERR_PEER_TIMEOUT when nothing moved for this long (not total time). */
#define CO2_DEFAULT_TIMEOUT_MS 300000u
/* Default size of one pipelined chunk of a collective. */
#define CO2_DEFAULT_CHUNK_BYTES ((uint64_t)1 << 20)

typedef struct co2_comm_config {
    size_t size;                    /* sizeof(co2_comm_config_t)                       */
    uint32_t version;               /* CO2_ABI_VERSION                                  */
    co2_transport_kind_t transport; /* CO2_TRANSPORT_AUTO                               */
    int32_t rank;                   /* this rank, [0, world_size)                       */
    int32_t world_size;             /* number of ranks, >= 1                            */
    const char *group_name;         /* local transport: ranks with equal names form one
                                       group; NULL = "default"                          */
    uint32_t timeout_ms;            /* no-progress timeout, CO2_DEFAULT_TIMEOUT_MS      */
    uint32_t reserved0;             /* 0 (every reserved field: else INVALID_CONFIG)    */
    uint64_t chunk_bytes;           /* collective chunk, CO2_DEFAULT_CHUNK_BYTES        */
    /* --- added in 1.1 (a struct from an older header leaves these at their defaults) --- */
    int32_t device_index;           /* CUDA device of the NCCL transport and of the
                                       engines' device tensors: CO2_DEVICE_INDEX_AUTO   */
    uint32_t reserved1;             /* 0                                                */
    int32_t node_id;                /* the node (host) this rank is on, for
                                       co2_comm_split_nodes: CO2_NODE_ID_AUTO           */
    uint32_t reserved2;             /* 0                                                */
    /* --- added in 1.2 --- */
    uint32_t connections_per_peer;  /* UCX: bulk connections to each peer, 1..16, or
                                       CO2_CONNECTIONS_AUTO (0)                         */
    uint32_t reserved3;             /* 0                                                */
    int32_t elastic_min_ranks;      /* 0: a lost rank fails the group (default); k >= 1:
                                       the survivors re-form while k ranks remain       */
    uint32_t reserved4;             /* 0                                                */
} co2_comm_config_t;

/* device_index default: the launcher's local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
 * SLURM_LOCALID) when one launched the process, otherwise the calling thread's current CUDA
 * device. Host transports ignore it. An engine on an NCCL communicator refuses tensors on
 * another device at commit. */
#define CO2_DEVICE_INDEX_AUTO (-1)

/* node_id (added in 1.1): any value >= 0 names this rank's node; ranks with equal ids share a
 * node. AUTO: the launcher's node (GROUP_RANK of co2run / torchrun, else one derived from
 * RANK, LOCAL_RANK and LOCAL_WORLD_SIZE; SLURM_NODEID under srun), else the host name (Open MPI,
 * or no launcher). See docs/launching.md, "Nodes". */
#define CO2_NODE_ID_AUTO (-1)

/* connections_per_peer (added in 1.2): over UCX, messages to a peer are striped over this many
 * connections (TCP sockets), so that a network that caps each connection below the link's rate
 * (per-flow limits of clouds and WAN paths) still carries the link's rate; the control lane is
 * one more. Every rank must use the same (else CO2_ERR_RENDEZVOUS naming it). AUTO: the
 * environment's CO2_UCX_CONNECTIONS, else 1. The environment variable overrides a set value
 * too. Other transports ignore it. docs/transports.md, "Several connections per peer". */
/* elastic_min_ranks (added in 1.2): with k >= 1, a rank that dies, stalls past timeout_ms or
 * leaves does not end the group. The survivors agree on who is left (without the launcher's
 * store), re-form over UCX, take the outer state of the survivor that applied the most updates
 * (the round in flight is dropped), and the engine call that met the failure returns
 * CO2_MEMBERSHIP_CHANGED. Fewer than k survivors: CO2_ERR_PEER_LOST as with 0. Every rank must
 * use the same. Host tensors with replicated outer state only (else CO2_ERR_UNSUPPORTED at
 * commit); UCX survives every change, the local transport a rank that leaves (co2_engine_leave)
 * only, NCCL none (CO2_ERR_UNSUPPORTED). docs/capi.md, "Elastic membership". */
#define CO2_CONNECTIONS_AUTO 0u
#define CO2_MAX_CONNECTIONS 16u

#define CO2_COMM_CONFIG_INIT                                                               \
    { sizeof(co2_comm_config_t), CO2_ABI_VERSION, CO2_TRANSPORT_AUTO, 0, 1, NULL,         \
      CO2_DEFAULT_TIMEOUT_MS, 0, CO2_DEFAULT_CHUNK_BYTES, CO2_DEVICE_INDEX_AUTO, 0,         \
      CO2_NODE_ID_AUTO, 0, CO2_CONNECTIONS_AUTO, 0, 0, 0 }

co2_status_t co2_comm_config_init(co2_comm_config_t *config);

/* Opaque identifier of a group, produced by one process and broadcast by the caller's own means
 * (torchrun, MPI, srun), NCCL style. co2_get_unique_id starts a small rendezvous server in the
 * calling process (address: CO2_MASTER_ADDR, else the first non-loopback IPv4 address), which
 * stays until a group formed from the id has met in this process (or the process exits). */
#define CO2_UNIQUE_ID_BYTES 128
typedef struct co2_unique_id {
    char internal[CO2_UNIQUE_ID_BYTES];
} co2_unique_id_t;

co2_status_t co2_get_unique_id(co2_unique_id_t *out_id);

/* Collective over the group: blocks until all world_size ranks joined (up to the timeout,
 * then CO2_ERR_RENDEZVOUS). `config` may be NULL for defaults (a group of one).
 * Across processes (UCX), rank 0 serves a rendezvous store at MASTER_ADDR:MASTER_PORT
 * (CO2_MASTER_PORT overrides MASTER_PORT; CO2_AUTH_TOKEN, if set, must match on every rank), and
 * a config whose rank/world_size are the defaults (0, 1) takes them from the launcher's
 * environment (RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_*). See docs/launching.md. */
co2_status_t co2_comm_create(const co2_comm_config_t *config, co2_comm_t *out_comm);

/* NCCL-style creation: `id` from co2_get_unique_id on one process, passed to every rank by the
 * caller's own means (torchrun's store, MPI_Bcast, a file); rank and world_size override the
 * config's fields. Needs no port of ours: the id names a store that the process which made it
 * serves on an ephemeral port. `config` may be NULL for defaults. */
co2_status_t co2_comm_create_with_id(const co2_comm_config_t *config, const co2_unique_id_t *id,
                                     int32_t rank, int32_t world_size, co2_comm_t *out_comm);

/* Collective over `parent` (added in 1.1): every rank of `parent` calls it; the ranks that pass
 * the same `color` form a new communicator, ranked by (`key`, parent rank); a rank that passes
 * CO2_SPLIT_NONE joins none and gets *out_comm = NULL. The new groups are formed through ids
 * that the parent exchanges (no launcher port is needed) and use the parent's kind of
 * transport (an NCCL parent's groups are NCCL, on the parent's device), unless `config` says
 * otherwise. `config` (may be NULL: the parent's timeout and chunk size) gives the transport,
 * timeout, chunk size and device of the new communicators; its rank, world_size and
 * group_name are ignored. The parent stays usable. Hierarchies are built this way: e.g. the
 * ranks of one node (color = node, key = local rank) and the ranks with one local rank across
 * nodes (color = local rank, key = node). */
#define CO2_SPLIT_NONE (-1)
co2_status_t co2_comm_split(co2_comm_t parent, int32_t color, int32_t key, const co2_comm_config_t *config,
                            co2_comm_t *out_comm);

/* Collective over `parent` (added in 1.1): splits it by node, for hierarchical training.
 * *intra_node: the ranks of this rank's node, ranked by parent rank (its rank is the local
 * index). *inter_node: the ranks with this local index on every node, ranked by node (its rank
 * is the node index; nodes are numbered 0.. in the order of their lowest parent rank). Which
 * node a rank is on: `config->node_id` if >= 0, else the node_id the parent was created with if
 * >= 0, else CO2_NODE_ID_AUTO's resolution (see node_id). Every node must hold the same number
 * of ranks: otherwise every rank fails with CO2_ERR_INVALID_ARGUMENT naming the node sizes, and
 * no communicator is made. `config` (may be NULL) is read as by co2_comm_split. Both new
 * communicators are destroyed by the caller; the parent stays usable. */
co2_status_t co2_comm_split_nodes(co2_comm_t parent, const co2_comm_config_t *config, co2_comm_t *intra_node,
                                  co2_comm_t *inter_node);

co2_status_t co2_comm_rank(co2_comm_t comm, int32_t *out_rank);
co2_status_t co2_comm_size(co2_comm_t comm, int32_t *out_size);

/* Fails every pending and future operation of this communicator (and its peers') with
 * CO2_ERR_ABORTED. Safe from any thread, also while another thread is blocked in a call. */
co2_status_t co2_comm_abort(co2_comm_t comm);

/* Releases the caller's reference. Engines created on the communicator keep it alive. */
co2_status_t co2_comm_destroy(co2_comm_t comm);

/* ------------------------------------------------------------------------------------------ */
/* Raw asynchronous collectives (gradients, metrics)                                             */
/* ------------------------------------------------------------------------------------------ */

/* In-place all-reduce of `count` elements of `buffer`; the buffer must stay valid and untouched
 * until the request completes. The result is bit-identical on every rank.
 * CUDA device memory needs an NCCL communicator (a host transport returns
 * CO2_ERR_INVALID_ARGUMENT for it); the collective then starts after the work enqueued on
 * `stream` (the caller's cudaStream_t; NULL = the legacy default stream) so far. `stream` is
 * ignored for host memory. */
co2_status_t co2_allreduce(co2_comm_t comm, void *buffer, size_t count, co2_dtype_t dtype,
                           co2_reduce_op_t op, void *stream, co2_request_t *out_request);

/* In-place broadcast from `root`. */
co2_status_t co2_broadcast(co2_comm_t comm, void *buffer, size_t count, co2_dtype_t dtype,
                           int32_t root, void *stream, co2_request_t *out_request);

/* *out_done = 1 when complete. A failed request returns its failure status. */
co2_status_t co2_request_test(co2_request_t request, int *out_done);

/* Waits up to timeout_ms (< 0: until completion or the communicator's no-progress timeout).
 * CO2_ERR_TIMEOUT leaves the request pending and usable. */
co2_status_t co2_request_wait(co2_request_t request, int64_t timeout_ms);

/* Frees the handle; an incomplete request is waited for first (its buffer is in use). */
co2_status_t co2_request_free(co2_request_t request);

/* ------------------------------------------------------------------------------------------ */
/* Engine                                                                                       */
/* ------------------------------------------------------------------------------------------ */

#define CO2_DEFAULT_TAU 12u
#define CO2_DEFAULT_OUTER_LR 1.0
#define CO2_OUTER_MOMENTUM_AUTO (-1.0) /* resolve by number of outer participants */
#define CO2_DEFAULT_CLIP_THRESHOLD 1.0
#define CO2_DEFAULT_ANCHOR_CHECK_INTERVAL 100u
#define CO2_EAGER_AUTO (-1) /* eager (co2, host and CUDA tensors) */
#define CO2_DEFAULT_EAGER CO2_EAGER_AUTO
#define CO2_DEFAULT_ERROR_FEEDBACK 1
/* When co2 applies a round's average (co2_engine_config_t.apply_step, added in 1.2). */
#define CO2_APPLY_AT_BOUNDARY 0    /* at the next boundary, tau steps after its all-reduce began */
#define CO2_APPLY_ON_ARRIVAL (-1)  /* one step after it is due, by the ranks' agreed timings       */
#define CO2_DEFAULT_APPLY_STEP CO2_APPLY_AT_BOUNDARY

typedef struct co2_engine_config {
    size_t size;                 /* sizeof(co2_engine_config_t)                          */
    uint32_t version;            /* CO2_ABI_VERSION                                       */
    co2_algorithm_t algorithm;   /* CO2_ALGO_CO2                                          */
    uint32_t tau;                /* CO2_DEFAULT_TAU                                       */
    uint32_t warmup_sync_rounds; /* boundaries run as diloco before co2 starts, 0         */
    double outer_lr;             /* alpha, CO2_DEFAULT_OUTER_LR                           */
    double outer_momentum;       /* beta, CO2_OUTER_MOMENTUM_AUTO                         */
    int32_t nesterov;            /* 0                                                     */
    co2_penalty_t penalty;       /* CO2_PENALTY_NONE                                      */
    double penalty_constant;     /* 1.0                                                   */
    co2_clip_t clip;             /* CO2_CLIP_NONE                                         */
    uint32_t anchor_check_interval; /* CO2_DEFAULT_ANCHOR_CHECK_INTERVAL                  */
    double clip_threshold;       /* phi, CO2_DEFAULT_CLIP_THRESHOLD                       */
    double inner_lr;             /* recorded only, 0                                      */
    co2_dtype_t state_dtype;     /* outer state dtype, CO2_DTYPE_FP32 (the only one)      */
    int32_t reserved0;           /* 0 (reserved fields: else CO2_ERR_INVALID_CONFIG)      */
    /* --- added in 1.1 (a struct from an older header leaves these at their defaults) --- */
    int32_t eager;               /* co2 only: 1 = the eager outer policy (each rank starts
                                    its round from the anchor plus its own fresh delta's
                                    share; docs/algorithm.md), 0 = delayed, CO2_EAGER_AUTO =
                                    eager (host and CUDA tensors); CO2_DEFAULT_EAGER (auto) */
    int32_t reserved1;           /* 0                                                     */
    /* --- added in 1.1: compressed outer all-reduce (co2, diloco; CUDA: point-to-point only) --- */
    co2_wire_format_t wire_format; /* CO2_WIRE_FP32; others need a point-to-point transport  */
    int32_t error_feedback;        /* 1: each rank adds what its encodings dropped to its next
                                      delta (checkpointed; deltas only: co2's BUFFER values are
                                      sent as they are); 0: drop it. CO2_DEFAULT_ERROR_FEEDBACK */
    /* --- added in 1.1: sharded outer state --- */
    int32_t shard_outer_state;     /* 0 = every rank holds the whole anchor and momentum (default);
                                      1 = each rank holds only its shard of them (reduce-scatter,
                                      shard update, all-gather; docs/capi.md). The engine refuses
                                      what sharding does not implement yet, naming it. The anchor
                                      check cannot see a shard its owner computed wrongly
                                      (docs/algorithm.md, "The invariant") */
    int32_t hierarchy;             /* CO2_HIERARCHY_FLAT (default): every rank is an outer
                                      participant; CO2_HIERARCHY_NODES: sync inside a node
                                      (average every step's gradients over the node's ranks:
                                      co2_engine_reduce_gradients, or the framework's own data
                                      parallelism), co2 across nodes, outer state sharded over a
                                      node's ranks; nodes as co2_comm_split_nodes forms them */
    /* --- added in 1.2: applying the average when it arrives (co2; docs/algorithm.md,
     *     "Applying the average on arrival") --- */
    int32_t apply_step;            /* when the average of a boundary's all-reduce is applied:
                                      CO2_APPLY_AT_BOUNDARY (0) at the next boundary;
                                      CO2_APPLY_ON_ARRIVAL (-1) one step after the step in which
                                      it is due to arrive, by the ranks' agreed step and
                                      all-reduce times (the tau advisor's; the boundary until
                                      both are measured), the same step on every rank;
                                      k >= 1: at the k-th step after the boundary, waiting there
                                      for it if it has not arrived (k >= tau: at the boundary).
                                      Each rank keeps its progress since the boundary on top of
                                      the new anchor. co2 only; sharded outer state on CUDA
                                      tensors: CO2_ERR_UNSUPPORTED at commit;
                                      CO2_DEFAULT_APPLY_STEP                                   */
    int32_t reserved2;             /* 0                                                        */
} co2_engine_config_t;

#define CO2_HIERARCHY_FLAT 0
#define CO2_HIERARCHY_NODES 1

#define CO2_ENGINE_CONFIG_INIT                                                             \
    { sizeof(co2_engine_config_t), CO2_ABI_VERSION, CO2_ALGO_CO2, CO2_DEFAULT_TAU, 0,     \
      CO2_DEFAULT_OUTER_LR, CO2_OUTER_MOMENTUM_AUTO, 0, CO2_PENALTY_NONE, 1.0,            \
      CO2_CLIP_NONE, CO2_DEFAULT_ANCHOR_CHECK_INTERVAL, CO2_DEFAULT_CLIP_THRESHOLD, 0.0,  \
      CO2_DTYPE_FP32, 0, CO2_DEFAULT_EAGER, 0, CO2_WIRE_FP32, CO2_DEFAULT_ERROR_FEEDBACK,  \
      0, 0, CO2_DEFAULT_APPLY_STEP, 0 }

co2_status_t co2_engine_config_init(co2_engine_config_t *config);

/* A tensor the framework owns. `name` is copied; `data` must stay valid for the engine's life. */
typedef struct co2_tensor {
    size_t size;               /* sizeof(co2_tensor_t)          */
    const char *name;          /* unique, non-empty             */
    void *data;
    size_t count;              /* elements, >= 1                */
    co2_dtype_t dtype;         /* CO2_DTYPE_FP32; BF16 / FP16 on the host (read widened to fp32,
                                  written rounded to nearest even; docs/capi.md) */
    co2_device_kind_t device;  /* CO2_DEVICE_HOST               */
    int32_t device_index;
    co2_tensor_role_t role;    /* CO2_ROLE_PARAMETER            */
} co2_tensor_t;

#define CO2_TENSOR_INIT \
    { sizeof(co2_tensor_t), NULL, NULL, 0, CO2_DTYPE_FP32, CO2_DEVICE_HOST, 0, CO2_ROLE_PARAMETER }

/* *tensor = CO2_TENSOR_INIT, for languages that cannot use the macro. */
co2_status_t co2_tensor_init(co2_tensor_t *tensor);

/* A named range of the engine's flat parameter storage. */
typedef struct co2_segment {
    size_t size;             /* sizeof(co2_segment_t) */
    const char *name;        /* unique, non-empty     */
    size_t offset;           /* in elements           */
    size_t count;            /* elements, >= 1        */
    co2_tensor_role_t role;  /* CO2_ROLE_PARAMETER    */
    int32_t reserved0;       /* 0                     */
} co2_segment_t;

#define CO2_SEGMENT_INIT { sizeof(co2_segment_t), NULL, 0, 0, CO2_ROLE_PARAMETER, 0 }

/* *segment = CO2_SEGMENT_INIT, for languages that cannot use the macro. */
co2_status_t co2_segment_init(co2_segment_t *segment);

/* `config` may be NULL for defaults. The engine keeps `comm` alive. With CO2_METRICS_PORT set it
 * joins the process's Prometheus endpoint (docs/observability.md, "Metrics"): a malformed value
 * or a port that cannot be listened on is CO2_ERR_INVALID_ARGUMENT, a build without
 * prometheus-cpp CO2_ERR_UNSUPPORTED. */
co2_status_t co2_engine_create(co2_comm_t comm, const co2_engine_config_t *config,
                               co2_engine_t *out_engine);
co2_status_t co2_engine_destroy(co2_engine_t engine);

/* Layout, before co2_engine_commit. */
co2_status_t co2_engine_register_tensor(co2_engine_t engine, const co2_tensor_t *tensor);

/* Runtime-owned flat storage of `count` zero-initialised elements of `dtype` (segments take it);
 * *out_data is valid until the engine is destroyed. At most one flat storage (owned or adopted)
 * per engine. */
co2_status_t co2_engine_alloc_flat(co2_engine_t engine, size_t count, co2_dtype_t dtype,
                                   co2_device_kind_t device, int32_t device_index,
                                   void **out_data);
/* Adopts flat storage of `count` elements of `dtype` the framework allocated (it must outlive
 * the engine). */
co2_status_t co2_engine_adopt_flat(co2_engine_t engine, void *data, size_t count,
                                   co2_dtype_t dtype, co2_device_kind_t device,
                                   int32_t device_index);
/* Declares a segment of the flat storage; segments must not overlap. */
co2_status_t co2_engine_add_segment(co2_engine_t engine, const co2_segment_t *segment);

/* Device memory for the engine's CUDA state (anchor, momentum, comm buffer, flat storage, scratch)
 * from the caller's allocator (a framework's caching allocator) instead of cudaMalloc. `allocate`
 * returns `bytes` of device memory on device `device_index` usable on `stream` (the runtime's
 * stream that uses it first), or NULL; `release` gives it back. Both are called from the thread
 * that drives the engine. */
typedef struct co2_allocator {
    size_t size;  /* sizeof(co2_allocator_t) */
    void *user;   /* passed back to both callbacks */
    void *(*allocate)(void *user, size_t bytes, int32_t device_index, void *stream);
    void (*release)(void *user, void *ptr, size_t bytes, int32_t device_index, void *stream);
} co2_allocator_t;

#define CO2_ALLOCATOR_INIT { sizeof(co2_allocator_t), NULL, NULL, NULL }

/* Before any CUDA tensor, flat storage or commit: the engine allocates its device memory through
 * `allocator` (copied; NULL restores cudaMalloc). CO2_ERR_UNSUPPORTED in builds without CUDA. */
co2_status_t co2_engine_set_allocator(co2_engine_t engine, const co2_allocator_t *allocator);

/* Collective. Freezes the layout, checks that every rank registered the same layout and created
 * its engine with the same settings (every field that changes the math or the collectives;
 * CO2_ERR_LAYOUT_MISMATCH naming the first difference), broadcasts rank 0's parameters and
 * buffers into every rank's tensors and anchor, and allocates the outer state. */
co2_status_t co2_engine_commit(co2_engine_t engine);

/* Call after every inner optimizer step. On a boundary (every tau-th call) runs the outer
 * update. *out_boundary (may be NULL) = 1 if this call was a boundary. `stream` is the caller's
 * CUDA stream for device tensors, ignored on the host. */
co2_status_t co2_engine_step(co2_engine_t engine, void *stream, int *out_boundary);

/* Averages gradients across ranks, in place, blocking. grads[i] is the gradient of the i-th
 * CO2_ROLE_PARAMETER tensor/segment in registration order, with that tensor's count and dtype
 * (bf16/fp16 gradients are averaged in fp32 and rounded once).
 * Pass the pointers on every call (frameworks reallocate gradients). A NULL entry contributes
 * zeros and receives nothing. num_grads must equal the number of trained tensors. */
co2_status_t co2_engine_reduce_gradients(co2_engine_t engine, void *const *grads,
                                         size_t num_grads, void *stream);

/* Collective. Finishes what is in flight, applies it, averages the ranks' current parameters
 * into one more outer update if steps happened since the last boundary, and leaves every rank
 * with the identical model (parameters = anchor); compares anchor checksums. The next round
 * starts afresh. */
co2_status_t co2_engine_synchronize(co2_engine_t engine);

/* Collective. End of training: co2_engine_synchronize, for every algorithm and policy (the
 * pending average and the steps since the last boundary are applied: no step's work is lost),
 * and the run's summary is written (log line, trace). */
co2_status_t co2_engine_finalize(co2_engine_t engine);

/* Added in 1.2. Asks to leave the elastic group (elastic_min_ranks >= 1) without ending it: a
 * clean goodbye, for a process that is told to go (a spot instance's notice, a scheduler taking
 * the node back). Returns at once; keep calling co2_engine_step as before. The ranks agree on
 * the leave with the tau advisor's agreement (at the second boundary after the request); there
 * every rank synchronizes, so that the leaving rank's work is in the anchor and no rank's steps
 * are lost, and then
 *  - on this rank co2_engine_step returns CO2_LEFT: its parameters are the anchor, the engine
 *    takes no more steps (stats, save and destroy still work), the communicator fails every
 *    later collective with CO2_LEFT; destroy both;
 *  - on the others it returns CO2_MEMBERSHIP_CHANGED with the group one smaller, without
 *    waiting for any timeout.
 * Several ranks that ask leave one per agreement, highest rank first. While a leave is pending,
 * co2_engine_finalize and co2_engine_synchronize fail with CO2_ERR_INVALID_STATE (the others
 * would not run them). Errors: CO2_ERR_UNSUPPORTED when the group is not elastic,
 * CO2_ERR_INVALID_STATE before commit or when the group has one rank.
 * docs/capi.md, "Leaving". */
co2_status_t co2_engine_leave(co2_engine_t engine);

/* Writes the consensus model (fp32, all PARAMETER and BUFFER elements in registration order,
 * `count` = co2_engine_num_elements) into `out` without changing the trajectory.
 * CO2_CONSENSUS_ANCHOR pairs no collective (one rank may call it alone);
 * CO2_CONSENSUS_LOCAL_AVERAGE is collective. */
co2_status_t co2_engine_consensus(co2_engine_t engine, co2_consensus_t kind, float *out,
                                  size_t count);

/* Number of elements that take part in averaging (PARAMETER + BUFFER), after commit. */
co2_status_t co2_engine_num_elements(co2_engine_t engine, size_t *out_count);

co2_status_t co2_engine_set_param(co2_engine_t engine, co2_param_t key, double value);
co2_status_t co2_engine_get_param(co2_engine_t engine, co2_param_t key, double *out_value);

typedef struct co2_engine_stats {
    size_t size;                   /* sizeof(co2_engine_stats_t), set by the caller (at least
                                      136, the first published size); the library writes
                                      min(size, its sizeof) bytes and sets size to that         */
    uint32_t version;              /* written: the library's CO2_ABI_VERSION                  */
    int32_t world_size;
    uint64_t steps;                /* calls to co2_engine_step                                */
    uint64_t rounds;               /* boundaries                                              */
    uint64_t outer_updates;        /* boundaries that applied an outer update                 */
    uint64_t bytes_reduced;        /* payload bytes handed to all-reduce                      */
    uint64_t collective_ns;        /* sum over collectives of submit-to-completion time       */
    uint64_t boundary_wait_ns;     /* time the training thread waited for collectives         */
    uint64_t last_boundary_wait_ns;
    uint64_t nonfinite_rounds;     /* boundaries that applied nothing because of NaN/Inf      */
    uint64_t nonfinite_local;      /* boundaries whose local delta was non-finite             */
    uint64_t anchor_checks;        /* anchor checksum comparisons done                        */
    double resolved_outer_momentum;/* beta in use                                             */
    double last_penalty_min;       /* Lambda over segments at the last update                 */
    double last_penalty_max;
    double last_clip_scale_min;    /* norm clip: smallest factor (1 = none clipped)           */
    double last_clip_fraction;     /* value clip: fraction of momentum elements clamped;
                                      norm clip: fraction of segments scaled                   */
    /* The tau advisor (smoothed means; 0 until measured). A caller whose header predates
     * these fields passes a smaller size and does not receive them. Since 1.1 agreed by the
     * ranks (the same on every rank), see rank_step_time_ns below for this rank's own. */
    uint64_t step_time_ns;         /* one training step: the caller's time between engine calls,
                                      of the slowest rank                                        */
    uint64_t allreduce_time_ns;    /* one all-reduce, submit to completion, the shortest of the
                                      ranks' (on the others it includes waiting for the slowest) */
    uint32_t advised_tau;          /* smallest tau with tau * step_time_ns >= allreduce_time_ns:
                                      the co2 all-reduce then finishes within the next round    */
    uint32_t reserved0;
    /* Added in 1.1 -- observability: the overlap read without arithmetic. The collectives
     * counted are those the training thread waited for (plus, on the device path, those the
     * NCCL stream completed); 0 until the first one completed. */
    uint64_t last_collective_ns;   /* submit to completion of the last one (co2: the all-reduce
                                      of the round before the last boundary)                     */
    uint64_t last_round_ns;        /* wall time between the last two boundaries                  */
    double hidden_fraction;        /* 1 - boundary_wait_ns / collective_ns, in [0, 1]: the share
                                      of collective time the training thread did not wait        */
    double last_hidden_fraction;   /* 1 - last_boundary_wait_ns / last_collective_ns, in [0, 1]  */
    uint64_t rank_step_time_ns;    /* this rank's own step time (what the ranks combine)         */
    uint64_t rank_allreduce_time_ns; /* this rank's own all-reduce time                          */
    /* --- added in 1.1: compressed outer all-reduce --- */
    uint64_t wire_bytes_last_round; /* bytes this rank sent for the last outer all-reduce       */
    uint64_t wire_bytes_total;      /* ... and for all of them (the fp32 payload: bytes_reduced) */
    /* --- added in 1.1: sharded outer state --- */
    uint64_t outer_state_bytes;     /* bytes of outer state (anchor, momentum, their shards,
                                       buffers) this rank's engine holds                         */
    /* --- added in 1.2: applying the average on arrival --- */
    uint64_t arrival_updates;       /* co2 averages applied between boundaries (apply_step)      */
    uint32_t last_apply_step;       /* the step of its round at which the last co2 average was
                                       applied; 0: at a boundary                                 */
    uint32_t reserved1;
} co2_engine_stats_t;

#define CO2_ENGINE_STATS_INIT                                                              \
    { sizeof(co2_engine_stats_t), CO2_ABI_VERSION, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0,     \
      1.0, 1.0, 1.0, 0.0, 0, 0, 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0 }

/* *stats = CO2_ENGINE_STATS_INIT, for languages that cannot use the macro. */
co2_status_t co2_engine_stats_init(co2_engine_stats_t *stats);

co2_status_t co2_engine_get_stats(co2_engine_t engine, co2_engine_stats_t *out_stats);

/* ------------------------------------------------------------------------------------------ */
/* Checkpoint of the engine state: the shared part (anchor, momentum, in-flight average,         */
/* counters, penalty history, resolved beta, layout hash, world size, config) and, with the     */
/* eager policy or error feedback, this rank's own part (its eager offsets, its residual;       */
/* restored on the same rank at the same world size only). Formats 1-6: docs/capi.md. The      */
/* framework's per-rank state (local parameters mid-round, inner optimizer) is its to save.    */
/* ------------------------------------------------------------------------------------------ */

/* Return 0 on success, anything else aborts the save/load with CO2_ERR_CALLBACK. A read
 * callback must fill exactly `length` bytes. */
typedef int (*co2_write_fn)(void *user, const void *data, size_t length);
typedef int (*co2_read_fn)(void *user, void *data, size_t length);

/* Collective (it waits for the in-flight average and compares anchor checksums). Streams the
 * state through `write`; ranks that do not write pass write = NULL. A blob with per-rank state
 * (eager, error feedback) holds the writing rank's: for a bit-exact resume every rank saves and
 * loads its own. An engine with sharded outer state (shard_outer_state, hierarchy NODES) writes
 * this rank's shard only (format 6, since 1.1: no full-size copy is made): every rank must
 * write its own blob, which loads only on the same rank of the same sharded engine; for one
 * file that loads anywhere, use co2_engine_save_portable. */
co2_status_t co2_engine_save(co2_engine_t engine, co2_write_fn write, void *user);

/* Exact size in bytes that co2_engine_save writes, after commit. */
co2_status_t co2_engine_state_size(co2_engine_t engine, size_t *out_bytes);

/* Added in 1.1. Collective. The replicated format (the shared state whole, one blob that
 * loads at any world size, with or without sharding; per-rank state as co2_engine_save): what
 * co2_engine_save writes for an engine that does not shard. A sharded engine assembles it one
 * segment at a time from the ranks' shards (every rank takes part; ranks that do not write pass
 * write = NULL). */
co2_status_t co2_engine_save_portable(co2_engine_t engine, co2_write_fn write, void *user);

/* Added in 1.1. Exact size in bytes that co2_engine_save_portable writes, after commit. */
co2_status_t co2_engine_portable_state_size(co2_engine_t engine, size_t *out_bytes);

/* Restores the state after commit and sets the parameters to the restored anchor (restore
 * per-rank mid-round parameters afterwards). Not collective, except for an engine with sharded
 * outer state, whose ranks all load together (each its own per-rank blob, or each the portable
 * one) and agree on the outcome: if one rank's blob is bad, every rank fails and none loads.
 * Transactional: a corrupted or mismatched blob leaves the engine as it was; a blob whose
 * anchor, momentum or eager state is not finite (which no writer saves) is
 * CO2_ERR_CHECKPOINT_CORRUPT. Accepts a portable blob saved at another world size (per-rank
 * state is then dropped); a per-rank shard on another rank or engine is
 * CO2_ERR_CHECKPOINT_MISMATCH. */
co2_status_t co2_engine_load(co2_engine_t engine, co2_read_fn read, void *user);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CO2_CO2_H */

# Types of co2.capi, the module SWIG generates from capi.i (the generated capi.py carries none).
# One entry per name the module defines; tests/bindings/python/test_typing.py runs mypy's
# stubtest against the built module, so a function, constant or field added to co2.h / capi.i
# and missing here (or a parameter renamed) fails that test.
#
# Handles are SWIG pointer objects at run time; here each kind has its own opaque class, so a
# checker catches an engine handle passed where a communicator is expected. Enum values are
# plain ints (the C enums' values).
from typing import Any, BinaryIO, Callable, Optional, Sequence, Union, final

import numpy as np
import numpy.typing as npt

@final
class _Comm: ...
@final
class _Engine: ...
@final
class _Request: ...

# An address (int) of host or device memory, or of a CUDA stream; None for the null pointer.
_Address = Optional[int]
_Array = npt.NDArray[Any]
_Float32Array = npt.NDArray[np.float32]
# The factory co2/_errors.py installs: (status, function, status_string, detail) -> exception.
_ErrorFactory = Callable[[int, str, str, str], BaseException]
_Readable = Any   # a binary file object: .read(n) -> bytes
_Writable = Any   # a binary file object: .write(bytes)

def _set_error_factory(factory: _ErrorFactory) -> None: ...

CO2_VERSION_MAJOR: int
CO2_VERSION_MINOR: int
CO2_VERSION_PATCH: int
CO2_ABI_VERSION: int

CO2_OK: int
CO2_ERR_INVALID_ARGUMENT: int
CO2_ERR_INVALID_STATE: int
CO2_ERR_UNSUPPORTED: int
CO2_ERR_INVALID_CONFIG: int
CO2_ERR_UNKNOWN_ENUM: int
CO2_ERR_DUPLICATE_TENSOR: int
CO2_ERR_OUT_OF_MEMORY: int
CO2_ERR_NONFINITE: int
CO2_ERR_LAYOUT_MISMATCH: int
CO2_ERR_ANCHOR_MISMATCH: int
CO2_ERR_CHECKPOINT_CORRUPT: int
CO2_ERR_CHECKPOINT_MISMATCH: int
CO2_ERR_CALLBACK: int
CO2_ERR_TIMEOUT: int
CO2_MEMBERSHIP_CHANGED: int
CO2_LEFT: int
CO2_ERR_PEER_LOST: int
CO2_ERR_PEER_TIMEOUT: int
CO2_ERR_COLLECTIVE_MISMATCH: int
CO2_ERR_ABORTED: int
CO2_ERR_TRANSPORT: int
CO2_ERR_RENDEZVOUS: int
CO2_ERR_INTERNAL: int

def status_string(status: int) -> str: ...
def last_error_message() -> str: ...
def get_version() -> list[int]: ...   # [major, minor, patch]

CO2_DTYPE_FP32: int
CO2_DTYPE_BF16: int
CO2_DTYPE_FP16: int
CO2_DTYPE_FP64: int
CO2_DTYPE_INT32: int
CO2_DTYPE_INT64: int
CO2_DEVICE_HOST: int
CO2_DEVICE_CUDA: int
CO2_REDUCE_SUM: int
CO2_REDUCE_AVG: int
CO2_REDUCE_MIN: int
CO2_REDUCE_MAX: int
CO2_TRANSPORT_AUTO: int
CO2_TRANSPORT_LOCAL: int
CO2_TRANSPORT_UCX: int
CO2_TRANSPORT_NCCL: int
CO2_ALGO_CO2: int
CO2_ALGO_SYNC: int
CO2_ALGO_LOCALSGD: int
CO2_ALGO_DILOCO: int
CO2_PENALTY_NONE: int
CO2_PENALTY_CONSTANT: int
CO2_PENALTY_GAP: int
CO2_CLIP_NONE: int
CO2_CLIP_VALUE: int
CO2_CLIP_NORM: int
CO2_ROLE_PARAMETER: int
CO2_ROLE_BUFFER: int
CO2_ROLE_EXCLUDED: int
CO2_PARAM_OUTER_LR: int
CO2_PARAM_OUTER_MOMENTUM: int
CO2_PARAM_TAU: int
CO2_PARAM_CLIP_THRESHOLD: int
CO2_PARAM_PENALTY_CONSTANT: int
CO2_PARAM_INNER_LR: int
CO2_PARAM_ANCHOR_CHECK_INTERVAL: int
CO2_CONSENSUS_ANCHOR: int
CO2_CONSENSUS_LOCAL_AVERAGE: int
CO2_WIRE_FP32: int
CO2_WIRE_BF16: int
CO2_WIRE_INT8: int
CO2_WIRE_FP4: int
CO2_DEFAULT_TIMEOUT_MS: int
CO2_DEVICE_INDEX_AUTO: int
CO2_NODE_ID_AUTO: int
CO2_CONNECTIONS_AUTO: int
CO2_MAX_CONNECTIONS: int
CO2_UNIQUE_ID_BYTES: int
CO2_SPLIT_NONE: int
CO2_DEFAULT_TAU: int
CO2_DEFAULT_OUTER_LR: float
CO2_OUTER_MOMENTUM_AUTO: float
CO2_DEFAULT_CLIP_THRESHOLD: float
CO2_DEFAULT_ANCHOR_CHECK_INTERVAL: int
CO2_EAGER_AUTO: int
CO2_DEFAULT_EAGER: int
CO2_DEFAULT_ERROR_FEEDBACK: int
CO2_HIERARCHY_FLAT: int
CO2_HIERARCHY_NODES: int
CO2_APPLY_AT_BOUNDARY: int
CO2_APPLY_ON_ARRIVAL: int
CO2_DEFAULT_APPLY_STEP: int

class comm_config:
    """co2_comm_config_t, initialised by co2_comm_config_init."""
    thisown: bool
    @property
    def size(self) -> int: ...
    @property
    def version(self) -> int: ...
    transport: int
    rank: int
    world_size: int
    timeout_ms: int
    chunk_bytes: int
    device_index: int
    node_id: int
    connections_per_peer: int
    elastic_min_ranks: int
    def __init__(self) -> None: ...

class engine_config:
    """co2_engine_config_t, initialised by co2_engine_config_init."""
    thisown: bool
    @property
    def size(self) -> int: ...
    @property
    def version(self) -> int: ...
    algorithm: int
    tau: int
    warmup_sync_rounds: int
    outer_lr: float
    outer_momentum: float
    nesterov: int
    penalty: int
    penalty_constant: float
    clip: int
    anchor_check_interval: int
    clip_threshold: float
    inner_lr: float
    state_dtype: int
    eager: int
    wire_format: int
    error_feedback: int
    shard_outer_state: int
    hierarchy: int
    apply_step: int
    reserved1: int
    reserved2: int
    def __init__(self) -> None: ...

class allocator:
    """co2_allocator_t: C function pointers, not settable from Python."""
    thisown: bool
    size: int
    user: Any
    allocate: Any
    release: Any
    def __init__(self) -> None: ...

class engine_stats:
    """co2_engine_stats_t as co2_engine_get_stats fills it (co2.Engine.stats() gives a dict)."""
    thisown: bool
    size: int
    version: int
    world_size: int
    steps: int
    rounds: int
    outer_updates: int
    bytes_reduced: int
    collective_ns: int
    boundary_wait_ns: int
    last_boundary_wait_ns: int
    nonfinite_rounds: int
    nonfinite_local: int
    anchor_checks: int
    resolved_outer_momentum: float
    last_penalty_min: float
    last_penalty_max: float
    last_clip_scale_min: float
    last_clip_fraction: float
    step_time_ns: int
    allreduce_time_ns: int
    advised_tau: int
    reserved0: int
    last_collective_ns: int
    last_round_ns: int
    hidden_fraction: float
    last_hidden_fraction: float
    rank_step_time_ns: int
    rank_allreduce_time_ns: int
    wire_bytes_last_round: int
    wire_bytes_total: int
    outer_state_bytes: int
    arrival_updates: int
    last_apply_step: int
    reserved1: int
    def __init__(self) -> None: ...

# Communicators and raw collectives.
def comm_create(config: comm_config, group_name: Optional[str]) -> _Comm: ...
def comm_create_with_id(config: comm_config, group_name: Optional[str], ID: bytes, rank: int,
                        world_size: int) -> _Comm: ...
def comm_split(parent: _Comm, color: int, key: int,
               config: Optional[comm_config]) -> Optional[_Comm]: ...
def comm_split_nodes(parent: _Comm, config: Optional[comm_config]) -> list[_Comm]: ...
def comm_rank(comm: _Comm) -> int: ...
def comm_size(comm: _Comm) -> int: ...
def comm_abort(comm: _Comm) -> None: ...
def comm_destroy(comm: _Comm) -> None: ...
def get_unique_id() -> bytes: ...
def allreduce(comm: _Comm, buffer: _Array, op: int, stream: _Address) -> _Request: ...
def broadcast(comm: _Comm, buffer: _Array, root: int, stream: _Address) -> _Request: ...
def allreduce_address(comm: _Comm, address: _Address, count: int, dtype: int, op: int,
                      stream: _Address) -> _Request: ...
def broadcast_address(comm: _Comm, address: _Address, count: int, dtype: int, root: int,
                      stream: _Address) -> _Request: ...
def request_test(request: _Request) -> int: ...
def request_wait(request: _Request, timeout_ms: int) -> None: ...
def request_free(request: _Request) -> None: ...

# Engines.
def tensor_init(tensor: Any) -> None: ...
def segment_init(segment: Any) -> None: ...
def engine_create(comm: _Comm, config: engine_config) -> _Engine: ...
def engine_destroy(engine: _Engine) -> None: ...
def engine_adopt_flat(engine: _Engine, data: _Address, count: int, dtype: int, device: int,
                      device_index: int) -> None: ...
def engine_set_allocator(engine: _Engine, allocator: Optional[allocator]) -> None: ...
def engine_register_array(engine: _Engine, name: str, array: _Float32Array,
                          role: int) -> None: ...
def engine_register_address(engine: _Engine, name: str, address: _Address, count: int,
                            dtype: int, device: int, device_index: int, role: int) -> None: ...
def engine_adopt_flat_array(engine: _Engine, array: _Float32Array) -> None: ...
def engine_adopt_flat_address(engine: _Engine, address: _Address, count: int, dtype: int,
                              device: int, device_index: int) -> None: ...
def engine_add_segment(engine: _Engine, name: str, offset: int, count: int,
                       role: int) -> None: ...
def engine_commit(engine: _Engine) -> None: ...
def engine_step(engine: _Engine, stream: _Address) -> int: ...
# One entry per PARAMETER tensor: a float32 numpy array, an address, or None (zeros).
def engine_reduce_gradients(engine: _Engine, grads: Sequence[Union[_Float32Array, int, None]],
                            stream: _Address) -> None: ...
def engine_synchronize(engine: _Engine) -> None: ...
def engine_finalize(engine: _Engine) -> None: ...
def engine_leave(engine: _Engine) -> None: ...
def engine_consensus(engine: _Engine, kind: int, out: _Float32Array) -> None: ...
def engine_consensus_address(engine: _Engine, kind: int, out: _Address, count: int) -> None: ...
def engine_num_elements(engine: _Engine) -> int: ...
def engine_set_param(engine: _Engine, key: int, value: float) -> None: ...
def engine_get_param(engine: _Engine, key: int) -> float: ...
def engine_stats_init(stats: engine_stats) -> None: ...
def engine_get_stats(engine: _Engine) -> engine_stats: ...
def engine_state_size(engine: _Engine) -> int: ...
def engine_portable_state_size(engine: _Engine) -> int: ...
def engine_save_bytes(engine: _Engine, keep: int, portable: int) -> Optional[bytes]: ...
def engine_load_bytes(engine: _Engine, blob: Union[bytes, bytearray, memoryview]) -> None: ...
def engine_save_to(engine: _Engine, file: Optional[_Writable], portable: int) -> None: ...
def engine_load_from(engine: _Engine, file: _Readable) -> None: ...

"""co2.Engine: the algorithm's state for one rank, driven from the training thread."""
from __future__ import annotations

import numbers
from typing import (TYPE_CHECKING, Any, BinaryIO, Callable, Iterable, Literal, Optional,
                    TypedDict, Union, cast)

import numpy as np
import numpy.typing as npt

from . import capi
from ._handle import OwnsHandle
from . import _buffers
from . import _values
from ._errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch
    from .communicator import Communicator
    from typing_extensions import Unpack

AlgorithmName = Literal["co2", "sync", "localsgd", "diloco"]
RoleName = Literal["parameter", "buffer", "excluded"]
ConsensusName = Literal["anchor", "local_average"]
ParamName = Literal["outer_lr", "outer_momentum", "tau", "clip_threshold", "penalty_constant",
                    "inner_lr", "anchor_check_interval"]
# A C flag: True / False, or the C values 1 / 0.
Flag = Union[bool, Literal[0, 1]]
# Parameter memory: a numpy float32 / float16 array or a torch float32 / bfloat16 / float16 tensor.
Tensor = Union[npt.NDArray[Any], "torch.Tensor"]


class EngineOptions(TypedDict, total=False):
    """Engine's (and co2.torch.distribute's) keyword arguments besides `algorithm`: the
    co2_engine_config_t fields of the same names. A name (any case) or the C constant for
    enums; None, like a keyword left out, keeps the C API's default (co2.engine_defaults())."""
    tau: Optional[int]
    warmup_sync_rounds: Optional[int]
    outer_lr: Optional[float]
    outer_momentum: Union[float, Literal["auto"], None]
    nesterov: Optional[Flag]
    penalty: Union[Literal["none", "constant", "gap"], int, None]
    penalty_constant: Optional[float]
    clip: Union[Literal["none", "value", "norm"], int, None]
    anchor_check_interval: Optional[int]
    clip_threshold: Optional[float]
    inner_lr: Optional[float]
    state_dtype: Union[Literal["float32", "fp32"], int, None]
    eager: Union[bool, Literal["auto"], int, None]
    wire_format: Union[Literal["fp32", "bf16", "int8", "fp4"], int, None]
    error_feedback: Optional[Flag]
    shard_outer_state: Optional[Flag]
    hierarchy: Union[Literal["flat", "nodes"], int, None]
    apply_step: Union[Literal["boundary", "arrival"], int, None]

ALGORITHMS = {"co2": capi.CO2_ALGO_CO2, "sync": capi.CO2_ALGO_SYNC,
              "localsgd": capi.CO2_ALGO_LOCALSGD, "diloco": capi.CO2_ALGO_DILOCO}
PENALTIES = {"none": capi.CO2_PENALTY_NONE, "constant": capi.CO2_PENALTY_CONSTANT,
             "gap": capi.CO2_PENALTY_GAP}
CLIPS = {"none": capi.CO2_CLIP_NONE, "value": capi.CO2_CLIP_VALUE, "norm": capi.CO2_CLIP_NORM}
WIRE_FORMATS = {"fp32": capi.CO2_WIRE_FP32, "bf16": capi.CO2_WIRE_BF16, "int8": capi.CO2_WIRE_INT8,
                "fp4": capi.CO2_WIRE_FP4}
HIERARCHIES = {"flat": capi.CO2_HIERARCHY_FLAT, "nodes": capi.CO2_HIERARCHY_NODES}
APPLY_STEPS = {"boundary": capi.CO2_APPLY_AT_BOUNDARY, "arrival": capi.CO2_APPLY_ON_ARRIVAL}
ROLES = {"parameter": capi.CO2_ROLE_PARAMETER, "buffer": capi.CO2_ROLE_BUFFER,
         "excluded": capi.CO2_ROLE_EXCLUDED}
PARAMS = {"outer_lr": capi.CO2_PARAM_OUTER_LR, "outer_momentum": capi.CO2_PARAM_OUTER_MOMENTUM,
          "tau": capi.CO2_PARAM_TAU, "clip_threshold": capi.CO2_PARAM_CLIP_THRESHOLD,
          "penalty_constant": capi.CO2_PARAM_PENALTY_CONSTANT,
          "inner_lr": capi.CO2_PARAM_INNER_LR,
          "anchor_check_interval": capi.CO2_PARAM_ANCHOR_CHECK_INTERVAL}
CONSENSUS = {"anchor": capi.CO2_CONSENSUS_ANCHOR,
             "local_average": capi.CO2_CONSENSUS_LOCAL_AVERAGE}
DTYPES = {"float32": capi.CO2_DTYPE_FP32, "fp32": capi.CO2_DTYPE_FP32}
# Hyper-parameters that are whole numbers (set_param takes a double in C).
_WHOLE_PARAMS = (capi.CO2_PARAM_TAU, capi.CO2_PARAM_ANCHOR_CHECK_INTERVAL)

def _count(key: str) -> Callable[[Any], int]:
    return lambda value: _values.integer(key, value, 0, _values.UINT32_MAX)


def _number(key: str) -> Callable[[Any], float]:
    return lambda value: _values.number(key, value)


def _flag(key: str) -> Callable[[Any], int]:
    return lambda value: _values.flag(key, value)


def _choice(table: dict[str, int], key: str) -> Callable[[Any], int]:
    return lambda value: _values.choice(table, value, key)


def _outer_momentum(value: object) -> float:
    if isinstance(value, str):
        if value != "auto":
            raise InvalidArgumentError(f"outer_momentum={value!r}: outer_momentum is a number "
                                       f"in [0, 1) or 'auto'")
        return capi.CO2_OUTER_MOMENTUM_AUTO
    return _values.number("outer_momentum", value)


def _eager(value: object) -> int:
    return _values.tristate("eager", value, "auto", capi.CO2_EAGER_AUTO)


def _apply_step(value: object) -> int:
    described = f"apply_step={value!r} ({type(value).__name__})"
    allowed = (f"apply_step is 'boundary', 'arrival' or a step k >= 1 of the round (or the C "
               f"values {capi.CO2_APPLY_AT_BOUNDARY}, {capi.CO2_APPLY_ON_ARRIVAL})")
    if isinstance(value, str):
        if value not in APPLY_STEPS:
            raise InvalidArgumentError(f"{described}: {allowed}")
        return APPLY_STEPS[value]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{described}: {allowed}")
    if not capi.CO2_APPLY_ON_ARRIVAL <= int(value) <= _values.INT32_MAX:
        raise InvalidArgumentError(f"{described}: {allowed}")
    return int(value)


# Keyword arguments of Engine and the check each value goes through (co2/_values.py) before it
# becomes the co2_engine_config_t field of the same name.
_CONFIG_KEYS = {"algorithm": _choice(ALGORITHMS, "algorithm"), "tau": _count("tau"),
                "warmup_sync_rounds": _count("warmup_sync_rounds"),
                "outer_lr": _number("outer_lr"), "outer_momentum": _outer_momentum,
                "nesterov": _flag("nesterov"), "penalty": _choice(PENALTIES, "penalty"),
                "penalty_constant": _number("penalty_constant"), "clip": _choice(CLIPS, "clip"),
                "anchor_check_interval": _count("anchor_check_interval"),
                "clip_threshold": _number("clip_threshold"), "inner_lr": _number("inner_lr"),
                "state_dtype": _choice(DTYPES, "state_dtype"), "eager": _eager,
                # compressed outer all-reduce (docs/capi.md, "Wire formats")
                "wire_format": _choice(WIRE_FORMATS, "wire_format"),
                "error_feedback": _flag("error_feedback"),
                # sharded outer state and hierarchical co2 (docs/capi.md)
                "shard_outer_state": _flag("shard_outer_state"),
                "hierarchy": _choice(HIERARCHIES, "hierarchy"),
                # when co2 applies a round's average (docs/algorithm.md, "Applying the average
                # on arrival")
                "apply_step": _apply_step}


class EngineStats(TypedDict):
    """Engine.stats(): co2_engine_stats_t's fields (docs/capi.md, co2_engine_get_stats)."""
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
    # 1.1: observability (docs/observability.md)
    last_collective_ns: int
    last_round_ns: int
    hidden_fraction: float
    last_hidden_fraction: float
    rank_step_time_ns: int
    rank_allreduce_time_ns: int
    # compressed outer all-reduce
    wire_bytes_last_round: int
    wire_bytes_total: int
    # sharded outer state: bytes of outer state this rank holds
    outer_state_bytes: int
    # 1.2: applying the average on arrival (apply_step)
    arrival_updates: int
    last_apply_step: int


_STATS_FIELDS = tuple(EngineStats.__annotations__)


def engine_defaults() -> dict[str, Any]:
    """The C API's engine defaults (co2_engine_config_init) as a dict of Engine's keywords."""
    config = capi.engine_config()
    return {key: getattr(config, key) for key in _CONFIG_KEYS}


class Engine(OwnsHandle):
    """The outer algorithm for one rank. Keyword arguments left out (or None) keep the C API's
    defaults (see co2.engine_defaults()): algorithm "co2", tau 12, outer_lr 1.0, outer_momentum
    "auto" (by the number of outer participants: ranks, or nodes under hierarchy), no penalty,
    no clipping, anchor check every 100 rounds, eager
    "auto" (co2 only: each rank starts its round from the anchor plus its own fresh delta's
    share, docs/algorithm.md "The eager policy"; "auto" is eager, on host and CUDA
    tensors; True / False force it), wire_format "fp32" (the outer
    all-reduce of co2 and diloco can travel as "bf16", "int8" or "fp4", accumulated in fp32) with
    error_feedback True (each rank adds what its encodings dropped to its next delta),
    shard_outer_state False (True: each rank keeps only its shard of the anchor and outer
    momentum; the engine refuses what sharding does not implement yet, naming it), hierarchy
    "flat" ("nodes": sync inside a node — average every step's gradients with reduce_gradients
    or the framework's own data parallelism over the node's ranks —, co2 across nodes, outer
    state sharded over a node's ranks; nodes as Communicator.split_nodes forms them),
    apply_step "boundary" (co2 applies a round's average at the next boundary; "arrival": one
    step after it is due, by the step and all-reduce times the ranks agreed on; an int k >= 1:
    at the k-th step of the round, waiting there for it; each rank keeps its progress since the
    boundary on top of the new anchor; sharded outer state on CUDA tensors refuses it).

    Lifecycle: register tensors (register) or adopt one flat storage and declare its segments
    (adopt_flat, add_segment); commit() (collective: every rank gets rank 0's values); then per
    training step: [reduce_gradients(grads) for sync], the optimizer step, step(). End with
    finalize(). Memory handed over must outlive the engine: the engine keeps a reference.
    """

    def __init__(self, comm: Communicator, algorithm: Union[AlgorithmName, int] = "co2",
                 **config: Unpack[EngineOptions]) -> None:
        values: dict[str, object] = {"algorithm": algorithm, **config}
        c_config = capi.engine_config()
        for key, value in values.items():
            if key not in _CONFIG_KEYS:
                raise TypeError(f"Engine got an unexpected keyword argument {key!r}; known: "
                                f"{', '.join(_CONFIG_KEYS)}")
            if value is None:
                continue
            setattr(c_config, key, _CONFIG_KEYS[key](value))
        self.comm = comm
        self.algorithm = next((k for k, v in ALGORITHMS.items() if v == c_config.algorithm),
                              c_config.algorithm)
        self._keep: list[object] = []  # memory handed to the engine: it must outlive it
        # (element count, co2 dtype) of PARAMETER tensors/segments
        self._trained: list[tuple[int, Optional[int]]] = []
        self._flat_dtype: Optional[int] = None  # the adopted flat storage's co2 dtype
        self._elements = 0       # PARAMETER + BUFFER elements
        self._flat: Optional[Tensor] = None
        self._handle: Optional[capi._Engine] = None
        self._handle = capi.engine_create(comm.handle, c_config)

    @property
    def handle(self) -> capi._Engine:
        if self._handle is None:
            raise ValueError("the engine was closed")
        return self._handle

    # --- layout -------------------------------------------------------------------------------

    def register(self, name: str, tensor: Tensor,
                 role: Union[RoleName, int] = "parameter") -> None:
        """Registers a tensor the framework keeps: a numpy float32 / float16 array or a torch
        float32 / bfloat16 / float16 tensor (16-bit parameters keep an fp32 outer state)."""
        role = _values.choice(ROLES, role, "role")
        what = f"register({name!r})"
        dtype = _buffers.parameter_dtype(tensor, what)
        if isinstance(tensor, np.ndarray) and dtype == capi.CO2_DTYPE_FP32:
            capi.engine_register_array(self.handle, name, tensor, role)
            count = tensor.size
        elif isinstance(tensor, np.ndarray):
            address, count = _buffers.numpy_address(tensor, what)
            capi.engine_register_address(self.handle, name, address, count, dtype,
                                         capi.CO2_DEVICE_HOST, 0, role)
        else:
            memory = _buffers.TensorMemory(tensor, what)
            capi.engine_register_address(self.handle, name, memory.address, memory.count,
                                         memory.dtype, memory.device, memory.device_index, role)
            count = memory.count
        self._record(role, count, dtype)
        self._keep.append(tensor)

    def adopt_flat(self, storage: Tensor) -> None:
        """Adopts one flat storage (1-D numpy array or torch tensor of a parameter dtype) the
        caller allocated; declare its segments with add_segment."""
        dtype = _buffers.parameter_dtype(storage, "adopt_flat")
        if isinstance(storage, np.ndarray) and dtype == capi.CO2_DTYPE_FP32:
            capi.engine_adopt_flat_array(self.handle, storage)
        elif isinstance(storage, np.ndarray):
            address, count = _buffers.numpy_address(storage, "adopt_flat")
            capi.engine_adopt_flat_address(self.handle, address, count, dtype,
                                           capi.CO2_DEVICE_HOST, 0)
        else:
            memory = _buffers.TensorMemory(storage, "adopt_flat")
            capi.engine_adopt_flat_address(self.handle, memory.address, memory.count,
                                           memory.dtype, memory.device, memory.device_index)
        self._flat = storage
        self._flat_dtype = dtype
        self._keep.append(storage)

    def add_segment(self, name: str, offset: int, count: int,
                    role: Union[RoleName, int] = "parameter") -> None:
        """Declares [offset, offset + count) elements of the flat storage as one tensor."""
        role = _values.choice(ROLES, role, "role")
        offset = _values.integer("offset", offset, 0, 2 ** 64 - 1)
        count = _values.integer("count", count, 0, 2 ** 64 - 1)
        capi.engine_add_segment(self.handle, name, offset, count, role)
        self._record(role, count, self._flat_dtype)

    def _record(self, role: int, count: int, dtype: Optional[int]) -> None:
        if role == capi.CO2_ROLE_PARAMETER:
            self._trained.append((count, dtype))
        if role in (capi.CO2_ROLE_PARAMETER, capi.CO2_ROLE_BUFFER):
            self._elements += count

    def commit(self) -> None:
        """Collective. Freezes the layout, checks that it and every engine setting that changes
        the math are the same on every rank (LayoutMismatchError naming the first difference)
        and gives every rank rank 0's values."""
        capi.engine_commit(self.handle)

    # --- training -----------------------------------------------------------------------------

    def step(self, stream: Optional[int] = None) -> bool:
        """Call after every optimizer step; True when this call was a round boundary."""
        return bool(capi.engine_step(self.handle, stream))

    def reduce_gradients(self, grads: Iterable[Optional[Tensor]],
                         stream: Optional[int] = None) -> None:
        """Collective, blocking: averages gradients in place. grads[i] belongs to the i-th
        PARAMETER tensor (registration order): a numpy array or torch tensor of that tensor's
        size and dtype (bf16/fp16 gradients are averaged in fp32 and rounded once), or None
        (contributes zeros, receives nothing). Pass them on every call."""
        grads = list(grads)
        if len(grads) != len(self._trained):
            raise ValueError(f"reduce_gradients: expected {len(self._trained)} gradients (one "
                             f"per trained tensor), got {len(grads)}")
        items: list[Union[npt.NDArray[Any], int, None]] = []
        for i, (grad, (count, dtype)) in enumerate(zip(grads, self._trained)):
            what = f"reduce_gradients (gradient {i})"
            if grad is None:
                items.append(None)
                continue
            _buffers.check_count(grad, count, what)
            if _buffers.parameter_dtype(grad, what) != dtype:
                raise TypeError(f"{what}: expected {_buffers.dtype_name(dtype)} (the parameter's "
                                f"dtype), got {grad.dtype}")
            if isinstance(grad, np.ndarray) and dtype == capi.CO2_DTYPE_FP32:
                items.append(grad)  # contiguity, writeability: checked in capi
            elif isinstance(grad, np.ndarray):
                items.append(_buffers.numpy_address(grad, what)[0])
            else:
                memory = _buffers.TensorMemory(grad, what)
                if stream is None:
                    stream = _buffers.current_stream(memory)
                items.append(memory.address)
        capi.engine_reduce_gradients(self.handle, items, stream)

    def synchronize(self) -> None:
        """Collective: every rank ends with the identical model (parameters = anchor)."""
        capi.engine_synchronize(self.handle)

    def finalize(self) -> None:
        """Collective. End of training, as synchronize(): applies the average in flight and
        averages the steps since the last boundary into one more update (no step's work is
        lost); parameters = anchor."""
        capi.engine_finalize(self.handle)

    def leave(self) -> None:
        """Elastic groups: asks to leave the group at a boundary the ranks agree on, without
        ending it. Returns at once; keep stepping: the step at which the group lets this rank go
        raises co2.LeftError here (parameters = the anchor, every step's work kept) and
        co2.MembershipChangedError on the others (docs/capi.md, "Leaving")."""
        capi.engine_leave(self.handle)

    @property
    def num_elements(self) -> int:
        """PARAMETER + BUFFER elements (after commit)."""
        return capi.engine_num_elements(self.handle)

    def consensus(self, kind: Union[ConsensusName, int] = "anchor",
                  out: Optional[Tensor] = None) -> Tensor:
        """The consensus model as one flat float32 array, without changing the trajectory:
        kind "anchor" (no communication; sharded or hierarchical: includes this rank's average
        in flight, waited for) or "local_average" (collective). `out` (numpy or
        torch, float32, num_elements long) is filled and returned; None allocates numpy."""
        kind = _values.choice(CONSENSUS, kind, "consensus kind")
        if out is None:
            out = np.empty(self.num_elements, dtype=np.float32)
        if isinstance(out, np.ndarray):
            capi.engine_consensus(self.handle, kind, out)
        else:
            memory = _buffers.TensorMemory(out, "consensus") if _buffers.is_torch_tensor(out) \
                else None
            if memory is None:
                raise TypeError(f"consensus: expected a numpy array or a torch tensor, got "
                                f"{type(out).__name__}")
            if memory.dtype != capi.CO2_DTYPE_FP32:
                raise TypeError(f"consensus: expected float32, got {out.dtype}")
            capi.engine_consensus_address(self.handle, kind, memory.address, memory.count)
        return out

    # --- parameters and statistics ------------------------------------------------------------

    def set_param(self, key: Union[ParamName, int], value: float) -> None:
        """Changes a hyper-parameter (outer_lr, outer_momentum, tau, clip_threshold,
        penalty_constant, inner_lr, anchor_check_interval) on this rank; every rank must make
        the same change at the same step."""
        code = _values.choice(PARAMS, key, "parameter")
        name = next((k for k, v in PARAMS.items() if v == code), str(key))
        if code in _WHOLE_PARAMS:
            value = _values.integer(name, value, 0, _values.UINT32_MAX)
        capi.engine_set_param(self.handle, code, _values.number(name, value))

    def get_param(self, key: Union[ParamName, int]) -> float:
        code = _values.choice(PARAMS, key, "parameter")
        value = capi.engine_get_param(self.handle, code)
        return int(value) if code in _WHOLE_PARAMS else value

    def stats(self) -> EngineStats:
        """Statistics as a dict: steps, rounds, outer_updates, bytes_reduced, collective_ns,
        boundary_wait_ns (time the training thread waited for the network), hidden_fraction
        (1 - boundary_wait_ns / collective_ns), last_hidden_fraction, advised_tau (the same
        on every rank), ... (docs/capi.md, co2_engine_get_stats)."""
        raw = capi.engine_get_stats(self.handle)
        return cast(EngineStats, {field: getattr(raw, field) for field in _STATS_FIELDS})

    # --- checkpoint -----------------------------------------------------------------------------

    def state_size(self) -> int:
        return capi.engine_state_size(self.handle)

    def save(self, keep: Flag = True, portable: Flag = False) -> Optional[bytes]:
        """Collective. The shared engine state as bytes (for torch.save / pickle); ranks that
        pass keep=False take part and get None. A sharded engine (shard_outer_state, hierarchy
        "nodes") saves this rank's shard only: every rank keeps its own and loads it back on
        the same rank. portable=True: one state that loads at any world size and sharding
        (co2_engine_save_portable)."""
        return capi.engine_save_bytes(self.handle, _values.flag("keep", keep),
                                      _values.flag("portable", portable))

    def load(self, state: Union[bytes, bytearray, memoryview]) -> None:
        """Restores a state from save() (bytes-like); parameters become the restored anchor
        (restore per-rank mid-round parameters afterwards). Not collective, except on a sharded
        engine, whose ranks all load together (and all fail if one rank's state is bad)."""
        capi.engine_load_bytes(self.handle, state)

    def save_to(self, file: Optional[BinaryIO], portable: Flag = False) -> None:
        """Collective. Streams the state into a binary file object (file.write); ranks that
        pass None take part only. For states too large to hold twice in memory. portable: as
        save()."""
        capi.engine_save_to(self.handle, file, _values.flag("portable", portable))

    def load_from(self, file: BinaryIO) -> None:
        """As load(), from a binary file object (file.read): one saved state."""
        capi.engine_load_from(self.handle, file)

    # --- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """Destroys the engine (waits for its all-reduce in flight); then releases the memory
        it was handed."""
        handle, self._handle = self._handle, None
        if handle is not None:
            capi.engine_destroy(handle)
        self._keep = []

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"{len(self._trained)} trained tensors"
        return f"<co2.Engine {self.algorithm}, {state}>"

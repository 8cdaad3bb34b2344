"""co2.Communicator: a group of ranks, and raw collectives on numpy arrays / torch tensors."""
from __future__ import annotations

import itertools
import os
from typing import TYPE_CHECKING, Any, Generic, Literal, NoReturn, Optional, TypeVar, Union, cast

import numpy as np
import numpy.typing as npt

from . import capi
from ._handle import OwnsHandle
from . import _buffers
from . import _launch
from . import _values
from ._errors import InvalidArgumentError

if TYPE_CHECKING:
    import torch

# What the collectives take: a numpy array or a torch tensor, reduced or broadcast in place.
Buffer = Union[npt.NDArray[Any], "torch.Tensor"]
_Buffer = TypeVar("_Buffer", bound=Buffer)
TransportName = Literal["auto", "local", "ucx", "nccl"]
ReduceOpName = Literal["sum", "avg", "min", "max"]

TRANSPORTS = {"auto": capi.CO2_TRANSPORT_AUTO, "local": capi.CO2_TRANSPORT_LOCAL,
              "ucx": capi.CO2_TRANSPORT_UCX, "nccl": capi.CO2_TRANSPORT_NCCL}
REDUCE_OPS = {"sum": capi.CO2_REDUCE_SUM, "avg": capi.CO2_REDUCE_AVG,
              "min": capi.CO2_REDUCE_MIN, "max": capi.CO2_REDUCE_MAX}

# Communicators created through torchrun's store, in creation order (same on every rank).
_torchrun_sequence = itertools.count()


# The environment variable that replaces the C API's default no-progress timeout
# (CO2_DEFAULT_TIMEOUT_MS, 5 minutes) for communicators made without timeout_ms=, and for
# co2.torch's wait on the gradient buckets of sync: a stall shows after this long.
TIMEOUT_VARIABLE = "CO2_TIMEOUT_MS"


def default_timeout_ms() -> int:
    """The no-progress timeout of a communicator made without timeout_ms=: CO2_TIMEOUT_MS (a
    whole number of milliseconds >= 1) if set, else the C API's CO2_DEFAULT_TIMEOUT_MS."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return capi.CO2_DEFAULT_TIMEOUT_MS
    try:
        value = int(text, 10)
    except ValueError:
        value = None
    if value is None or not 1 <= value <= _values.UINT32_MAX:
        raise InvalidArgumentError(f"{TIMEOUT_VARIABLE}={text!r}: set it to a whole number of "
                                   f"milliseconds in [1, {_values.UINT32_MAX}] (the "
                                   f"communicators' no-progress timeout), or unset it for the "
                                   f"default {capi.CO2_DEFAULT_TIMEOUT_MS} ms")
    return value


def unique_id() -> bytes:
    """A fresh group id (bytes) for Communicator(unique_id=...): create it on one rank and hand
    it to the others by your own means (MPI, torch.distributed, a file)."""
    return capi.get_unique_id()


def comm_defaults() -> dict[str, int]:
    """The C API's communicator defaults (co2_comm_config_init) as a dict."""
    config = capi.comm_config()
    return {"transport": config.transport, "timeout_ms": config.timeout_ms,
            "chunk_bytes": config.chunk_bytes}


class Request(Generic[_Buffer]):
    """An asynchronous collective in flight. The buffer stays referenced (and must stay
    untouched) until wait() returned or test() said done."""

    def __init__(self, handle: Optional[capi._Request], buffer: _Buffer) -> None:
        self._handle = handle
        self._buffer: _Buffer = buffer

    def test(self) -> bool:
        """True once complete (and frees the request); raises the collective's failure."""
        if self._handle is None:
            return True
        if capi.request_test(self._handle):
            self._free()
            return True
        return False

    def wait(self, timeout_ms: Optional[float] = None) -> _Buffer:
        """Waits for completion (None: until done or the communicator's no-progress timeout).
        co2.TimeoutError leaves the request pending and usable. Returns the buffer."""
        if self._handle is not None:
            capi.request_wait(self._handle, -1 if timeout_ms is None else
                              round(_values.number("timeout_ms", timeout_ms)))
            self._free()
        return self._buffer

    def _free(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            capi.request_free(handle)

    def __del__(self) -> None:
        # An incomplete request is waited for by co2_request_free: the buffer is in use.
        if getattr(self, "_handle", None) is not None:
            try:
                self._free()
            except Exception:  # noqa: BLE001 - nothing to report to from a finaliser
                pass


class Communicator(OwnsHandle):
    """A rank of a group. Collective: every rank constructs one, and construction blocks until
    all world_size ranks joined (or fails after timeout_ms with co2.RendezvousError).

    rank, world_size: default to the launcher's environment (RANK/WORLD_SIZE as torchrun and
        co2run set them, else OMPI_COMM_WORLD_*, SLURM_*), else a group of one. Under torchrun,
        whose agent already holds MASTER_PORT, the ranks then meet through torch's store (the
        group id goes through it) unless CO2_MASTER_PORT gives co2's store a free port.
    transport: "auto" (the default: the in-process transport, or UCX when the environment
        describes several processes), "local" (ranks are threads of this process), "ucx".
    group_name: ranks of the local transport with equal names form one group.
    unique_id: bytes from co2.unique_id() on one rank, NCCL style; the group it names.
    timeout_ms, chunk_bytes: None keeps the C API's defaults.
    device_index: the CUDA device of an NCCL communicator (None: the launcher's LOCAL_RANK,
        else the current device).
    node_id: the node (host) this rank is on, for split_nodes() (None: the launcher's node,
        GROUP_RANK or SLURM_NODEID, else the host name).
    connections_per_peer: UCX connections each peer's messages are striped over, 1..16, the
        same on every rank (None: CO2_UCX_CONNECTIONS, else 1): for networks that cap each
        connection below the link's rate.
    elastic_min_ranks: 0 (the default): a lost rank fails the group (co2.PeerLostError).
        k >= 1: the survivors of a lost rank re-form while k ranks remain, and the call that
        met the loss raises co2.MembershipChangedError; rank and world_size then give the new
        group (UCX or threads, replicated outer state; docs/capi.md, "Elastic membership").
    """

    @property
    def rank(self) -> int:
        """This rank; it changes when an elastic group re-forms (co2.MembershipChangedError)."""
        return capi.comm_rank(self.handle)

    @property
    def world_size(self) -> int:
        """The group's size; it changes when an elastic group re-forms."""
        return capi.comm_size(self.handle)

    def __init__(self, rank: Optional[int] = None, world_size: Optional[int] = None, *,
                 transport: Union[TransportName, int] = "auto", group_name: Optional[str] = None,
                 unique_id: Optional[bytes] = None, timeout_ms: Optional[int] = None,
                 chunk_bytes: Optional[int] = None, device_index: Optional[int] = None,
                 node_id: Optional[int] = None, connections_per_peer: Optional[int] = None,
                 elastic_min_ranks: Optional[int] = None) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank and world_size, or neither (then the "
                             "environment's RANK/WORLD_SIZE are used)")
        if rank is None:
            rank, world_size = _launch.rank_and_world() or (0, 1)
            if unique_id is None and _torchrun_holds_master_port(world_size):
                unique_id = _unique_id_through_torch(rank, world_size)
        config = _config(transport, timeout_ms, chunk_bytes, device_index, node_id, connections_per_peer,
                         elastic_min_ranks)
        config.rank = _values.integer("rank", rank, 0, _values.INT32_MAX)
        config.world_size = _values.integer("world_size", world_size, 0, _values.INT32_MAX)
        self._handle: Optional[capi._Comm] = None
        if unique_id is None:
            self._adopt(capi.comm_create(config, group_name))
        else:
            self._adopt(capi.comm_create_with_id(config, group_name, unique_id, config.rank,
                                                 config.world_size))

    def _adopt(self, handle: capi._Comm) -> Communicator:
        self._handle = handle
        return self

    def split(self, color: Optional[int], key: Optional[int] = None,
              **options: Any) -> Optional[Communicator]:
        """Collective over this group: the ranks passing the same `color` (an int >= 0) form a
        new Communicator, ranked by (`key`, this rank); color None joins no group and returns
        None. key None: this rank. The new groups use this one's kind of transport unless
        `transport=` says otherwise (options: transport, timeout_ms, chunk_bytes,
        device_index; left out: this group's timeout and chunk size).
        E.g. nodes = comm.split(node, local_rank); lanes = comm.split(local_rank, node)."""
        color = capi.CO2_SPLIT_NONE if color is None else \
            _values.integer("color", color, 0, _values.INT32_MAX)
        key = self.rank if key is None else \
            _values.integer("key", key, _values.INT32_MIN, _values.INT32_MAX)
        config = _config(**options) if options else None
        handle = capi.comm_split(self.handle, color, key, config)
        if handle is None:
            return None
        return Communicator.__new__(Communicator)._adopt(handle)

    def split_nodes(self, **options: Any) -> tuple[Communicator, Communicator]:
        """Collective over this group: (intra, inter), two new Communicators for hierarchical
        training. intra: the ranks of this rank's node, ranked by rank here (its rank is the
        local index); inter: the ranks with this local index on every node, ranked by node (its
        rank is the node index, nodes numbered by their lowest rank). The node is
        `node_id=` if given, else the node_id this group was made with, else the launcher's
        (GROUP_RANK under co2run / torchrun, SLURM_NODEID under srun), else the host name.
        Nodes of different sizes raise co2.InvalidArgumentError on every rank. Other options
        as for split()."""
        config = _config(**options) if options else None
        intra, inter = capi.comm_split_nodes(self.handle, config)
        return (Communicator.__new__(Communicator)._adopt(intra),
                Communicator.__new__(Communicator)._adopt(inter))

    @classmethod
    def from_env(cls, **kwargs: Any) -> Communicator:
        """The communicator a launcher describes: the same as Communicator(**kwargs)."""
        return cls(**kwargs)

    @property
    def handle(self) -> capi._Comm:
        if self._handle is None:
            raise ValueError("the communicator was closed")
        return self._handle

    # --- raw collectives ---------------------------------------------------------------------

    def allreduce_async(self, buffer: _Buffer,
                        op: Union[ReduceOpName, int] = "sum") -> Request[_Buffer]:
        """In-place all-reduce of a numpy array or torch tensor; returns a Request."""
        op = _values.choice(REDUCE_OPS, op, "reduce op")
        if isinstance(buffer, np.ndarray):
            # cast: isinstance narrowed the buffer's type; the Request gives back the caller's.
            return Request(capi.allreduce(self.handle, buffer, op, None), cast(_Buffer, buffer))
        memory = _buffers.TensorMemory(buffer, "allreduce") if _buffers.is_torch_tensor(buffer) \
            else _not_a_buffer(buffer, "allreduce")
        return Request(capi.allreduce_address(self.handle, memory.address, memory.count,
                                              memory.dtype, op, _buffers.current_stream(memory)),
                       buffer)

    def allreduce(self, buffer: _Buffer, op: Union[ReduceOpName, int] = "sum") -> _Buffer:
        """Blocking in-place all-reduce; returns the buffer. The result is bit-identical on every
        rank."""
        return self.allreduce_async(buffer, op).wait()

    def broadcast_async(self, buffer: _Buffer, root: int = 0) -> Request[_Buffer]:
        if isinstance(buffer, np.ndarray):
            return Request(capi.broadcast(self.handle, buffer, int(root), None),
                           cast(_Buffer, buffer))
        memory = _buffers.TensorMemory(buffer, "broadcast") if _buffers.is_torch_tensor(buffer) \
            else _not_a_buffer(buffer, "broadcast")
        return Request(capi.broadcast_address(self.handle, memory.address, memory.count,
                                              memory.dtype, int(root),
                                              _buffers.current_stream(memory)), buffer)

    def broadcast(self, buffer: _Buffer, root: int = 0) -> _Buffer:
        """Blocking in-place broadcast from `root`; returns the buffer."""
        return self.broadcast_async(buffer, root).wait()

    # --- lifetime ---------------------------------------------------------------------------

    def abort(self) -> None:
        """Fails every pending and future operation of the group with co2.AbortedError. Safe
        from any thread, also while another thread is blocked in a call."""
        capi.comm_abort(self.handle)

    def close(self) -> None:
        """Releases this reference (engines created on the communicator keep it alive)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            capi.comm_destroy(handle)

    def __repr__(self) -> str:
        state = "closed" if self._handle is None else f"rank {self.rank} of {self.world_size}"
        return f"<co2.Communicator {state}>"


def _config(transport: object = "auto", timeout_ms: object = None, chunk_bytes: object = None,
            device_index: object = None, node_id: object = None,
            connections_per_peer: object = None, elastic_min_ranks: object = None) -> capi.comm_config:
    """A co2_comm_config_t from keyword options; None keeps the C API's default (timeout_ms:
    CO2_TIMEOUT_MS's if set, default_timeout_ms())."""
    config = capi.comm_config()
    config.transport = _values.choice(TRANSPORTS, transport, "transport")
    config.timeout_ms = default_timeout_ms() if timeout_ms is None else \
        _values.integer("timeout_ms", timeout_ms, 1, _values.UINT32_MAX)
    if chunk_bytes is not None:
        config.chunk_bytes = _values.integer("chunk_bytes", chunk_bytes, 1, 2 ** 64 - 1)
    if device_index is not None:
        config.device_index = _values.integer("device_index", device_index, -1,
                                              _values.INT32_MAX)
    if node_id is not None:
        config.node_id = _values.integer("node_id", node_id, -1, _values.INT32_MAX)
    if connections_per_peer is not None:
        config.connections_per_peer = _values.integer("connections_per_peer", connections_per_peer, 1,
                                                      capi.CO2_MAX_CONNECTIONS)
    if elastic_min_ranks is not None:
        config.elastic_min_ranks = _values.integer("elastic_min_ranks", elastic_min_ranks, 0, _values.INT32_MAX)
    return config


def _not_a_buffer(buffer: object, what: str) -> NoReturn:
    raise TypeError(f"{what}: expected a numpy array or a torch tensor, got "
                    f"{type(buffer).__name__}")


def _torchrun_holds_master_port(world_size: int) -> bool:
    """Under torchrun its agent serves torch's own store at MASTER_PORT, where co2's rank 0
    would serve co2's: the group id then goes through torch's store instead, unless
    CO2_MASTER_PORT gives co2's store a port of its own."""
    return (world_size > 1 and _launch.under_torchrun()
            and "CO2_MASTER_PORT" not in os.environ)


def _unique_id_through_torch(rank: int, world: int) -> bytes:
    """Rank 0 creates the id; everybody reads it from torch.distributed (its process group if
    initialised, else torchrun's agent store at MASTER_ADDR:MASTER_PORT)."""
    import datetime
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        box: list[Optional[bytes]] = [unique_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return cast(bytes, box[0])   # rank 0 filled it
    timeout = datetime.timedelta(milliseconds=default_timeout_ms())
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          False, timeout)
    key = "co2/unique_id/{}/{}/{}".format(os.environ.get("TORCHELASTIC_RUN_ID", ""),
                                          os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
                                          next(_torchrun_sequence))
    if rank == 0:
        store.set(key, unique_id())  # type: ignore[arg-type]  # torch 1.13's stub: str only
    return bytes(store.get(key))

"""What co2.torch hands a process that joined a running elastic group, beyond the engine's state.

The engine gives a joiner the group's anchor (its parameters and averaged buffers), outer momentum
and step count at its commit. The framework's state is co2.torch's to send: the buffers that are
broadcast once at the start (_roles.BROADCAST) and the inner optimizer's state_dict (momentum
buffers, Adam's moments and step counts, the param groups' hyper-parameters as a scheduler left
them). Rank 0 of the grown group (a member: joiners get the next ranks) sends both, right after
the admission: the members from the step that raised MembershipChangedError, the joiner from its
distribute(). Members keep their own optimizer state; the joiner loads rank 0's.

Collective over the grown group, in this order: the BROADCAST buffers, the state's size (one
int64), the state (int32 words: the raw collectives have no byte type).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import torch

from . import _roles

if TYPE_CHECKING:
    from .communicator import Communicator


def share(comm: Communicator, buffers: _roles.BufferRoles,
          optimizer: Optional[torch.optim.Optimizer], joined: bool) -> Optional[dict[str, Any]]:
    """Collective: every rank takes rank 0's BROADCAST buffers; a joiner (`joined`) returns rank
    0's optimizer state_dict (None where rank 0 has no optimizer attached), a member None."""
    _roles.broadcast_once(comm, buffers)
    payload = encode(optimizer.state_dict()) if comm.rank == 0 and optimizer is not None else b""
    size = np.array([len(payload)], dtype=np.int64)
    comm.broadcast(size, root=0)
    if size[0] == 0:
        return None
    words = np.zeros((int(size[0]) + 3) // 4, dtype=np.int32)
    if comm.rank == 0:
        words.view(np.uint8)[:len(payload)] = np.frombuffer(payload, dtype=np.uint8)
    comm.broadcast(words, root=0)
    if not joined:
        return None
    decoded: dict[str, Any] = decode(words.view(np.uint8)[:int(size[0])].tobytes())
    return decoded


# The state travels as a JSON description (dicts as key/value pairs, so that the int keys of
# `state` stay ints) followed by the tensors' bytes: no pickle, so nothing a peer sends can run
# code here, and any torch version reads it (torch.load(weights_only=True) of torch 1.13 cannot
# read a float). A tensor keeps its dtype and shape and moves to the CPU; the optimizer's
# load_state_dict moves it to its parameter's device.

def encode(value: Any) -> bytes:
    tensors: list[bytes] = []

    def describe(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            tensors.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
            return {"tensor": [str(t.dtype).removeprefix("torch."), list(t.shape), len(tensors[-1])]}
        if isinstance(v, dict):
            return {"dict": [[describe(k), describe(x)] for k, x in v.items()]}
        if isinstance(v, (list, tuple)):
            return {"tuple" if isinstance(v, tuple) else "list": [describe(x) for x in v]}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"value": v}
        raise TypeError(f"co2.torch cannot send the optimizer state to a joining process: a "
                        f"{type(v).__name__} in its state_dict() (tensors, numbers, strings, "
                        f"lists, tuples and dicts only)")

    text = json.dumps(describe(value)).encode()
    return len(text).to_bytes(8, "little") + text + b"".join(tensors)


def decode(payload: bytes) -> Any:
    length = int.from_bytes(payload[:8], "little")
    offset = 8 + length
    data = bytearray(payload)

    def build(d: Any) -> Any:
        nonlocal offset
        kind, v = next(iter(d.items()))
        if kind == "tensor":
            dtype, shape, nbytes = v
            raw = torch.frombuffer(data, dtype=torch.uint8, count=nbytes, offset=offset) if nbytes \
                else torch.empty(0, dtype=torch.uint8)
            offset += nbytes
            return raw.view(getattr(torch, dtype)).reshape(shape).clone()
        if kind == "dict":
            return {build(k): build(x) for k, x in v}
        if kind == "list":
            return [build(x) for x in v]
        if kind == "tuple":
            return tuple(build(x) for x in v)
        return v

    return build(json.loads(payload[8:8 + length]))

"""Which of a module's buffers co2 averages, broadcasts once, or leaves alone.

The default rule: a floating buffer is a running statistic, and so averaged with the parameters
at every round boundary, when its leaf name is running_mean or running_var (BatchNorm,
InstanceNorm with track_running_stats, and modules that follow their naming), or when its owner
is a torch _BatchNorm / _InstanceNorm with track_running_stats. Every other buffer (causal masks
holding -inf, positional tables, counters such as num_batches_tracked) is broadcast once from
rank 0 at distribute() so that all ranks start alike, and is then left to each rank. Buffers
whose dtype no collective carries (bool masks) are left alone from the start.

`buffers=` overrides it: a role name for every buffer, or a {name: role} dict on top of the rule.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Union

import torch

if TYPE_CHECKING:
    from .communicator import Communicator

# (name, tensor, role) per buffer, in named_buffers order.
BufferRoles = list[tuple[str, torch.Tensor, str]]

AVERAGE, BROADCAST, IGNORE = "average", "broadcast", "ignore"
ROLES = (AVERAGE, BROADCAST, IGNORE)
RUNNING_STATISTICS = ("running_mean", "running_var")
# dtypes the raw broadcast carries (co2_broadcast: fp32, fp64, int32, int64).
BROADCASTABLE = (torch.float32, torch.float64, torch.int32, torch.int64)


def _is_running_statistic(module: torch.nn.Module, name: str) -> bool:
    owner_path, _, leaf = name.rpartition(".")
    if leaf in RUNNING_STATISTICS:
        return True
    owner = module.get_submodule(owner_path) if owner_path else module
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm)
    return isinstance(owner, norms) and bool(getattr(owner, "track_running_stats", False)) \
        and leaf != "num_batches_tracked"


def default_role(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> str:
    if tensor.is_floating_point() and _is_running_statistic(module, name):
        return AVERAGE
    return BROADCAST if tensor.dtype in BROADCASTABLE else IGNORE


def assign(module: torch.nn.Module,
           override: Union[str, Mapping[str, str], None] = None) -> BufferRoles:
    """[(name, tensor, role)] for the module's buffers, in named_buffers order."""
    named = [(name, b) for name, b in module.named_buffers() if b is not None]
    known = {name for name, _ in named}
    if override is None:
        override = {}
    elif isinstance(override, str):
        override = {name: override for name in known}
    elif not isinstance(override, dict):
        raise TypeError(f"buffers= takes a role ({', '.join(ROLES)}) or a {{name: role}} dict, "
                        f"got {type(override).__name__}")
    for name, role in override.items():
        if name not in known:
            raise ValueError(f"buffers=: the module has no buffer {name!r}; its buffers: "
                             f"{', '.join(sorted(known)) or '(none)'}")
        if role not in ROLES:
            raise ValueError(f"buffers=: role {role!r} of {name!r} is not one of "
                             f"{', '.join(ROLES)}")
    result: BufferRoles = []
    for name, tensor in named:
        role = override.get(name) or default_role(module, name, tensor)
        if role == BROADCAST and tensor.dtype not in BROADCASTABLE:
            raise TypeError(f"buffer {name!r} is {tensor.dtype}: a broadcast carries float32, "
                            f"float64, int32, int64 (give it role 'ignore')")
        if role == AVERAGE:
            if not tensor.is_floating_point():
                raise TypeError(f"buffer {name!r} is {tensor.dtype}: only floating buffers "
                                f"can be averaged")
            if not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"buffer {name!r} holds NaN or Inf and would be averaged "
                                 f"(Inf - Inf is NaN): give it role 'broadcast' or 'ignore' in "
                                 f"buffers={{{name!r}: 'ignore'}}")
        result.append((name, tensor, role))
    return result


def broadcast_once(comm: Communicator, buffers: BufferRoles) -> None:
    """Every rank takes rank 0's value of each BROADCAST buffer (collective, in order)."""
    with torch.no_grad():
        for name, tensor, role in buffers:
            if role != BROADCAST or tensor.numel() == 0:
                continue
            if tensor.is_contiguous():
                comm.broadcast(tensor, root=0)
            else:
                staged = tensor.contiguous()
                comm.broadcast(staged, root=0)
                tensor.copy_(staged)

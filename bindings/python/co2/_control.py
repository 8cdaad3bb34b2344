"""Small control collectives of co2.torch, and what a failed one means in a torch user's words.

Before each of its collective operations (finalize, synchronize, state_dict, save_portable) and
at each round boundary inside join(), a Distributed runs one small int64 all-reduce on its
communicator (owner 0: a raw collective, carried on the control lane). Its element count is
2 * world_size + the operation's code, so the count names the operation: when one rank is in
state_dict() and another in a boundary all-reduce or in finalize(), the library's
CollectiveMismatchError names both collectives with their counts, and translate() turns that into
"state_dict() is collective: call it on every rank" or "unequal step counts" on every rank.

The payload: slot r holds rank r's engine step count, slot W + r a flag (1: this rank's
parameters changed without an engine step; join: 1 while the rank still has batches).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from . import _errors

if TYPE_CHECKING:
    from .communicator import Communicator

# Operation codes (part of the element count: never reuse one for another meaning).
OPERATIONS = {"finalize()": 1, "synchronize()": 2, "state_dict()": 3, "save_portable()": 4,
              "join round": 5}
_BY_CODE = {code: name for name, code in OPERATIONS.items()}
_CONTROL_SHAPE = re.compile(r"allreduce\(sum, i64, count (\d+)\)")

UNEQUAL_HINT = "give every rank the same number of batches or use trainer.join()"
COLLECTIVE_HINT = "{op} is collective: call it on every rank"


def agree(comm: Communicator, operation: str, steps: int, flag: Union[bool, int]
          ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Collective: every rank's (steps, flag) as two int64 arrays of length world_size."""
    world = comm.world_size
    payload = np.zeros(2 * world + OPERATIONS[operation], dtype=np.int64)
    payload[comm.rank] = int(steps)
    payload[world + comm.rank] = int(flag)
    comm.allreduce(payload, "sum")
    return payload[:world], payload[world:2 * world]


def peer_operation(error: BaseException, world: int, mine: Optional[str]) -> Optional[str]:
    """The co2.torch operation a peer was in, other than `mine`, read from a
    CollectiveMismatchError's message (None: the peer's collective was not one of ours, it was
    training)."""
    for count in _CONTROL_SHAPE.findall(str(error)):
        operation = _BY_CODE.get(int(count) - 2 * world)
        if operation is not None and operation != mine:
            return operation
    return None


_STOPS = ("finalize()", "synchronize()", "join round")
_SAVES = ("state_dict()", "save_portable()")


def translate(error: _errors.Error, world: int, rank: int, steps: int,
              mine: Optional[str]) -> Optional[_errors.Error]:
    """A clearer exception for a peer failure in or around a co2.torch collective, or None.

    mine: the operation this rank was in (None: a training step or boundary)."""
    if not isinstance(error, _errors.PeerError):
        return None
    theirs = peer_operation(error, world, mine) \
        if isinstance(error, _errors.CollectiveMismatchError) else None
    here = f"this rank ({rank}) is in {mine}" if mine else \
        f"this rank ({rank}) was training at step {steps}"
    for op in (mine, theirs):
        if op in _SAVES:
            peer = f"a peer is in {theirs}" if theirs else "a peer was elsewhere"
            return _reraised(error, f"{COLLECTIVE_HINT.format(op=op)} ({here}; {peer})")
    if "join round" in (mine, theirs) and None in (mine, theirs):
        text = (f"rank {rank} is at step {steps} {'inside' if mine else 'outside'} "
                f"trainer.join() while a peer is {'outside' if mine else 'inside'} it: enter "
                f"join() on every rank at the same step")
        return _reraised(error, text)
    if mine is None and theirs in _STOPS:
        text = (f"a peer stopped ({theirs}) while this rank ({rank}) continues at step "
                f"{steps}: unequal step counts")
    elif mine in _STOPS and not isinstance(error, _errors.CollectiveMismatchError):
        text = (f"rank {rank} waited in {mine} at step {steps} and a peer did not come (it "
                f"exited, failed, or still trains): if the ranks have unequal step counts")
    elif mine in _STOPS and theirs is None:
        text = f"rank {rank} stopped at step {steps} ({mine}) while others continue: " \
               f"unequal step counts"
    elif mine in _STOPS:
        text = (f"rank {rank} is at step {steps} in {mine} while a peer is in {theirs}: "
                f"unequal step counts")
    else:
        return None
    return _reraised(error, f"{text}; {UNEQUAL_HINT}")


def unequal_steps_error(steps: Sequence[Any]) -> Optional[UnequalStepsError]:
    """The error for an agreement whose step counts differ (None when they are equal)."""
    steps = [int(s) for s in steps]
    if min(steps) == max(steps):
        return None
    low = min(range(len(steps)), key=lambda r: steps[r])
    return UnequalStepsError(
        f"rank {low} stopped at step {steps[low]} while others continue (to step "
        f"{max(steps)}; steps by rank: {steps}): unequal step counts; {UNEQUAL_HINT}")


class UnequalStepsError(_errors.Error):
    """The ranks took different numbers of training steps (found when all of them reached the
    same collective operation)."""


def _reraised(error: _errors.Error, text: str) -> _errors.Error:
    """The same co2 exception class, with the torch-level explanation first."""
    clearer = type(error)(f"{text}. [library: {error}]", error.status, error.function,
                          error.status_string, error.detail)
    clearer.__cause__ = error
    return clearer

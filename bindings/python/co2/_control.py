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
import re

import numpy as np

from . import _errors

# Operation codes (part of the element count: never reuse one for another meaning).
OPERATIONS = {"finalize()": 1, "synchronize()": 2, "state_dict()": 3, "save_portable()": 4,
              "join round": 5}
_BY_CODE = {code: name for name, code in OPERATIONS.items()}
_CONTROL_SHAPE = re.compile(r"allreduce\(sum, i64, count (\d+)\)")

UNEQUAL_HINT = "give every rank the same number of batches or use trainer.join()"
COLLECTIVE_HINT = "{op} is collective: call it on every rank"


def agree(comm, operation, steps, flag):
    """Collective: every rank's (steps, flag) as two int64 arrays of length world_size."""
    world = comm.world_size
    payload = np.zeros(2 * world + OPERATIONS[operation], dtype=np.int64)
    payload[comm.rank] = int(steps)
    payload[world + comm.rank] = int(flag)
    comm.allreduce(payload, "sum")
    return payload[:world], payload[world:2 * world]


def peer_operation(error, world):
    """The co2.torch operation a peer was in, read from a CollectiveMismatchError's message
    (None when the peer's collective was not one of ours: it was training)."""
    counts = [int(c) for c in _CONTROL_SHAPE.findall(str(error))]
    for count in counts:
        if count - 2 * world in _BY_CODE:
            return _BY_CODE[count - 2 * world]
    return None


def translate(error, world, rank, steps, mine):
    """A clearer exception for a peer failure in or around a co2.torch collective, or None.

    mine: the operation this rank was in (None: a training step or boundary)."""
    if not isinstance(error, _errors.PeerError):
        return None
    theirs = peer_operation(error, world) if isinstance(
        error, _errors.CollectiveMismatchError) else None
    for op in (mine, theirs):
        if op in ("state_dict()", "save_portable()") and mine != theirs:
            where = (f"this rank ({rank}) is in {mine}" if mine else
                     f"this rank ({rank}) was training at step {steps}")
            peer = f"a peer is in {theirs}" if theirs else "the peers were not"
            return _reraised(error, f"{COLLECTIVE_HINT.format(op=op)} ({where}; {peer})")
    if mine in ("finalize()", "synchronize()", "join round") or \
            theirs in ("finalize()", "synchronize()"):
        if mine is None or (mine == "join round" and theirs is None):
            text = (f"a peer stopped ({theirs or 'left'}) while this rank ({rank}) continues at "
                    f"step {steps}: unequal step counts; {UNEQUAL_HINT}")
        else:
            text = (f"rank {rank} stopped at step {steps} ({mine}) while others continue: "
                    f"unequal step counts; {UNEQUAL_HINT}")
        return _reraised(error, text)
    return None


def unequal_steps_error(steps, rank):
    """The error for an agreement whose step counts differ (None when they are equal)."""
    steps = [int(s) for s in steps]
    if min(steps) == max(steps):
        return None
    low = min(range(len(steps)), key=lambda r: steps[r])
    return UnequalStepsError(
        f"rank {low} stopped at step {steps[low]} while others continue (to step "
        f"{max(steps)}; steps by rank: {steps}): unequal step counts; {UNEQUAL_HINT}")


class UnequalStepsError(RuntimeError):
    """The ranks took different numbers of training steps."""


def _reraised(error, text):
    """The same co2 exception class, with the torch-level explanation first."""
    clearer = type(error)(f"{text}. [library: {error}]", error.status, error.function,
                          error.status_string, error.detail)
    clearer.__cause__ = error
    return clearer

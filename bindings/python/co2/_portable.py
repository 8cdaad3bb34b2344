"""The portable checkpoint: one file, written by rank 0, loadable at any world size or without co2.

    {"format": "co2.torch.portable/1",
     "model": the module's state_dict holding the model finalize() gives at this step (co2:
              the average in flight applied and the partial round's deltas averaged, as
              finalize() does them; sync, diloco, localsgd: synchronize()'s model; buffers that
              are not averaged: rank 0's),
     "optimizer": rank 0's inner-optimizer state_dict (or None),
     "engine": the shared engine state after that finalize() (co2_engine_save_portable: its anchor is
               "model", its outer momentum, counters; it loads at another world size,
               docs/capi.md), so that a resumed run continues from "model",
     "algorithm", "world_size", "steps"}

The run that saves is not changed by it: every rank saves its own engine state and its
parameters, finalizes, saves the finalized state, and then restores what it saved (a restart
from a checkpoint: co2_engine_load, then the rank's own mid-round values; collective on a sharded
engine). Every rank does the
same collectives in the same order, whatever its rank, sharding (shard_outer_state) or
hierarchy ("nodes"): a rank that returned early would leave the others waiting. The price: each
rank holds its engine state as bytes meanwhile (the size of co2_engine_state_size: a sharded
engine's is its shard), and rank 0 the portable state.

Rank 0's optimizer state rather than an average over ranks: it is one trajectory's consistent
state (Adam's first and second moments and step count belong together; an average of second
moments is not the second moment of anything), it needs no communication, and the inner state is
re-learnt within a few steps after the model restarts from the anchor anyway.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ._errors import CheckpointMismatchError
if TYPE_CHECKING:
    from .torch import Distributed, Path

FORMAT = "co2.torch.portable/1"


def check_matches(trainer: Distributed, saved_model: object, algorithm: object, what: str) -> None:
    """Raises co2.CheckpointMismatchError, naming the difference and what to do, when a
    checkpoint (its algorithm and the module's state_dict as saved) does not fit this trainer:
    the common case is a model changed since the save (a layer added, renamed or resized)."""
    if algorithm != trainer.algorithm:
        raise CheckpointMismatchError(
            f"{what} was saved by algorithm {algorithm!r}, this trainer runs "
            f"{trainer.algorithm!r}: distribute(..., algorithm={algorithm!r}) to resume it")
    if not isinstance(saved_model, dict):
        return
    current = trainer.module.state_dict()
    shapes = {k: tuple(v.shape) for k, v in saved_model.items() if hasattr(v, "shape")}
    missing = sorted(k for k in current if k not in saved_model)
    unexpected = sorted(k for k in saved_model if k not in current)
    resized = sorted(f"{k} {list(shapes[k])} -> {list(v.shape)}" for k, v in current.items()
                     if k in shapes and shapes[k] != tuple(v.shape))
    differences = "; ".join(part for part in (
        f"not in the checkpoint: {', '.join(missing)}" if missing else "",
        f"no longer in the model: {', '.join(unexpected)}" if unexpected else "",
        f"resized: {', '.join(resized)}" if resized else "") if part)
    if differences:
        raise CheckpointMismatchError(
            f"{what} was saved from another model ({differences}): resume with the model it was "
            f"saved from, or start the changed model from the old weights alone with "
            f"model.load_state_dict(weights, strict=False) before distribute()")


def save(trainer: Distributed, path: Path) -> None:
    """Collective; rank 0 writes `path` (atomically: a temporary file, then a rename)."""
    write = trainer.rank == 0
    engine = trainer.engine
    resume = engine.save()                        # this rank's state, to continue from
    assert resume is not None                     # keep=True: every rank keeps its bytes
    local = [t.detach().clone() for _, t, _ in trainer._segments]
    try:
        engine.finalize()
        engine_state = engine.save(keep=write, portable=True)
        model = {k: v.detach().to("cpu", copy=True) for k, v in
                 trainer.module.state_dict().items()} if write else None
        steps = engine.stats()["steps"]
    finally:
        engine.load(resume)                       # every rank its own (collective if sharded)
        with torch.no_grad():
            for (_, tensor, _), saved in zip(trainer._segments, local):
                tensor.copy_(saved)
    if not write:
        return
    optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else None
    state = {"format": FORMAT, "model": model, "optimizer": optimizer, "engine": engine_state,
             "algorithm": trainer.algorithm, "world_size": trainer.world_size, "steps": steps}
    temporary = f"{path}.tmp{os.getpid()}"
    torch.save(state, temporary)
    os.replace(temporary, path)


def read(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    state = torch.load(path, map_location=map_location)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a co2.torch portable checkpoint (written by "
                         f"trainer.save_portable(); a per-rank trainer.state_dict() is loaded "
                         f"with trainer.load_state_dict())")
    return state


def load(trainer: Distributed, path: Path) -> dict[str, Any]:
    """Not collective: every rank reads the same file. Parameters and averaged buffers become
    the consensus, the engine continues from the saved shared state, the optimizer from rank 0's
    state."""
    state = read(path)
    check_matches(trainer, state["model"], state["algorithm"], f"the portable checkpoint {path}")
    trainer.engine.load(state["engine"])
    with torch.no_grad():
        trainer.module.load_state_dict(state["model"])     # in place: the views stay
    if trainer.optimizer is not None and state["optimizer"] is not None:
        trainer._load_optimizer(state["optimizer"])
    return state

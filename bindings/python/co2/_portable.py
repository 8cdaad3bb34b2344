"""The portable checkpoint: one file, written by rank 0, loadable at any world size or without co2.

    {"format": "co2.torch.portable/1",
     "model": the module's state_dict holding the consensus (the engine's anchor: the model
              every rank agrees on; localsgd, which keeps none: the ranks' average; buffers
              that are not averaged: rank 0's),
     "optimizer": rank 0's inner-optimizer state_dict (or None),
     "engine": the shared engine state (co2_engine_save: anchor, outer momentum, the average
               in flight, counters; it loads at another world size, docs/capi.md),
     "algorithm", "world_size", "steps"}

Rank 0's optimizer state rather than an average over ranks: it is one trajectory's consistent
state (Adam's first and second moments and step count belong together; an average of second
moments is not the second moment of anything), it needs no communication, and the inner state is
re-learnt within a few steps after the model restarts from the anchor anyway.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .torch import Distributed, Path

FORMAT = "co2.torch.portable/1"


def save(trainer: Distributed, path: Path) -> None:
    """Collective; rank 0 writes `path` (atomically: a temporary file, then a rename)."""
    write = trainer.rank == 0
    engine_state = trainer.engine.save(keep=write)
    kind = trainer.consensus_kind             # localsgd: the ranks' average, collective
    if not write and kind == "anchor":
        return
    with trainer.consensus_weights(kind):
        model = {k: v.detach().to("cpu", copy=True) for k, v in
                 trainer.module.state_dict().items()} if write else None
    if not write:
        return
    optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else None
    state = {"format": FORMAT, "model": model, "optimizer": optimizer, "engine": engine_state,
             "algorithm": trainer.algorithm, "world_size": trainer.world_size,
             "steps": trainer.engine.stats()["steps"]}
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
    if state["algorithm"] != trainer.algorithm:
        raise ValueError(f"portable checkpoint of algorithm {state['algorithm']!r}, engine runs "
                         f"{trainer.algorithm!r}")
    trainer.engine.load(state["engine"])
    with torch.no_grad():
        trainer.module.load_state_dict(state["model"])     # in place: the views stay
    if trainer.optimizer is not None and state["optimizer"] is not None:
        trainer._load_optimizer(state["optimizer"])
    return state

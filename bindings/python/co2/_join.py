"""trainer.join(): ranks with fewer batches shadow the others' collectives (like torch's Join).

Inside the context every rank reports, at the start of each round (its first training forward
or optimizer step after a round boundary), whether it still trains: a small all-reduce of one
flag per rank (co2.torch's control collective, "join round"). A rank whose loop ended leaves the
with-block and shadows: it reports 0 at the same point, and while others still train it calls
the engine's step without changing its parameters (under sync: it takes part in the others'
gradient averages with zeros, so the average divides by the initial world size, as torch's
Join does — the bucket all-reduces of their backward (GradientSync.shadow_backward), or, with
reduce_in_backward=False, the average in optimizer.step, after which it applies the averaged
gradients with its optimizer; when all are done every rank takes the parameters of a rank that
trained to the end), so its delta is zero from its next round on. When every rank reports 0, all
leave together, at the same step count.
"""
from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Literal, Optional

import torch

if TYPE_CHECKING:
    from .torch import Distributed


class Join:
    def __init__(self, trainer: Distributed) -> None:
        self.trainer = trainer
        self.round_pending = True     # the next round starts with a report
        self.rounds = 0
        self.shadow_steps = 0
        self.last_active = 0          # a rank that trained in the latest round with any

    def __enter__(self) -> Join:
        if self.trainer._join is not None:
            raise RuntimeError("trainer.join() is already active")
        self.trainer._join = self
        return self

    def report_if_due(self, active: bool = True) -> Optional[int]:
        """Called before a rank's work of a round; returns how many ranks still train."""
        if not self.round_pending:
            return None
        self.round_pending = False
        self.rounds += 1
        _, flags = self.trainer._agree("join round", 1 if active else 0)
        if flags.any():
            self.last_active = int(flags.nonzero()[0][0])
        return int(flags.sum())

    def after_step(self, boundary: bool) -> None:
        if boundary:
            self.round_pending = True

    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        trainer = self.trainer
        try:
            if exc_type is not None:
                return False            # the peers learn of it by their timeout
            if trainer.algorithm == "sync" and trainer.optimizer is None:
                raise RuntimeError("join() under sync needs the optimizer attached "
                                   "(trainer.attach(optimizer)): a rank out of batches keeps "
                                   "taking the averaged gradients' optimizer steps")
            while True:
                if self.round_pending and self.report_if_due(active=False) == 0:
                    if trainer.algorithm == "sync":
                        self._adopt_parameters_of(self.last_active)
                    return False
                self.shadow_steps += 1
                if trainer.grad_sync is not None:
                    # The bucket all-reduces of the others' backward, with zeros from here;
                    # this rank's parameters wait for _adopt_parameters_of at the end.
                    trainer.grad_sync.shadow_backward()
                    trainer._engine_step()
                elif trainer.algorithm == "sync":
                    # Zero gradients into the average, then the optimizer's step with what
                    # arrives: the parameters stay those of the active ranks.
                    for _, p in trainer._params:
                        p.grad = torch.zeros_like(p)
                    assert trainer.optimizer is not None   # checked on entry
                    trainer.optimizer.step()     # wrapped: reduce, step, engine step
                else:
                    trainer._engine_step()
        finally:
            trainer._join = None

    def _adopt_parameters_of(self, root: int) -> None:
        """sync: every rank takes the parameters of a rank that trained to the end. A shadow
        applied the same averaged gradients, but with its own learning rate: an LR scheduler
        stepped in the user's loop stood still on it (torch's DDP Join likewise broadcasts the
        final model from the last rank that joined)."""
        trainer = self.trainer
        with torch.no_grad():
            if trainer.flat is not None:
                trainer.comm.broadcast(trainer.flat, root)
            else:
                for _, tensor, _ in trainer._segments:
                    trainer.comm.broadcast(tensor, root)

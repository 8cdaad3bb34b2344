"""How co2.torch notices a training loop that is not wired to the engine.

- A module belongs to at most one live Distributed (distribute() twice is an error).
- Parameter version counters: torch bumps a tensor's _version on every in-place change (every
  optimizer's update), the engine's own writes (through C) do not. A Distributed records the sum
  after each engine step; a different sum later means the parameters changed without an engine
  step: an optimizer co2 was not given, or weights loaded into the model after distribute().
- An optimizer created after distribute() is found through the garbage collector's referrers of
  a parameter the first time the module runs forward in training mode.
- A Distributed that trained but whose process exits (or which is closed or collected) without
  finalize() warns.
"""
import gc
import sys
import warnings
import weakref

import torch

_OWNER_ATTRIBUTE = "_co2_distributed"


class WiringError(RuntimeError):
    """The training loop is not wired to co2 the way co2.torch needs it."""


def claim(module, owner):
    previous = getattr(module, _OWNER_ATTRIBUTE, None)
    previous = previous() if previous is not None else None
    if previous is not None and previous.engine is not None:
        raise WiringError(f"this {type(module).__name__} is already distributed (rank "
                          f"{previous.rank} of {previous.world_size}): call distribute() once "
                          f"per model, or close() the first Distributed before distributing "
                          f"it again")
    object.__setattr__(module, _OWNER_ATTRIBUTE, weakref.ref(owner))


def release(module, owner):
    current = getattr(module, _OWNER_ATTRIBUTE, None)
    if current is not None and current() in (owner, None):
        object.__delattr__(module, _OWNER_ATTRIBUTE)


def version(params):
    """Sum of the parameters' version counters: changes with every in-place update."""
    return sum(p._version for _, p in params)


def optimizers_over(params):
    """The live torch optimizers all of whose parameters are among `params`. Walks the
    referrers up from one trained parameter (its param group's list, the group, the
    optimizer's param_groups, the optimizer or its __dict__): gc.get_objects() would also hand
    out every tensor, and holding those upsets autograd's bookkeeping."""
    anchor = next((p for _, p in params if p.requires_grad), None)
    if anchor is None:
        return []
    ids = {id(p) for _, p in params}
    optimizer_type = torch.optim.Optimizer
    found = []

    def owners_of(groups):
        for holder in gc.get_referrers(groups):
            if issubclass(type(holder), optimizer_type):       # 3.11: inline attributes
                yield holder
            elif type(holder) is dict and holder.get("param_groups") is groups:
                yield from (o for o in gc.get_referrers(holder)
                            if issubclass(type(o), optimizer_type))

    for members in gc.get_referrers(anchor):
        if type(members) is not list:
            continue
        for group in gc.get_referrers(members):
            if type(group) is not dict or group.get("params") is not members:
                continue
            for groups in gc.get_referrers(group):
                if type(groups) is not list:
                    continue
                for optimizer in owners_of(groups):
                    if optimizer.param_groups is not groups or optimizer in found:
                        continue
                    theirs = [p for g in optimizer.param_groups for p in g["params"]]
                    if all(id(p) in ids for p in theirs):
                        found.append(optimizer)
    return found


def check_optimizer(optimizer, params):
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"attach() takes a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    ids = {id(p) for _, p in params}
    foreign = sum(1 for group in optimizer.param_groups for p in group["params"]
                  if id(p) not in ids)
    if foreign:
        raise ValueError(f"the optimizer updates {foreign} tensor(s) that are not parameters of "
                         f"the distributed module: co2 would not average them")


class Lifecycle:
    """What the exit warning needs to know, kept apart from the Distributed so that the
    finalizer does not keep it alive."""

    __slots__ = ("rank", "steps_unsaved", "done")

    def __init__(self, rank):
        self.rank = rank
        self.steps_unsaved = 0    # engine steps since the last finalize/state_dict/save_portable
        self.done = False


def warn_unfinalized(life, when):
    if life.done or life.steps_unsaved == 0:
        return
    life.done = True
    message = (f"co2.torch (rank {life.rank}): {life.steps_unsaved} training steps ran after "
               f"distribute() (or the last checkpoint) but finalize() was never called before "
               f"{when}: the average in flight was dropped and the ranks' models differ; call "
               f"trainer.finalize() after the training loop")
    if sys.is_finalizing():
        print(f"RuntimeWarning: {message}", file=sys.stderr, flush=True)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def watch_exit(owner, life):
    """Warns at interpreter exit (or when `owner` is collected) unless finalized."""
    return weakref.finalize(owner, warn_unfinalized, life,
                            "the process exited (or the Distributed was collected)")

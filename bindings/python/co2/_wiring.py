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
- Changes that are not in-place edits bump no version counter: a cast or move of the model
  (model.bfloat16(), .half(), .to()), a parameter's .data replaced, a layer replaced or added,
  a parameter group added to the optimizer, a frozen parameter unfrozen under sync. Layout
  records what distribute() handed to the engine and names the first such change; the
  Distributed checks it at every training forward (autograd on, train() or eval() mode),
  optimizer step and collective operation.
"""
from __future__ import annotations

import gc
import sys
import warnings
import weakref

from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import torch

if TYPE_CHECKING:
    from .torch import Distributed

# (name, tensor) pairs, as module.named_parameters() gives them.
NamedTensors = Sequence[tuple[str, torch.Tensor]]

_OWNER_ATTRIBUTE = "_co2_distributed"


class WiringError(RuntimeError):
    """The training loop is not wired to co2 the way co2.torch needs it."""


class ModelChangedError(WiringError):
    """The model (its parameter set, a parameter's dtype, device or memory) or the optimizer's
    parameter groups changed after distribute(): co2 would average what it was given, not what
    trains."""


def claim(module: torch.nn.Module, owner: Distributed) -> None:
    previous = getattr(module, _OWNER_ATTRIBUTE, None)
    previous = previous() if previous is not None else None
    if previous is not None and previous.engine is not None:
        raise WiringError(f"this {type(module).__name__} is already distributed (rank "
                          f"{previous.rank} of {previous.world_size}): call distribute() once "
                          f"per model, or close() the first Distributed before distributing "
                          f"it again")
    object.__setattr__(module, _OWNER_ATTRIBUTE, weakref.ref(owner))


def release(module: torch.nn.Module, owner: Distributed) -> None:
    current = getattr(module, _OWNER_ATTRIBUTE, None)
    if current is not None and current() in (owner, None):
        object.__delattr__(module, _OWNER_ATTRIBUTE)


def version(params: NamedTensors) -> int:
    """Sum of the parameters' version counters: changes with every in-place update."""
    return sum(p._version for _, p in params)


def optimizers_over(params: NamedTensors,
                    holding_any: bool = False) -> list[torch.optim.Optimizer]:
    """The live torch optimizers all of whose parameters are among `params`, and that hold the
    first trained one (holding_any: any trained one; one scan still, but its cost grows with
    the number of parameters: for error messages). Walks the referrers up from the
    parameters (their param group's list, the group, the optimizer's param_groups, the
    optimizer or its __dict__): gc.get_objects() would also hand out every tensor, and holding
    those upsets autograd's bookkeeping."""
    anchors = [p for _, p in params if p.requires_grad]
    if not anchors:
        return []
    if not holding_any:
        anchors = anchors[:1]
    ids = {id(p) for _, p in params}
    optimizer_type = torch.optim.Optimizer
    found: list[torch.optim.Optimizer] = []

    def owners_of(groups: object) -> Iterator[Any]:
        for holder in gc.get_referrers(groups):
            if issubclass(type(holder), optimizer_type):       # 3.11: inline attributes
                yield holder
            elif type(holder) is dict and holder.get("param_groups") is groups:
                yield from (o for o in gc.get_referrers(holder)
                            if issubclass(type(o), optimizer_type))

    for members in gc.get_referrers(*anchors):
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


_DISTRIBUTE_AGAIN = "close() this trainer and distribute() the changed model"
_REBUILD = ("build the final model (cast, move, replace or add layers) before distribute(), or "
            + _DISTRIBUTE_AGAIN)


def _facts(tensor: torch.Tensor) -> tuple[Any, ...]:
    return tensor.data_ptr(), tensor.dtype, tensor.device, tuple(tensor.shape)


class Layout:
    """What distribute() handed to the engine: the module's parameters (objects, memory, dtype,
    device, shape), its averaged buffers, which parameters were trained, and the attached
    optimizer's parameter groups. check() names the first difference from the module now.

    check() runs at every training forward and optimizer step, so it first compares cheap signatures
    (each submodule's parameter and child objects, the parameters' data pointers: a cast or a
    move always allocates) and builds a message only when one differs."""

    def __init__(self, module: torch.nn.Module, params: NamedTensors, buffers: NamedTensors,
                 trained_only: bool) -> None:
        """params, buffers: [(name, tensor)] as the engine has them. trained_only: whether
        parameters that did not require a gradient at distribute() must not start to (under
        sync the gradient average covers only the parameters that required one then)."""
        self.module = module
        self.params = [(name, p, _facts(p)) for name, p in params]
        self.ids = [id(p) for _, p in params]
        self.tensors = [p for _, p in params]
        self.pointers = self._pointers()
        self._record_structure()
        # Averaged buffers, found again through their owner (a cast replaces the object).
        self.buffers = []
        for name, b in buffers:
            owner_path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            self.buffers.append((name, owner, leaf, b, _facts(b)))
        self.frozen = [(name, p) for name, p in params if trained_only and not p.requires_grad]
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.groups: Optional[tuple[int, ...]] = None

    def attach(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.groups = self._group_sizes(optimizer)

    def _record_structure(self) -> None:
        """Every submodule's parameter and child slots: (dict, key, object) and (dict, size)."""
        tables: list[Any] = [t for m in self.module.modules()
                             for t in (m._parameters, m._modules)]
        self.slots = [(table, key, value) for table in tables for key, value in table.items()]
        self.sizes = [(table, len(table)) for table in tables]

    def _same_structure(self) -> bool:
        return all(table.get(key) is value for table, key, value in self.slots) and \
            all(len(table) == size for table, size in self.sizes)

    def _pointers(self) -> list[int]:
        return list(map(torch.Tensor.data_ptr, self.tensors))

    @staticmethod
    def _group_sizes(optimizer: torch.optim.Optimizer) -> tuple[int, ...]:
        return tuple(len(group["params"]) for group in optimizer.param_groups)

    def check(self) -> Optional[ModelChangedError]:
        """None, or the ModelChangedError naming what changed and what to do."""
        message = (self._parameter_set() or self._storage() or self._unfrozen() or
                   self._optimizer_groups())
        return None if message is None else ModelChangedError(message)

    def _parameter_set(self) -> Optional[str]:
        if self._same_structure():
            return None
        now = list(self.module.named_parameters())
        if [id(p) for _, p in now] == self.ids:       # e.g. a layer without parameters added
            self._record_structure()
            return None
        then = {name for name, _, _ in self.params}
        names = {name for name, _ in now}
        kept = {id(p) for _, p in now} & set(self.ids)
        replaced = sorted(name for name, p in now if name in then and id(p) not in kept)
        added = sorted(names - then)
        removed = sorted(then - names)
        what = "; ".join(part for part in (
            f"replaced by new tensors: {', '.join(map(repr, replaced))} (a layer replaced?)"
            if replaced else "",
            f"added: {', '.join(map(repr, added))}" if added else "",
            f"removed: {', '.join(map(repr, removed))}" if removed else "") if part) or \
            "the same names in another order"
        return (f"the module's parameters changed after distribute() ({what}): co2 averages "
                f"only the parameters it was given, so the ranks would end with different "
                f"models: {_REBUILD}")

    def _storage(self) -> Optional[str]:
        if self._pointers() != self.pointers:
            return self._parameter_storage()
        return self._buffer_storage()

    def _parameter_storage(self) -> Optional[str]:
        for name, p, facts in self.params:
            change = _change(f"parameter {name!r}", facts, _facts(p))
            if change:
                return change
        return None

    def _buffer_storage(self) -> Optional[str]:
        for name, owner, leaf, b, facts in self.buffers:
            current = owner._buffers.get(leaf)
            if current is b and current.data_ptr() == facts[0]:
                continue
            if current is None:
                return (f"averaged buffer {name!r} was removed after distribute(): "
                        f"{_REBUILD}")
            change = _change(f"averaged buffer {name!r}", facts, _facts(current))
            if change:
                return change
        return None

    def _unfrozen(self) -> Optional[str]:
        thawed = [name for name, p in self.frozen if p.requires_grad]
        if not thawed:
            return None
        return (f"parameter(s) {', '.join(map(repr, thawed))} require a gradient now but did "
                f"not at distribute(): under sync their gradients are never averaged (the "
                f"average covers the parameters that required one at distribute(), as torch "
                f"DDP's), so the ranks would train different values: set requires_grad before "
                f"distribute() (to hold a layer still, give its param group lr 0), or close() "
                f"this trainer and distribute() again after unfreezing")

    def _optimizer_groups(self) -> Optional[str]:
        if self.optimizer is None or self._group_sizes(self.optimizer) == self.groups:
            return None
        ids = set(self.ids)
        foreign = sum(1 for group in self.optimizer.param_groups for p in group["params"]
                      if id(p) not in ids)
        if not foreign:
            self.groups = self._group_sizes(self.optimizer)   # the module's own parameters
            return None
        return (f"the attached optimizer's parameter groups changed after distribute() "
                f"(optimizer.add_param_group()?): it now updates {foreign} tensor(s) that are "
                f"not parameters of the distributed module, which co2 never averages, so the "
                f"ranks would train different values: make them parameters of the module "
                f"before distribute() (then add their group), or {_DISTRIBUTE_AGAIN}")


def _change(what: str, then: tuple[Any, ...], now: tuple[Any, ...]) -> Optional[str]:
    """The message for a tensor whose memory, dtype, device or shape differs from `then`."""
    if now == then:
        return None
    (_, dtype, device, shape), (_, new_dtype, new_device, new_shape) = then, now
    if new_dtype != dtype:
        cause = (f"is {new_dtype} now, was {dtype} at distribute(): the model was cast after "
                 f"distribute() (model.bfloat16(), .half(), .to(dtype)), so co2 averages a "
                 f"stale {dtype} copy while the module trains its own: cast the model before "
                 f"distribute() (co2 keeps a float32 outer state for bf16/fp16 parameters)")
    elif new_device != device:
        cause = (f"is on {new_device} now, was on {device} at distribute(): the model was "
                 f"moved after distribute() (model.to(), .cuda(), .cpu()), so co2 averages the "
                 f"stale copy it was given: move the model before distribute()")
    elif new_shape != shape:
        cause = (f"has shape {list(new_shape)} now, was {list(shape)} at distribute(): "
                 f"{_REBUILD}")
    else:
        cause = ("no longer lives in the memory co2 was given (its .data was replaced after "
                 "distribute(): p.data = ..., model.load_state_dict(..., assign=True), a cast or "
                 "move): co2 would average the old memory while the module trains the new: "
                 "change parameters in place (p.copy_(...)) or before distribute()")
    return f"{what} {cause}"


def check_optimizer(optimizer: object, params: NamedTensors) -> None:
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

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.steps_unsaved = 0    # engine steps since the last finalize/state_dict/save_portable
        self.done = False


def warn_unfinalized(life: Lifecycle, when: str) -> None:
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


def watch_exit(owner: Distributed, life: Lifecycle) -> weakref.finalize:
    """Warns at interpreter exit (or when `owner` is collected) unless finalized."""
    return weakref.finalize(owner, warn_unfinalized, life,
                            "the process exited (or the Distributed was collected)")

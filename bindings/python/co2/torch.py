"""co2.torch: data-parallel training of a torch.nn.Module with co2, about three changed lines.

    import co2.torch
    model = Net()
    trainer = co2.torch.distribute(model, algorithm="co2", tau=12)               # added
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer.attach(optimizer)       # or distribute(model, optimizer); found by itself otherwise
    for x, y in my_shard_of_the_data:                                            # unchanged
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()            # now also: co2's step (sync: grads averaged in backward)
    trainer.finalize()                                                           # added

What distribute() does:
  - creates the communicator from the launcher's environment (co2run, torchrun, mpirun, srun;
    a group of one otherwise) unless you pass `comm`;
  - moves the module's float32 parameters and its running statistics (BatchNorm's
    running_mean / running_var; see _roles.py and `buffers=`) into one flat tensor that it
    allocates and co2 adopts: each parameter becomes a view into it
    (`param.data = flat[offset:offset+n].view(shape)`), so the optimizer, the module and the
    engine share the memory and the engine runs one contiguous pass. flat=False registers the
    tensors as they are instead;
  - commits the layout: every rank starts from rank 0's weights; other buffers are broadcast
    from rank 0 once and then left to each rank;
  - under `sync`, averages the gradients during backward, as torch DDP does (bucketed,
    overlapped with backward; co2/_grad_sync.py): after loss.backward() every p.grad holds the
    rank average, so clip_grad_norm_ clips the average; `with trainer.no_sync():` accumulates
    without averaging. bucket_mb (default 25) sizes the buckets; reduce_in_backward=False
    averages in optimizer.step instead (the behaviour before 1.1); under the other algorithms
    no_sync() does nothing (no backward averages there: gradients accumulate anyway);
  - wraps optimizer.step (of the optimizer given, attached, or found at the first training
    forward, in train() or eval() mode) so that it runs the engine's step after the optimizer's.

What it checks (each failure names its cause; bindings/python/README.md): an optimizer that
steps without co2, a second optimizer besides the attached one (WiringError at the next
training forward — autograd on, in train() or eval() mode — or collective), a model changed
after distribute() in a way no version counter shows — cast or moved (model.bfloat16(),
.to()), a layer replaced or added, a parameter group of foreign tensors added to the
optimizer, a frozen parameter unfrozen under sync (ModelChangedError at the next training
forward, optimizer step or collective) —, a model distributed twice, training that ends
without finalize() (a warning), collective operations called on some ranks only and unequal
step counts (the control all-reduce of _control.py).

Device tensors (CUDA) go to the GPU path with the current stream when co2 was built with it;
otherwise the C API raises co2.UnsupportedError.
"""
from __future__ import annotations

import contextlib
import os
import types
import warnings
import weakref
from typing import (TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Literal, Mapping,
                    Optional, TypeVar, Union, cast)

try:
    import torch
except ImportError as missing:
    import sys
    raise ImportError(f"co2.torch needs PyTorch, which {sys.executable} cannot import "
                      f"({missing}): install it (Debian: apt-get install python3-torch) or run "
                      f"the Python that has it; the co2 package itself works without torch"
                      ) from missing

from . import _buffers, _control, _errors, _join, _portable, _roles, _values, _welcome, _wiring
from . import capi
from ._control import UnequalStepsError
from ._grad_sync import DEFAULT_BUCKET_MB, GradientSync, check_bucket_mb
from ._wiring import ModelChangedError, WiringError
from .communicator import Communicator
from .engine import HIERARCHIES, AlgorithmName, ConsensusName, Engine, EngineOptions, \
    EngineStats, Flag

if TYPE_CHECKING:
    from typing_extensions import Unpack

_Result = TypeVar("_Result")
# buffers=: one role for every buffer, or {name: role} on top of the default rule (_roles.py).
BufferRole = Literal["average", "broadcast", "ignore"]
Buffers = Union[BufferRole, Mapping[str, BufferRole], None]
# A path torch.save / torch.load take.
Path = Union[str, "os.PathLike[str]"]


class DistributeOptions(EngineOptions, total=False):
    """distribute()'s keyword arguments beyond its own: the engine's (EngineOptions) and, with
    hierarchy="nodes", who averages the gradients inside a node."""
    intra_node_average: Literal["co2", "framework"]

__all__ = ["distribute", "Distributed", "DistributeOptions", "load_portable", "WiringError",
           "ModelChangedError", "UnequalStepsError"]


class Distributed:
    """The engine behind a module and its optimizer; see co2.torch.distribute."""

    _forward_hook: Optional[torch.utils.hooks.RemovableHandle]

    def __init__(self, module: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 *, algorithm: Union[AlgorithmName, int] = "co2",
                 comm: Optional[Communicator] = None, flat: Flag = True,
                 buffers: Buffers = None, bucket_mb: float = DEFAULT_BUCKET_MB,
                 reduce_in_backward: Flag = True,
                 **engine_config: Unpack[DistributeOptions]) -> None:
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
        check_bucket_mb(bucket_mb)
        flat = bool(_values.flag("flat", flat))
        reduce_in_backward = bool(_values.flag("reduce_in_backward", reduce_in_backward))
        self.module = module
        self.optimizer: Optional[torch.optim.Optimizer] = None
        # An Engine and a Communicator from here until close(); None only while unmade.
        self.engine: Engine = None  # type: ignore[assignment]
        self.comm: Communicator = None  # type: ignore[assignment]
        self.grad_sync: Optional[GradientSync] = None
        # hierarchy="nodes": (intra, inter) for the intra-node average
        self._node_comms: tuple[Communicator, ...] = ()
        self._own_comm = comm is None
        self._params = [(name, p) for name, p in module.named_parameters()]
        if not self._params:
            raise ValueError("the module has no parameters")
        # Running statistics are averaged, other buffers broadcast once (_roles.py).
        self.buffer_roles = _roles.assign(module, buffers)
        self._buffers = [(name, b) for name, b, role in self.buffer_roles
                         if role == _roles.AVERAGE]
        _wiring.claim(module, self)
        # hierarchy="nodes": gradients are averaged inside the node every step, by co2
        # (intra_node_average="co2": in backward buckets, like sync) or by the framework's own
        # data parallelism over the node's ranks ("framework": torch DDP on a node group).
        intra_node_average = engine_config.pop("intra_node_average", "co2")
        self.hierarchical = False
        self._average_in_node = False
        if intra_node_average not in ("co2", "framework"):
            raise ValueError(f"intra_node_average is 'co2' or 'framework', not {intra_node_average!r}")
        try:
            self.comm = Communicator.from_env() if comm is None else comm
            self.engine = Engine(self.comm, algorithm, **cast(EngineOptions, engine_config))
            # What the engine took: a name in any case, or the C constant.
            hierarchy = engine_config.get("hierarchy")
            self.hierarchical = hierarchy is not None and _values.choice(
                HIERARCHIES, hierarchy, "hierarchy") == capi.CO2_HIERARCHY_NODES
            self._average_in_node = self.hierarchical and intra_node_average == "co2"
            self.algorithm = self.engine.algorithm
            self.flat: Optional[torch.Tensor] = None
            if flat:
                self._adopt_flat()
            else:
                self._register()
            self.engine.commit()
            # The optimizer state rank 0 sent, while no optimizer is attached here (attach loads it).
            self._welcome_state: Optional[dict[str, Any]] = None
            # A commit that joined a running elastic group takes the group's step count; a group
            # that forms starts at 0. The joiner then receives what the engine does not own.
            if self.engine.stats()["steps"] > 0:
                self._welcome_state = _welcome.share(self.comm, self.buffer_roles, None, joined=True)
            else:
                _roles.broadcast_once(self.comm, self.buffer_roles)
        except BaseException:
            self.close()
            raise
        # (name, tensor, "parameter" | "buffer") in the engine's element order.
        self._segments = [(n, t, "parameter") for n, t in self._params] + \
                         [(n, t, "buffer") for n, t in self._buffers]
        self._stream_memory = _buffers.TensorMemory(self._params[0][1].data, "parameters")
        self._original_step: Optional[Callable[..., Any]] = None
        self._original_load: Optional[Callable[..., Any]] = None
        self._join: Optional[_join.Join] = None
        self._searched = False
        self._evaluating = False        # inside consensus_weights(): not a training forward
        self._inside_step = False       # inside the wrapped optimizer.step (closure forwards)
        self._seen_version = _wiring.version(self._params)
        self._life = _wiring.Lifecycle(self.rank)
        self._exit_warning = _wiring.watch_exit(self, self._life)
        self_ref = weakref.ref(self)      # the module must not keep its Distributed alive

        def before_forward(_module: torch.nn.Module, _inputs: Any) -> None:
            trainer = self_ref()
            if trainer is not None:
                trainer._before_forward()

        self._forward_hook = module.register_forward_pre_hook(before_forward)
        # sync: gradients averaged in backward hooks (after the layout: .data changes reset them)
        self.grad_sync = None
        if self._average_in_node and reduce_in_backward:
            # The engine has its own node communicators; these carry the backward buckets.
            self._node_comms = self.comm.split_nodes()
            self.grad_sync = GradientSync(
                self._params, self._node_comms[0], bucket_mb,
                explain=lambda error: _alive(self_ref)._explained(error, None))
        elif self.algorithm == "sync" and reduce_in_backward:
            self.grad_sync = GradientSync(
                self._params, self.comm, bucket_mb,
                explain=lambda error: _alive(self_ref)._explained(error, None))
        # What the engine (and the backward hooks) were given, checked before every use.
        self._layout = _wiring.Layout(module, self._params, self._buffers,
                                      trained_only=self.grad_sync is not None)
        if optimizer is not None:
            self.attach(optimizer)

    # --- setup ----------------------------------------------------------------------------------

    def _adopt_flat(self) -> None:
        tensors = self._params + self._buffers
        first = tensors[0][1]
        for name, t in tensors:
            _buffers.parameter_dtype(t, repr(name))
            if t.device != first.device or t.is_sparse:
                raise TypeError(f"flat storage needs dense tensors on one device; "
                                f"{name!r} is {t.dtype} on {t.device} (pass flat=False)")
        # One flat per engine, so one dtype: float32, or bf16/fp16 parameters (the engine keeps
        # its outer state in fp32 for them).
        dtypes = sorted({str(t.dtype) for _, t in tensors})
        if len(dtypes) > 1:
            raise TypeError(f"flat storage holds one dtype but the module has {', '.join(dtypes)}: "
                            f"cast it to one (model.bfloat16(), model.float()) or pass flat=False "
                            f"(each tensor is registered with its own dtype)")
        total = sum(t.numel() for _, t in tensors)
        self.flat = torch.empty(total, dtype=first.dtype, device=first.device)
        self.engine.adopt_flat(self.flat)
        offset = 0
        with torch.no_grad():
            for index, (name, t) in enumerate(tensors):
                n = t.numel()
                view = self.flat[offset:offset + n].view_as(t)
                view.copy_(t)
                t.data = view   # the Parameter object stays: optimizers keep working
                role: Literal["parameter", "buffer"] = \
                    "parameter" if index < len(self._params) else "buffer"
                self.engine.add_segment(name, offset, n, role)
                offset += n

    def _register(self) -> None:
        # Each tensor keeps its dtype (float32, bfloat16, float16; fp64 is refused with what to do).
        for name, p in self._params:
            self.engine.register(name, p.data, "parameter")
        for name, b in self._buffers:
            self.engine.register(name, b.data, "buffer")

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """optimizer.step becomes: [reduce gradients (sync)], the original step, engine step.
        A bound method (not a plain function) so torch's LR schedulers can wrap it again."""
        original = optimizer.step
        distributed = self

        def step(opt: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            distributed._check_layout()     # before the optimizer applies anything
            distributed._start_round()
            if distributed.grad_sync is not None:
                distributed.grad_sync.before_step()
            elif distributed.algorithm == "sync" or distributed._average_in_node:
                if args or kwargs.get("closure") is not None:
                    raise NotImplementedError("sync with a closure optimizer (LBFGS): call "
                                              "reduce_gradients() inside the closure and "
                                              "distributed.step() after optimizer.step()")
                distributed.reduce_gradients()
            # A closure optimizer (LBFGS) runs forwards between its own updates: part of this step.
            distributed._inside_step = True
            try:
                result = original(*args, **kwargs)
            finally:
                distributed._inside_step = False
            distributed._start_round()
            distributed._engine_step()    # the layout was checked before the optimizer's step
            return result

        # An LR scheduler made before distribute() wrapped step with its step counter and
        # checks for that marker: keep it (the counter still runs inside `original`).
        if getattr(original, "_with_counter", False):
            step._with_counter = True  # type: ignore[attr-defined]
        self._original_step = original
        optimizer.step = types.MethodType(step, optimizer)  # type: ignore[assignment]

    def attach(self, optimizer: torch.optim.Optimizer, *, _stepped: bool = False) -> Distributed:
        """Hands `optimizer` (over this module's parameters) to co2: its step() then also runs
        the engine's step (and under sync averages the gradients first). For an optimizer
        created after distribute(); call it before the first optimizer.step()."""
        if self.optimizer is optimizer:
            return self
        if self.optimizer is not None:
            raise WiringError("an optimizer is already attached: co2.torch drives one "
                              "optimizer per model (put several parameter groups into one)")
        _wiring.check_optimizer(optimizer, self._params)
        if optimizer.state and not _stepped and self.engine.stats()["steps"] == 0:
            warnings.warn("the optimizer holds state from earlier steps but co2's engine "
                          "starts afresh (anchor = these weights, no outer momentum, no average "
                          "in flight): a torch-style resume of model + optimizer continues "
                          "differently from the run it saved; resume with "
                          "trainer.load_state_dict() (exact) or trainer.load_portable()",
                          RuntimeWarning, stacklevel=3)
        self.optimizer = optimizer
        self._layout.attach(optimizer)
        self._hook(optimizer)
        original_load = optimizer.load_state_dict

        def load_state_dict(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
            warnings.warn("optimizer.load_state_dict() after distribute() restores only the "
                          "inner optimizer, not co2's engine state (anchor, outer momentum, "
                          "average in flight, step count): the run continues differently from "
                          "the one saved; use trainer.load_state_dict() or "
                          "trainer.load_portable()", RuntimeWarning, stacklevel=2)
            return original_load(state_dict)

        self._original_load = original_load
        optimizer.load_state_dict = types.MethodType(  # type: ignore[assignment]
            load_state_dict, optimizer)
        if self._welcome_state is not None:
            state, self._welcome_state = self._welcome_state, None
            self._load_optimizer(state)
        return self

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        if self._original_load is not None:
            self._original_load(state)
        elif self.optimizer is not None:
            self.optimizer.load_state_dict(state)

    def _before_forward(self) -> None:
        """A forward with autograd on, in train() or eval() mode (training; not inside
        consensus_weights() or a closure optimizer's step): the first time, find an optimizer
        created after distribute(); always, refuse a model changed since distribute() and
        parameters changed without an engine step. Forwards without autograd (inference) train
        nothing and are left alone."""
        if not torch.is_grad_enabled() or self.engine is None or self._evaluating \
                or self._inside_step:
            return
        self._check_layout()
        if self.optimizer is None and not self._searched:
            self._searched = True
            found = _wiring.optimizers_over(self._params)
            if len(found) == 1:
                self.attach(found[0])
        if _wiring.version(self._params) != self._seen_version:
            self._changed_outside()
        if self.module.training:
            self._start_round()

    def _check_layout(self) -> None:
        """Raises ModelChangedError when the model or the optimizer's groups changed since
        distribute() in a way no version counter shows (a cast, a replaced layer, ...)."""
        error = self._layout.check()
        if error is not None:
            raise error

    def _changed_outside(self) -> None:
        """The parameters changed in place since the engine last saw them."""
        found = _wiring.optimizers_over(self._params) if self.optimizer is None else []
        if len(found) == 1 and self.algorithm != "sync":
            # Created after the first forward: its first step ran without the engine's, which
            # the engine takes now (the same order as the wrapped step: optimizer, engine).
            self.attach(found[0], _stepped=True)
            self.step()
            return
        raise WiringError(self._unwired_message(self.rank))

    def _unwired_message(self, rank: int) -> str:
        if self.optimizer is None:
            return (f"rank {rank}: the parameters changed but co2's engine was never stepped: "
                    f"the optimizer was never attached: call trainer.attach(optimizer) (or "
                    f"distribute(model, optimizer)) before the first optimizer.step()")
        others = [o for o in _wiring.optimizers_over(self._params, holding_any=True)
                  if o is not self.optimizer]
        if others:
            return (f"rank {rank}: the parameters changed without co2's engine step, and "
                    f"besides the attached optimizer ({type(self.optimizer).__name__}) another "
                    f"one ({', '.join(type(o).__name__ for o in others)}) updates this model's "
                    f"parameters: co2.torch steps the engine after the attached optimizer "
                    f"only, so a second optimizer's updates bypass co2: put all parameters "
                    f"into the attached optimizer (one param group per setting: "
                    f"optimizer.add_param_group()) and step that one")
        return (f"rank {rank}: the parameters changed in place outside co2 after its last step "
                f"(model.load_state_dict() after distribute()?): load weights before "
                f"distribute(), or restore with trainer.load_state_dict() / "
                f"trainer.load_portable()")

    # --- training -------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def _stream(self) -> Optional[int]:
        return _buffers.current_stream(self._stream_memory)

    def reduce_gradients(self) -> None:
        """Averages the gradients across ranks (collective, blocking). Reads param.grad now:
        frameworks reallocate gradients, and a None gradient contributes zeros. Under sync with
        reduce_in_backward (the default) backward has averaged them already: an error."""
        if self.grad_sync is not None:
            raise RuntimeError("reduce_gradients: under sync the gradients are averaged during "
                               "backward already (distribute(reduce_in_backward=False) averages "
                               "them here instead)")
        grads = []
        for name, p in self._params:
            g = p.grad
            if g is not None:
                if g.is_sparse:
                    raise TypeError(f"sparse gradient of {name!r} is not supported")
                if not g.is_contiguous():
                    p.grad = g = g.contiguous()
            grads.append(g)
        try:
            self.engine.reduce_gradients(grads, self._stream())
        except _errors.Error as exc:
            raise self._explained(exc, None) from None

    def no_sync(self) -> ContextManager[None]:
        """Context for gradient accumulation, as DDP's. Where gradients are averaged in
        backward (sync, and hierarchy="nodes" inside a node), backward passes inside it leave
        each rank's gradients unaveraged, accumulating in p.grad; the next backward outside it
        averages the sum. Everywhere else (co2, localsgd, diloco; reduce_in_backward=False) no
        backward averages anything, so p.grad accumulates anyway and the context does nothing:
        a DDP loop that accumulates under no_sync() runs unchanged."""
        if self.grad_sync is None:
            return contextlib.nullcontext()
        return self.grad_sync.no_sync()

    def step(self) -> bool:
        """The engine's step (done by optimizer.step when an optimizer is attached). True at a
        round boundary."""
        self._check_layout()
        self._start_round()
        return self._engine_step()

    def _engine_step(self) -> bool:
        world_size = self.comm.world_size
        try:
            boundary = self.engine.step(self._stream())
        except _errors.MembershipChangedError:
            # The engine set the parameters to the group's anchor: that is not a change behind
            # co2's back. The loop re-reads rank / world_size and goes on.
            self._seen_version = _wiring.version(self._params)
            if self.comm.world_size > world_size:
                self._welcome_joiners()
            raise
        except _errors.LeftError:
            # leave() was granted: the parameters are the group's anchor (set by the engine, as
            # finalize() would), so nothing is unsaved and nothing changed behind co2's back.
            self._seen_version = _wiring.version(self._params)
            self._life.steps_unsaved = 0
            raise
        except _errors.Error as exc:
            raise self._explained(exc, None) from None
        self._seen_version = _wiring.version(self._params)
        self._life.steps_unsaved += 1
        if self._join is not None:
            self._join.after_step(boundary)
        return boundary

    def _welcome_joiners(self) -> None:
        """The members' side of _welcome.share, right after the engine admitted processes. A
        failure here (a joiner lost meanwhile) is left to the next step, which re-forms the group:
        the joiner is then gone, and nothing is half-applied on the members."""
        try:
            _welcome.share(self.comm, self.buffer_roles, self.optimizer, joined=False)
        except _errors.Error as exc:
            warnings.warn(f"co2.torch: sending the joining processes rank 0's optimizer state failed "
                          f"({exc}); the next step re-forms the group without them", RuntimeWarning,
                          stacklevel=4)

    def _start_round(self) -> None:
        if self._join is not None:
            self._join.report_if_due(active=True)

    # --- collectives ----------------------------------------------------------------------------

    def _steps(self) -> int:
        return self.engine.stats()["steps"]

    def _agree(self, operation: str, flag: Union[bool, int]) -> tuple[Any, Any]:
        """The control collective before `operation` (see _control.py)."""
        try:
            return _control.agree(self.comm, operation, self._steps(), flag)
        except _errors.Error as exc:
            raise self._explained(exc, operation) from None

    def _collective(self, operation: str, run: Callable[[], _Result]) -> _Result:
        """Checks that every rank is wired and at the same step, then runs `run`."""
        self._check_layout()
        changed = _wiring.version(self._params) != self._seen_version
        steps, flags = self._agree(operation, changed)
        unwired = [r for r in range(self.world_size) if flags[r]]
        if unwired:
            mine = self._unwired_message(self.rank) if changed else \
                f"rank(s) {unwired}: the parameters changed without co2's engine step"
            raise WiringError(f"{operation}: {mine}")
        unequal = _control.unequal_steps_error(steps)
        if unequal is not None:
            raise unequal
        try:
            result = run()
        except _errors.Error as exc:
            raise self._explained(exc, operation) from None
        self._seen_version = _wiring.version(self._params)
        return result

    def _explained(self, error: _errors.Error, operation: Optional[str]) -> BaseException:
        """The library's error, in the training loop's terms where co2.torch knows more."""
        if isinstance(error, _errors.NonFiniteError):
            return self._nonfinite(error)
        steps = self._steps() if self.engine is not None else 0
        clearer = _control.translate(error, self.world_size, self.rank, steps, operation)
        return clearer if clearer is not None else error

    def _nonfinite(self, error: _errors.Error) -> _errors.Error:
        for name, tensor, role in self._segments:
            if not bool(torch.isfinite(tensor).all()):
                where = f"{role} {name!r} holds NaN or Inf on rank {self.rank}"
                break
        else:
            where = (f"no parameter or averaged buffer is NaN/Inf on rank {self.rank} now "
                     f"(a rank's parameters diverged during the round; the engine reset them "
                     f"to the anchor)")
        clearer = type(error)(f"{where}. [library: {error}]", error.status, error.function,
                              error.status_string, error.detail)
        clearer.__cause__ = error
        return clearer

    def synchronize(self) -> None:
        """Collective: every rank ends with the identical model (changes the trajectory: for
        evaluation use consensus_weights())."""
        self._collective("synchronize()", self.engine.synchronize)

    def finalize(self) -> None:
        """Collective. End of training: applies the average in flight and the steps since the
        last boundary (no step's work is lost); every rank then holds the same model. Fails with UnequalStepsError when the ranks took different numbers of
        steps (use join()), with WiringError when an optimizer stepped without co2."""
        self._collective("finalize()", self.engine.finalize)
        self._life.steps_unsaved = 0

    def leave(self) -> None:
        """Elastic groups: asks to leave without ending the group (a preemption notice). Returns
        at once; keep training: the step at which the group lets this rank go raises
        co2.LeftError (the module then holds the group's model, every step's work kept), and
        co2.MembershipChangedError on the other ranks. See docs/capi.md, "Leaving"."""
        self.engine.leave()

    def join(self) -> _join.Join:
        """Context for uneven inputs: `with trainer.join(): for batch in my_batches: ...`.
        A rank whose batches ran out shadows the others' rounds with zero updates until every
        rank is done (a one-flag all-reduce per round inside the context). See _join.py."""
        return _join.Join(self)

    @property
    def consensus_kind(self) -> ConsensusName:
        """consensus_weights()'s default: "anchor", or "local_average" for localsgd, which
        keeps no anchor."""
        return "local_average" if self.algorithm == "localsgd" else "anchor"

    @contextlib.contextmanager
    def consensus_weights(self, kind: Union[ConsensusName, int, None] = None
                          ) -> Iterator[torch.nn.Module]:
        """Puts the consensus model into the module for the with-block (evaluation) and restores
        this rank's parameters after, bitwise: the training trajectory does not change.
        kind "anchor" (the model the ranks agreed on at the last boundary; no communication, so
        one rank may evaluate alone; sharded or hierarchical: the anchor the next boundary starts
        from, the average in flight included; the default) or "local_average" (the average of the ranks' current parameters;
        collective: every rank enters the block at the same step; localsgd's default)."""
        kind = self.consensus_kind if kind is None else kind
        local = [t.detach().clone() for _, t, _ in self._segments]
        consensus = torch.empty(sum(t.numel() for t in local), dtype=torch.float32,
                                device=local[0].device)
        try:
            self.engine.consensus(kind, out=consensus)
        except _errors.Error as exc:
            raise self._explained(exc, f"consensus_weights({kind!r})") from None
        offset = 0
        with torch.no_grad():
            for _, tensor, _ in self._segments:
                n = tensor.numel()
                tensor.copy_(consensus[offset:offset + n].view_as(tensor))
                offset += n
        self._evaluating = True
        try:
            yield self.module
        finally:
            self._evaluating = False
            with torch.no_grad():
                for (_, tensor, _), saved in zip(self._segments, local):
                    tensor.copy_(saved)
            self._seen_version = _wiring.version(self._params)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    # --- checkpoint -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Collective: call it on every rank. Everything needed to continue this rank exactly:
        the shared engine state (bytes), this rank's parameters and buffers as they are
        mid-round, and the optimizer's state. Put it into your own dict (with the data
        position) and torch.save it per rank. For one file that loads at any world size (or in
        plain torch) use save_portable()."""
        def build() -> dict[str, Any]:
            return {"engine": self.engine.save(),
                    "rank": self.rank, "world_size": self.world_size,
                    "algorithm": self.algorithm,
                    "module": {k: v.detach().clone()
                               for k, v in self.module.state_dict().items()},
                    "optimizer": (self.optimizer.state_dict()
                                  if self.optimizer is not None else None)}
        state = self._collective("state_dict()", build)
        self._life.steps_unsaved = 0
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores what state_dict() returned (after distribute() on a fresh process: same
        model, optimizer and engine configuration). Not collective, except with sharded outer
        state (shard_outer_state, hierarchy "nodes"): there state_dict() holds this rank's shard
        of the engine state, and every rank loads its own at once (same rank, same world
        size; save_portable() moves between them)."""
        if not isinstance(state, dict) or "engine" not in state:
            raise ValueError("load_state_dict() takes what trainer.state_dict() returned (with "
                             "the engine state); a model's own state_dict does not restore "
                             "co2's anchor and outer momentum")
        _portable.check_matches(self, state.get("module"), state.get("algorithm"),
                                "the checkpoint")
        self.engine.load(state["engine"])            # parameters = restored anchor
        with torch.no_grad():                        # then this rank's mid-round values,
            for key, value in self.module.state_dict().items():   # in place (views stay)
                value.copy_(state["module"][key])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self._load_optimizer(state["optimizer"])
        self._seen_version = _wiring.version(self._params)

    def save_portable(self, path: Path) -> None:
        """Collective: call it on every rank; rank 0 writes `path`: one file with the model
        finalize() gives at this step (a plain state_dict), rank 0's optimizer state and the
        finalized engine state, which load_portable() restores at any world size. This run goes
        on unchanged. See _portable.py."""
        self._collective("save_portable()", lambda: _portable.save(self, path))
        self._life.steps_unsaved = 0

    def load_portable(self, path: Path) -> dict[str, Any]:
        """Every rank reads the file save_portable() wrote, at any world size (collective with
        sharded outer state: every rank loads at once). Every rank restarts from the consensus
        model."""
        state = _portable.load(self, path)
        self._seen_version = _wiring.version(self._params)
        return state

    # --- lifetime -------------------------------------------------------------------------------

    def close(self, _warn: bool = True) -> None:
        """Destroys the engine (and the communicator if distribute() created it) and gives the
        optimizer its own step back. The parameters stay views of self.flat, which torch owns.
        Warns when steps ran since the last finalize() or checkpoint."""
        life = getattr(self, "_life", None)
        if life is not None:
            if _warn and self.engine is not None:
                _wiring.warn_unfinalized(life, "close()")
            life.done = True
            self._exit_warning.detach()
        if getattr(self, "_forward_hook", None) is not None:
            assert self._forward_hook is not None
            self._forward_hook.remove()
            self._forward_hook = None
        if self.optimizer is not None:
            if self._original_step is not None:
                self.optimizer.step = self._original_step  # type: ignore[assignment]
                self._original_step = None
            if self._original_load is not None:
                self.optimizer.load_state_dict = self._original_load  # type: ignore[assignment]
                self._original_load = None
        if self.grad_sync is not None:
            self.grad_sync.close()
            self.grad_sync = None
        for node_comm in self._node_comms:
            node_comm.close()
        self._node_comms = ()
        if self.engine is not None:
            self.engine.close()
            self.engine = None  # type: ignore[assignment]
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None  # type: ignore[assignment]
        _wiring.release(self.module, self)

    def __enter__(self) -> Distributed:
        return self

    def __exit__(self, exc_type: Optional[type[BaseException]], *exc: Any) -> None:
        self.close(_warn=exc_type is None)


def _alive(reference: weakref.ref[Distributed]) -> Distributed:
    """The Distributed a backward hook belongs to (alive while its hooks can run)."""
    return cast(Distributed, reference())


def distribute(module: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None, *,
               algorithm: Union[AlgorithmName, int] = "co2", comm: Optional[Communicator] = None,
               flat: Flag = True, buffers: Buffers = None, bucket_mb: float = DEFAULT_BUCKET_MB,
               reduce_in_backward: Flag = True,
               **engine_config: Unpack[DistributeOptions]) -> Distributed:
    """Hands `module`'s parameters to a co2 engine and returns the Distributed object (attach(),
    finalize(), join(), consensus_weights(), no_sync(), state_dict(), save_portable(), stats(),
    rank, world_size, close()). The optimizer may be given here, attached later with
    trainer.attach(optimizer), or is found by itself at the first training forward.
    buffers: None (running statistics averaged, other buffers broadcast once from rank 0), a
    role ("average", "broadcast", "ignore") for all, or {name: role}.
    sync: bucket_mb sizes the gradient buckets averaged during backward; reduce_in_backward=False
    averages in optimizer.step instead.
    Engine keywords (tau, outer_lr, outer_momentum, nesterov, penalty, clip, eager,
    wire_format, shard_outer_state, hierarchy, apply_step, ...) keep
    the C API's defaults when left out. Collective: every rank calls it with the same model.
    hierarchy="nodes" (co2 only): sync inside a node, co2 across nodes (nodes from the launcher:
    co2run --nnodes, torchrun, srun); intra_node_average="co2" averages the gradients inside the
    node during backward (like sync), "framework" leaves it to the caller's own data
    parallelism over the node's ranks (torch DDP on a node group: examples/python/hierarchical).
    Ranks of a node that hold different parameters at a boundary fail loudly."""
    return Distributed(module, optimizer, algorithm=algorithm, comm=comm, flat=flat,
                       buffers=buffers, bucket_mb=bucket_mb,
                       reduce_in_backward=reduce_in_backward, **engine_config)


def load_portable(path: Path, map_location: Any = "cpu") -> dict[str, Any]:
    """Reads a portable checkpoint without co2's engine: a dict whose "model" is a plain
    state_dict of the consensus model (model.load_state_dict(ckpt["model"])) and "optimizer"
    rank 0's optimizer state."""
    return _portable.read(path, map_location)

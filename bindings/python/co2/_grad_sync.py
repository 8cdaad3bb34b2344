"""Gradient averaging inside backward for co2.torch under algorithm="sync", the way torch's
DistributedDataParallel does it: when loss.backward() returns, every p.grad holds the average
over the ranks, so what the user does between backward and optimizer.step (clip_grad_norm_,
GradScaler.unscale_, logging the gradient norm) sees the same gradient on every rank, as with
DDP, and the all-reduce overlaps the rest of backward.

Mechanism (torch >= 1.13; no register_post_accumulate_grad_hook there):
  - the trained parameters are split into buckets, in reverse registration order (backward
    produces the last layers' gradients first), each closed once it holds `bucket_mb` MiB of
    float32; the first is smaller (FIRST_BUCKET_MB) so that communication starts early;
  - a post-hook on each parameter's AccumulateGrad node copies p.grad into its bucket once
    autograd has written it; a bucket whose parameters are all in is all-reduced
    asynchronously (co2.Communicator.allreduce_async, op "avg"), but only after every bucket
    before it: the ranks issue the same collectives in the same order whatever order autograd
    runs the hooks in (the communicator pairs collectives by issue order and checks their
    identity and shape);
  - a callback queued on autograd's engine runs when backward ends: parameters that got no
    gradient in this backward contribute their p.grad as it is (accumulated under no_sync) or
    zeros, the remaining buckets are launched in order, every request is waited for (with a
    timeout) and the averages are copied back into p.grad.

Each bucket carries one extra float per parameter, 1 if the rank had a gradient for it: after
the average a parameter that no rank touched keeps p.grad None (like DDP); one that some rank
touched gets the average on every rank, so the optimizers of all ranks update the same tensors.
Gradients are averaged in float32 whatever the parameter's dtype.
"""
from __future__ import annotations

import contextlib
import time

from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import torch

from ._errors import Error as Co2Error
from ._errors import TimeoutError as Co2TimeoutError
from .communicator import TIMEOUT_VARIABLE, default_timeout_ms

if TYPE_CHECKING:
    from .communicator import Communicator

NamedParameters = Sequence[tuple[str, torch.Tensor]]

DEFAULT_BUCKET_MB = 25.0       # torch DDP's bucket_cap_mb
FIRST_BUCKET_MB = 1.0          # DDP's first bucket: the last layers' gradients leave early
# A rank waits for each bucket's all-reduce at the end of backward at most timeout_s before it
# reports that another rank did not run the same backward (unequal steps, no_sync on one rank
# only); by default as long as a communicator's no-progress timeout: CO2_TIMEOUT_MS if set, else
# the C API's CO2_DEFAULT_TIMEOUT_MS (5 minutes).
_BYTES_PER_ELEMENT = 4         # buckets are float32


class _Bucket:
    __slots__ = ("index", "params", "offsets", "numel", "buffer", "flags", "missing", "request",
                 "ready")

    def __init__(self, index: int, params: list[tuple[int, str, torch.Tensor]]) -> None:
        self.index = index
        self.params = params               # [(slot, name, Parameter)]
        self.offsets: list[int] = []
        offset = 0
        for _, _, p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.numel = offset                # gradients; then one "had a gradient" flag each
        self.buffer: Any = None            # a float32 tensor from the first launch on
        self.flags = [0.0] * len(params)   # written into the buffer's tail at launch
        self.missing = 0
        self.request: Any = None           # the Request of its all-reduce in flight
        self.ready = False


def check_bucket_mb(bucket_mb: object) -> None:
    """ValueError unless bucket_mb is a positive number (before distribute() builds anything)."""
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or \
            not bucket_mb > 0:
        raise ValueError(f"bucket_mb must be a number > 0 (MiB), got {bucket_mb!r}")


def plan_buckets(params: NamedParameters, bucket_mb: float,
                 first_bucket_mb: float = FIRST_BUCKET_MB) -> list[list[tuple[str, torch.Tensor]]]:
    """Lists of (name, Parameter) per bucket, in reverse order of `params`. As DDP does, a
    bucket is closed once it holds bucket_mb MiB or more (the first: min(first_bucket_mb,
    bucket_mb)), so it exceeds the size by less than its last parameter, and a bias is not
    left alone in a bucket of its own before its weight."""
    limit = max(1, int(bucket_mb * (1 << 20)) // _BYTES_PER_ELEMENT)
    first = min(int(first_bucket_mb * (1 << 20)) // _BYTES_PER_ELEMENT, limit)
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, p in reversed(params):
        current.append((name, p))
        size += p.numel()
        if size >= (first if not buckets else limit):
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class GradientSync:
    """Averages the gradients of `params` ([(name, Parameter)], the same list on every rank)
    over `comm` during backward. Created by co2.torch.distribute(algorithm="sync")."""

    def __init__(self, params: NamedParameters, comm: Communicator,
                 bucket_mb: float = DEFAULT_BUCKET_MB, timeout_s: Optional[float] = None,
                 explain: Optional[Callable[[Co2Error], BaseException]] = None) -> None:
        """explain(error): the exception to raise for a failed bucket all-reduce (co2.torch
        names the cause, e.g. unequal step counts); None raises the library's. timeout_s None:
        the communicators' default no-progress timeout (CO2_TIMEOUT_MS, else 5 minutes)."""
        check_bucket_mb(bucket_mb)
        if timeout_s is None:
            timeout_s = default_timeout_ms() / 1000.0
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.comm = comm
        self.explain = explain
        self.timeout_s = float(timeout_s)
        self.bucket_mb = float(bucket_mb)
        trained = [(name, p) for name, p in params if p.requires_grad]
        self.buckets = [_Bucket(i, [(j, name, p) for j, (name, p) in enumerate(group)])
                        for i, group in enumerate(plan_buckets(trained, self.bucket_mb))]
        self._where: dict[int, tuple[_Bucket, int]] = {}   # id(param) -> (bucket, slot)
        for bucket in self.buckets:
            for slot, _, p in bucket.params:
                self._where[id(p)] = (bucket, slot)
        self._seen: set[int] = set()                     # id(param) whose hook ran in this backward
        self._next_launch = 0
        self._in_backward = False
        self._broken: Optional[str] = None     # why the state can no longer be trusted
        self._enabled = True                   # False inside no_sync()
        self._reduced_since_step = False
        self.backward_reductions = 0           # statistics: reduced backward passes,
        self.wait_ns = 0                       # time spent waiting at the end of backward
        self._accumulators: list[Any] = []                # the AccumulateGrad nodes must stay alive
        self._handles: list[Any] = []
        with torch.enable_grad():
            for bucket in self.buckets:
                for _, name, p in bucket.params:
                    node = p.expand_as(p).grad_fn.next_functions[0][0]
                    self._accumulators.append(node)
                    self._handles.append(node.register_hook(self._make_hook(p, name)))

    # --- user-facing ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside do not average: gradients accumulate in p.grad on each rank;
        the first backward after the context averages the accumulated sum."""
        previous, self._enabled = self._enabled, False
        try:
            yield
        finally:
            self._enabled = previous

    def before_step(self) -> None:
        """Called by optimizer.step: fails loudly where the gradients it is about to apply were
        not averaged (backward ended in an error, or only ran under no_sync, or the
        parameters' gradient accumulators were replaced after distribute())."""
        if self._broken is not None:
            raise RuntimeError(self._broken)
        if self._in_backward:
            self._fail("sync: a backward pass ended without finishing its gradient average (an "
                       "error inside backward?); the ranks' collectives no longer match")
        if not self._reduced_since_step and self._any_gradient():
            raise RuntimeError(
                "sync: optimizer.step() would apply gradients that were not averaged across "
                "ranks: run a backward outside trainer.no_sync() before every step (and do not "
                "move or cast the model, e.g. model.to()/.half(), after distribute(): that "
                "replaces the gradient hooks)")
        self._reduced_since_step = False

    def shadow_backward(self) -> None:
        """The collectives of one averaging backward with nothing from this rank (zeros, no
        gradient flags): for a rank without a batch while the others train (a join), so that
        the ranks' collectives still match. This rank's gradients are left alone; the others
        get their sum divided by the world size."""
        if self._in_backward:
            raise RuntimeError("shadow_backward() inside a backward pass")
        if self._broken is not None:
            raise RuntimeError(self._broken)
        for bucket in self.buckets:
            if bucket.buffer is None:
                bucket.buffer = self._new_buffer(bucket)
            bucket.buffer.zero_()
            bucket.request = self.comm.allreduce_async(bucket.buffer, "avg")
        self._wait_all()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._accumulators = []

    # --- backward ------------------------------------------------------------------------------

    def _any_gradient(self) -> bool:
        return any(p.grad is not None for b in self.buckets for _, _, p in b.params)

    def _fail(self, message: str) -> None:
        self._broken = message
        raise RuntimeError(message)

    def _make_hook(self, param: torch.Tensor, name: str) -> Callable[..., None]:
        key = id(param)

        def hook(*_: Any) -> None:
            if not self._enabled:
                return
            if self._broken is not None:
                raise RuntimeError(self._broken)
            if not self._in_backward:
                self._start()
            if key in self._seen:
                self._fail(f"sync: parameter {name!r} received its gradient twice in one "
                           f"backward (reentrant activation checkpointing runs a backward "
                           f"inside backward): use torch.utils.checkpoint(..., "
                           f"use_reentrant=False)")
            self._seen.add(key)
            bucket, slot = self._where[key]
            self._contribute(bucket, slot, name, param)
            bucket.missing -= 1
            if bucket.missing == 0:
                bucket.ready = True
                self._launch_ready()

        return hook

    def _start(self) -> None:
        self._in_backward = True
        self._seen.clear()
        self._next_launch = 0
        for bucket in self.buckets:
            if bucket.buffer is None:
                bucket.buffer = self._new_buffer(bucket)
            bucket.missing = len(bucket.params)
            bucket.ready = False
            bucket.request = None
        torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    @staticmethod
    def _new_buffer(bucket: _Bucket) -> torch.Tensor:
        return torch.empty(bucket.numel + len(bucket.params), dtype=torch.float32,
                           device=bucket.params[0][2].device)

    def _contribute(self, bucket: _Bucket, slot: int, name: str, p: torch.Tensor) -> None:
        offset, n = bucket.offsets[slot], p.numel()
        grad = p.grad
        with torch.no_grad():
            if grad is None:
                bucket.buffer[offset:offset + n].zero_()
                bucket.flags[slot] = 0.0
                return
            if grad.is_sparse:
                self._fail(f"sync: the sparse gradient of {name!r} is not supported")
            bucket.buffer[offset:offset + n].view_as(grad).copy_(grad)
            bucket.flags[slot] = 1.0

    def _launch_ready(self) -> None:
        """Launches the ready buckets in bucket order: bucket i only after buckets < i."""
        while self._next_launch < len(self.buckets):
            bucket = self.buckets[self._next_launch]
            if not bucket.ready:
                return
            bucket.buffer[bucket.numel:].copy_(torch.tensor(bucket.flags))
            if bucket.buffer.is_cuda:
                # The communicator's collectives run on its own stream: the copies above, on
                # the current stream, must have finished.
                torch.cuda.current_stream(bucket.buffer.device).synchronize()
            bucket.request = self.comm.allreduce_async(bucket.buffer, "avg")
            self._next_launch += 1

    def _finish(self) -> None:
        """End of backward: the buckets with parameters autograd did not reach, then waits."""
        try:
            for bucket in self.buckets[self._next_launch:]:
                if not bucket.ready:
                    for slot, name, p in bucket.params:
                        if id(p) not in self._seen:
                            self._contribute(bucket, slot, name, p)
                    bucket.ready = True
            self._launch_ready()
            self._wait_all()
            with torch.no_grad():
                for bucket in self.buckets:
                    self._write_back(bucket)
        finally:
            self._in_backward = False
        self._reduced_since_step = True
        self.backward_reductions += 1

    def _wait_all(self) -> None:
        start = time.perf_counter_ns()
        for bucket in self.buckets:
            try:
                bucket.request.wait(timeout_ms=self.timeout_s * 1000.0)
            except Co2TimeoutError:
                self._fail(
                    f"sync: the gradient all-reduce of bucket {bucket.index} did not complete "
                    f"within {self.timeout_s:g} s: another rank did not run the same backward "
                    f"(fewer batches on one rank? no_sync() on one rank only?); the ranks no "
                    f"longer agree (the environment's {TIMEOUT_VARIABLE}, in milliseconds, sets this "
                    f"wait)")
            except Co2Error as error:
                raise (self.explain(error) if self.explain else error) from None
            bucket.request = None
        self.wait_ns += time.perf_counter_ns() - start

    def _write_back(self, bucket: _Bucket) -> None:
        flags = bucket.buffer[bucket.numel:].tolist()
        for (slot, _, p), offset, flag in zip(bucket.params, bucket.offsets, flags):
            if flag == 0.0:             # no rank had a gradient: stays as it is (None)
                continue
            average = bucket.buffer[offset:offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = average.to(p.dtype, copy=True)
            else:
                p.grad.copy_(average)

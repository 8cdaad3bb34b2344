"""co2.torch: data-parallel training of a torch.nn.Module with co2, about three changed lines.

    import co2.torch
    model = Net(); optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, algorithm="co2", tau=12)   # added
    for x, y in my_shard_of_the_data:                                            # unchanged
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()            # now also: co2's step (sync: grads averaged in backward)
    trainer.finalize()                                                           # added

What distribute() does:
  - creates the communicator from the launcher's environment (co2run, torchrun, mpirun, srun;
    a group of one otherwise) unless you pass `comm`;
  - moves the module's float32 parameters and float32 buffers (BatchNorm statistics) into one
    flat tensor that it allocates and co2 adopts: each parameter becomes a view into it
    (`param.data = flat[offset:offset+n].view(shape)`), so the optimizer, the module and the
    engine share the memory and the engine runs one contiguous pass. flat=False registers the
    tensors as they are instead;
  - commits the layout: every rank starts from rank 0's weights;
  - under `sync`, averages the gradients during backward, as torch DDP does (bucketed,
    overlapped with backward; co2/_grad_sync.py): after loss.backward() every p.grad holds the
    rank average, so clip_grad_norm_ clips the average; `with trainer.no_sync():` accumulates
    without averaging. bucket_mb (default 25) sizes the buckets; reduce_in_backward=False
    averages in optimizer.step instead (the behaviour before 1.1);
  - wraps optimizer.step so that it runs the engine's step after the optimizer's.

Device tensors (CUDA) go to the GPU path with the current stream when co2 was built with it;
otherwise the C API raises co2.UnsupportedError.
"""
import types

import torch

from . import _buffers
from ._grad_sync import DEFAULT_BUCKET_MB, GradientSync, check_bucket_mb
from .communicator import Communicator
from .engine import Engine


class Distributed:
    """The engine behind a module and its optimizer; see co2.torch.distribute."""

    def __init__(self, module, optimizer=None, *, algorithm="co2", comm=None, flat=True,
                 bucket_mb=DEFAULT_BUCKET_MB, reduce_in_backward=True, **engine_config):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"expected a torch.nn.Module, got {type(module).__name__}")
        check_bucket_mb(bucket_mb)
        self.module = module
        self.optimizer = optimizer
        self._own_comm = comm is None
        self.comm = Communicator.from_env() if comm is None else comm
        self.engine = None
        self.engine = Engine(self.comm, algorithm, **engine_config)
        self.algorithm = self.engine.algorithm
        self._params = [(name, p) for name, p in module.named_parameters()]
        if not self._params:
            raise ValueError("the module has no parameters")
        # float32 buffers (BatchNorm statistics) are averaged; others (counters) stay per rank.
        self._buffers = [(name, b) for name, b in module.named_buffers()
                         if b is not None and b.dtype == torch.float32]
        self.flat = None
        if flat:
            self._adopt_flat()
        else:
            self._register()
        self.engine.commit()
        self._stream_memory = _buffers.TensorMemory(self._params[0][1].data, "parameters")
        self._original_step = None
        # sync: gradients averaged in backward hooks (after the layout: .data changes reset them)
        self.grad_sync = None
        if self.algorithm == "sync" and reduce_in_backward:
            self.grad_sync = GradientSync(self._params, self.comm, bucket_mb)
        if optimizer is not None:
            self._hook(optimizer)

    # --- setup ----------------------------------------------------------------------------------

    def _adopt_flat(self):
        tensors = self._params + self._buffers
        first = tensors[0][1]
        for name, t in tensors:
            if t.dtype != torch.float32 or t.device != first.device or t.is_sparse:
                raise TypeError(f"flat storage needs dense float32 tensors on one device; "
                                f"{name!r} is {t.dtype} on {t.device} (pass flat=False)")
        total = sum(t.numel() for _, t in tensors)
        self.flat = torch.empty(total, dtype=torch.float32, device=first.device)
        self.engine.adopt_flat(self.flat)
        offset = 0
        with torch.no_grad():
            for index, (name, t) in enumerate(tensors):
                n = t.numel()
                view = self.flat[offset:offset + n].view_as(t)
                view.copy_(t)
                t.data = view   # the Parameter object stays: optimizers keep working
                role = "parameter" if index < len(self._params) else "buffer"
                self.engine.add_segment(name, offset, n, role)
                offset += n

    def _register(self):
        for name, p in self._params:
            self.engine.register(name, p.data, "parameter")
        for name, b in self._buffers:
            self.engine.register(name, b.data, "buffer")

    def _hook(self, optimizer):
        """optimizer.step becomes: [reduce gradients (sync)], the original step, engine step.
        A bound method (not a plain function) so torch's LR schedulers can wrap it again."""
        original = optimizer.step
        distributed = self

        def step(opt, *args, **kwargs):
            if distributed.grad_sync is not None:
                distributed.grad_sync.before_step()
            elif distributed.algorithm == "sync":
                if args or kwargs.get("closure") is not None:
                    raise NotImplementedError("sync with a closure optimizer (LBFGS): call "
                                              "reduce_gradients() inside the closure and "
                                              "distributed.step() after optimizer.step()")
                distributed.reduce_gradients()
            result = original(*args, **kwargs)
            distributed.step()
            return result

        self._original_step = original
        optimizer.step = types.MethodType(step, optimizer)

    # --- training -------------------------------------------------------------------------------

    @property
    def rank(self):
        return self.comm.rank

    @property
    def world_size(self):
        return self.comm.world_size

    def _stream(self):
        return _buffers.current_stream(self._stream_memory)

    def reduce_gradients(self):
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
        self.engine.reduce_gradients(grads, self._stream())

    def no_sync(self):
        """Context (sync): backward passes inside it leave each rank's gradients unaveraged,
        accumulating in p.grad; the next backward outside it averages the sum, as DDP's."""
        if self.grad_sync is None:
            raise RuntimeError(f"no_sync() is for algorithm 'sync' with reduce_in_backward; "
                               f"this trainer runs {self.algorithm!r}")
        return self.grad_sync.no_sync()

    def step(self):
        """The engine's step (done by optimizer.step when an optimizer was given). True at a
        round boundary."""
        return self.engine.step(self._stream())

    def synchronize(self):
        """Collective: every rank ends with the identical model (e.g. before evaluation)."""
        self.engine.synchronize()

    def finalize(self):
        """Collective. End of training: applies the average in flight; every rank then holds
        the same model."""
        self.engine.finalize()

    def stats(self):
        return self.engine.stats()

    # --- checkpoint -----------------------------------------------------------------------------

    def state_dict(self):
        """Collective. Everything needed to continue this rank exactly: the shared engine state
        (bytes), this rank's parameters and buffers as they are mid-round, and the optimizer's
        state. Put it into your own dict (with the data position) and torch.save it per rank."""
        state = {"engine": self.engine.save(),
                 "rank": self.rank, "world_size": self.world_size,
                 "algorithm": self.algorithm,
                 "module": {k: v.detach().clone() for k, v in self.module.state_dict().items()}}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.state_dict()
        return state

    def load_state_dict(self, state):
        """Not collective. Restores what state_dict() returned (after distribute() on a fresh
        process: same model, optimizer and engine configuration)."""
        if state.get("algorithm") != self.algorithm:
            raise ValueError(f"checkpoint of algorithm {state.get('algorithm')!r}, engine runs "
                             f"{self.algorithm!r}")
        self.engine.load(state["engine"])            # parameters = restored anchor
        with torch.no_grad():                        # then this rank's mid-round values,
            for key, value in self.module.state_dict().items():   # in place (views stay)
                value.copy_(state["module"][key])
        if self.optimizer is not None and "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])

    # --- lifetime -------------------------------------------------------------------------------

    def close(self):
        """Destroys the engine (and the communicator if distribute() created it) and gives the
        optimizer its own step back. The parameters stay views of self.flat, which torch owns."""
        if self.optimizer is not None and self._original_step is not None:
            self.optimizer.step = self._original_step
            self._original_step = None
        if self.grad_sync is not None:
            self.grad_sync.close()
            self.grad_sync = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        if self._own_comm and self.comm is not None:
            self.comm.close()
            self.comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def distribute(module, optimizer=None, *, algorithm="co2", comm=None, flat=True,
               bucket_mb=DEFAULT_BUCKET_MB, reduce_in_backward=True, **engine_config):
    """Hands `module`'s parameters (and `optimizer`'s step) to a co2 engine; returns the
    Distributed object (finalize(), state_dict(), stats(), rank, world_size, close()).
    Engine keywords (tau, outer_lr, outer_momentum, nesterov, penalty, clip, ...) keep the C
    API's defaults when left out. Collective: every rank calls it with the same model."""
    return Distributed(module, optimizer, algorithm=algorithm, comm=comm, flat=flat,
                       bucket_mb=bucket_mb, reduce_in_backward=reduce_in_backward,
                       **engine_config)

"""The checks of co2.torch's gradient averaging in backward (algorithm "sync", co2/_grad_sync.py),
each one rank's part given a communicator: test_grad_sync.py runs them with ranks as threads
(the local transport) and, through co2run, as processes (grad_sync_worker.py).

Every rank knows every rank's data (a function of step and rank), so each computes its
references alone: the mean of the per-rank gradients, and one process training on the
concatenated batch (mean loss: its gradient is the average of the ranks' gradients)."""
import numpy as np
import torch
import torch.nn.functional as F

import co2
import co2.torch

# Buckets of 16 floats: the model below then has 7 of them; the first (the `extra` head) is
# ready last where autograd reaches `extra` last, and holds parameters no rank but 0 uses.
SMALL_BUCKET_MB = 64 / (1 << 20)
# The ranks' averages differ from the reference mean by the rounding of a different sum order.
RTOL, ATOL = 1e-5, 1e-7


class Net(torch.nn.Module):
    """An MLP, a head only some ranks use (`extra`) and one no rank uses (`never`)."""

    def __init__(self):
        super().__init__()
        self.never = torch.nn.Linear(4, 4)
        self.a = torch.nn.Linear(6, 16)
        self.b = torch.nn.Linear(16, 16)
        self.c = torch.nn.Linear(16, 3)
        self.extra = torch.nn.Linear(6, 3)

    def forward(self, x, use_extra=False, extra_first=False):
        side = self.extra(x) if use_extra and extra_first else None
        out = self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))
        if use_extra:
            out = out + (side if side is not None else self.extra(x))
        return out


def make_net(seed=0):
    """The same weights on every rank, from a private generator (ranks may be threads)."""
    net = Net()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return net


def batch(step, rank, size=4):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def local_grads(net, step, rank, **forward):
    """Rank `rank`'s own gradients at `net`'s weights (a copy: `net` is left alone)."""
    twin = make_net()
    twin.load_state_dict(net.state_dict())
    x, y = batch(step, rank)
    F.cross_entropy(twin(x, **forward), y).backward()
    return {name: (None if p.grad is None else p.grad.clone())
            for name, p in twin.named_parameters()}


def identical_on_every_rank(comm, tensor):
    """Bitwise: the int32 view's minimum and maximum over the ranks are equal."""
    bits = tensor.detach().contiguous().view(torch.int32).clone()
    low, high = comm.allreduce(bits.clone(), "min"), comm.allreduce(bits.clone(), "max")
    return torch.equal(low, high)


def assert_average(comm, net, per_rank):
    """Every p.grad is the mean of the ranks' gradients (None where no rank had one) and
    bitwise the same on every rank."""
    world = comm.world_size
    for name, p in net.named_parameters():
        grads = [g[name] for g in per_rank]
        if all(g is None for g in grads):
            assert p.grad is None, f"{name}: no rank had a gradient, got one"
            continue
        assert p.grad is not None, f"{name}: no averaged gradient"
        want = sum(torch.zeros_like(p) if g is None else g for g in grads) / world
        torch.testing.assert_close(p.grad, want, rtol=RTOL, atol=ATOL, msg=name)
        assert identical_on_every_rank(comm, p.grad), f"{name}: differs across ranks"


def check_average_in_buckets(comm):
    """After backward the gradients are the rank average, with several buckets in flight."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                              bucket_mb=SMALL_BUCKET_MB) as trainer:
        assert len(trainer.grad_sync.buckets) >= 5
        for step in range(3):
            per_rank = [local_grads(net, step, r) for r in range(comm.world_size)]
            optimizer.zero_grad(set_to_none=True)
            x, y = batch(step, comm.rank)
            F.cross_entropy(net(x), y).backward()
            assert_average(comm, net, per_rank)
            optimizer.step()
        assert trainer.grad_sync.backward_reductions == 3


def clipped_training(comm, steps=4, max_norm=0.05, **options):
    """Trains with clip_grad_norm_ between backward and step, as a DDP user does; returns the
    parameters and the norms clip_grad_norm_ saw."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    norms = []
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm, **options) as trainer:
        for step in range(steps):
            optimizer.zero_grad(set_to_none=True)
            x, y = batch(step, comm.rank)
            F.cross_entropy(net(x), y).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
            optimizer.step()
        trainer.finalize()
    return [p.detach().clone() for p in net.parameters()], norms


def clipped_reference(world, steps=4, max_norm=0.05):
    """One process on the concatenated batch: what DDP computes."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    norms = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        xs, ys = zip(*(batch(step, r) for r in range(world)))
        F.cross_entropy(net(torch.cat(xs)), torch.cat(ys)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        optimizer.step()
    return [p.detach().clone() for p in net.parameters()], norms


def check_clip_sees_the_average(comm, **options):
    params, norms = clipped_training(comm, **options)
    want_params, want_norms = clipped_reference(comm.world_size)
    assert all(n > 0.05 for n in want_norms), want_norms   # every step clipped
    np.testing.assert_allclose(norms, want_norms, rtol=1e-5)
    for got, want in zip(params, want_params):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert identical_on_every_rank(comm, got)


def check_unused_parameters(comm):
    """`extra` is used on rank 0 only: every rank gets rank 0's gradient / W; `never` keeps
    None everywhere; after the step the ranks still hold one model."""
    net = make_net()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                              bucket_mb=SMALL_BUCKET_MB) as trainer:
        for step in range(2):
            per_rank = [local_grads(net, step, r, use_extra=(r == 0))
                        for r in range(comm.world_size)]
            optimizer.zero_grad(set_to_none=True)
            x, y = batch(step, comm.rank)
            F.cross_entropy(net(x, use_extra=(comm.rank == 0)), y).backward()
            assert_average(comm, net, per_rank)
            assert net.extra.weight.grad is not None and net.never.weight.grad is None
            optimizer.step()
        trainer.finalize()
        for p in net.parameters():
            assert identical_on_every_rank(comm, p)
        assert "never.weight" not in [n for n, p in net.named_parameters()
                                      if optimizer.state.get(p)]


def check_no_sync_accumulation(comm):
    """Two micro-batches, the first under no_sync: the gradient is the rank average of each
    rank's sum; a step after only no_sync backward passes is refused on every rank."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                              bucket_mb=SMALL_BUCKET_MB) as trainer:
        world = comm.world_size
        first = [local_grads(net, 0, r) for r in range(world)]
        second = [local_grads(net, 1, r) for r in range(world)]
        summed = [{k: (None if a[k] is None else a[k] + b[k]) for k in a}
                  for a, b in zip(first, second)]
        optimizer.zero_grad(set_to_none=True)
        with trainer.no_sync():
            x, y = batch(0, comm.rank)
            F.cross_entropy(net(x), y).backward()
        own = first[comm.rank]
        for name, p in net.named_parameters():       # nothing averaged yet
            if own[name] is not None:
                torch.testing.assert_close(p.grad, own[name], rtol=0, atol=0, msg=name)
        x, y = batch(1, comm.rank)
        F.cross_entropy(net(x), y).backward()
        assert_average(comm, net, summed)
        optimizer.step()

        optimizer.zero_grad(set_to_none=True)
        with trainer.no_sync():
            x, y = batch(2, comm.rank)
            F.cross_entropy(net(x), y).backward()
        try:
            optimizer.step()
        except RuntimeError as exc:
            assert "not averaged" in str(exc), exc
        else:
            raise AssertionError("a step after only no_sync backward passes was accepted")


def check_bucket_order(comm):
    """Autograd reaches the parameters in a different order on odd ranks (the `extra` branch
    is built first there, so its gradients come last); the buckets still go out in one order,
    or the communicator would refuse the mismatched collectives."""
    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    order = []
    for name, p in net.named_parameters():
        p.register_hook(lambda g, name=name: order.append(name))
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                              bucket_mb=SMALL_BUCKET_MB) as trainer:
        extra_first = comm.rank % 2 == 1
        forward = {"use_extra": True, "extra_first": extra_first}
        per_rank = [local_grads(net, 0, r, use_extra=True, extra_first=r % 2 == 1)
                    for r in range(comm.world_size)]
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(0, comm.rank)
        F.cross_entropy(net(x, **forward), y).backward()
        assert_average(comm, net, per_rank)
        optimizer.step()
        assert len(trainer.grad_sync.buckets) >= 5
    # the orders did differ: "extra" gradients came last on odd ranks, first on even ones
    position = torch.tensor([order.index("extra.weight")], dtype=torch.int32)
    if comm.world_size > 1:
        assert not identical_on_every_rank(comm, position), order


def check_closure_optimizer(comm):
    """LBFGS calls its closure (backward) several times per step: each backward averages."""
    net = make_net()
    optimizer = torch.optim.LBFGS(net.parameters(), lr=0.5, max_iter=3)
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm) as trainer:
        for step in range(2):
            x, y = batch(step, comm.rank)

            def closure():
                optimizer.zero_grad()
                loss = F.cross_entropy(net(x), y)
                loss.backward()
                return loss

            optimizer.step(closure)
        trainer.finalize()
    reference = make_net()
    ref_opt = torch.optim.LBFGS(reference.parameters(), lr=0.5, max_iter=3)
    for step in range(2):
        xs, ys = zip(*(batch(step, r) for r in range(comm.world_size)))
        x, y = torch.cat(xs), torch.cat(ys)

        def ref_closure():
            ref_opt.zero_grad()
            loss = F.cross_entropy(reference(x), y)
            loss.backward()
            return loss

        ref_opt.step(ref_closure)
    for got, want in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=1e-4, atol=1e-5)
        assert identical_on_every_rank(comm, got)


def check_activation_checkpointing(comm):
    """Non-reentrant checkpointing recomputes the forward inside the same backward: every
    parameter still reaches its hook once, and the gradients are the average."""
    from torch.utils.checkpoint import checkpoint

    net = make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                              bucket_mb=SMALL_BUCKET_MB):
        per_rank = [local_grads(net, 0, r) for r in range(comm.world_size)]
        optimizer.zero_grad(set_to_none=True)
        x, y = batch(0, comm.rank)
        F.cross_entropy(checkpoint(net, x, use_reentrant=False), y).backward()
        assert_average(comm, net, per_rank)
        optimizer.step()


CHECKS = {
    "activation_checkpointing": check_activation_checkpointing,
    "average_in_buckets": check_average_in_buckets,
    "clip_sees_the_average": check_clip_sees_the_average,
    "unused_parameters": check_unused_parameters,
    "no_sync_accumulation": check_no_sync_accumulation,
    "bucket_order": check_bucket_order,
    "closure_optimizer": check_closure_optimizer,
}

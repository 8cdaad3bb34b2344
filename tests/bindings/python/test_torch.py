"""co2.torch with ranks as threads of this process (the `local` transport): gradients handed
over on every call, parameters as views of the flat storage, convergence on the digits example,
checkpoint and restart. test_multiprocess.py repeats the training and checkpoint tests with real
processes."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import co2
import co2.torch
import digits                                   # examples/python/digits.py
from conftest import local_comm, run_ranks, unique_group

torch.set_num_threads(1)

# The accuracy the example documents for 4 ranks, 30 epochs (examples/python/README.md).
ACCURACY_THRESHOLD = 0.95


def tiny_model(seed):
    with digits._init_lock:                     # torch's default generator is process-global
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                   torch.nn.Linear(8, 3))


def tiny_batch(step, rank, size=5):
    """Deterministic data: the data position is the step number."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(size, 6, generator=g), torch.randint(0, 3, (size,), generator=g)


def test_sync_with_set_to_none_equals_one_big_batch():
    """sync over W ranks with batches b_r == one process on the concatenated batch, when the
    gradients are set to None (and so reallocated) before every backward."""
    world, steps = 3, 12
    group = unique_group()

    def rank_main(rank):
        model = tiny_model(rank)                         # commit gives everyone rank 0's
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with local_comm(rank, world, group) as comm, \
                co2.torch.distribute(model, optimizer, algorithm="sync", comm=comm) as trainer:
            pointers = set()
            for step in range(steps):
                optimizer.zero_grad(set_to_none=True)
                assert all(p.grad is None for p in model.parameters())
                x, y = tiny_batch(step, rank)
                F.cross_entropy(model(x), y).backward()
                pointers.add(next(model.parameters()).grad.data_ptr())
                optimizer.step()
            trainer.finalize()
            return [p.detach().clone() for p in model.parameters()]

    results = run_ranks(world, rank_main)
    reference = tiny_model(0)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        xs, ys = zip(*(tiny_batch(step, r) for r in range(world)))
        F.cross_entropy(reference(torch.cat(xs)), torch.cat(ys)).backward()
        optimizer.step()
    for params in results:
        for got, want in zip(params, reference.parameters()):
            torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    for params in results[1:]:
        for a, b in zip(params, results[0]):
            assert torch.equal(a, b)


def test_parameters_become_views_and_schedulers_still_work():
    model = tiny_model(0)
    params_before = list(model.parameters())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with local_comm(0, 1, unique_group()) as comm, \
            co2.torch.distribute(model, optimizer, algorithm="co2", comm=comm, tau=3) as trainer:
        start = trainer.flat.data_ptr()
        end = start + trainer.flat.numel() * 4
        for p, q in zip(model.parameters(), params_before):
            assert p is q                                   # same Parameter objects
            assert start <= p.data_ptr() < end              # ... now views of the flat storage
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        boundaries = 0
        for step in range(6):
            optimizer.zero_grad()
            x, y = tiny_batch(step, 0)
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            scheduler.step()
        assert trainer.stats()["steps"] == 6 and trainer.stats()["rounds"] == 2
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 0.5 ** 3)
        trainer.finalize()
    # close() gives the optimizer its own step back; the views stay valid (torch owns flat)
    optimizer.step()
    assert float(next(model.parameters()).sum()) == float(next(model.parameters()).sum())


@pytest.mark.parametrize("flat", [True, False])
def test_batchnorm_buffers_are_averaged(flat):
    world, group = 2, unique_group()

    def rank_main(rank):
        with digits._init_lock:
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                        torch.nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with local_comm(rank, world, group) as comm, \
                co2.torch.distribute(model, optimizer, algorithm="localsgd", comm=comm,
                                     tau=2, flat=flat) as trainer:
            for step in range(4):
                optimizer.zero_grad()
                x, y = tiny_batch(step, rank, size=8)
                F.cross_entropy(model(x + rank), y).backward()
                optimizer.step()
            trainer.finalize()
            return {k: v.clone() for k, v in model.state_dict().items()}

    a, b = run_ranks(world, rank_main)
    for key in a:
        if a[key].dtype == torch.float32:
            assert torch.equal(a[key], b[key]), key
    assert not torch.equal(a["1.running_mean"], torch.zeros(8))


@pytest.mark.parametrize("algorithm", ["sync", "co2"])
def test_digits_reaches_the_documented_accuracy(algorithm):
    world, group = 4, unique_group()
    data = digits.load_digits()

    def rank_main(rank):
        with local_comm(rank, world, group) as comm:
            return digits.train_co2(algorithm, comm, data, seed=0)

    results = run_ranks(world, rank_main)
    for r in results[1:]:
        np.testing.assert_array_equal(r["parameters"], results[0]["parameters"])
    assert results[0]["accuracy"] >= ACCURACY_THRESHOLD, results[0]["accuracy"]


# --- checkpoint -------------------------------------------------------------------------------------

def train_steps(model, optimizer, rank, first, last):
    for step in range(first, last):
        optimizer.zero_grad(set_to_none=True)
        x, y = tiny_batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


@pytest.mark.parametrize("algorithm", ["co2", "sync", "diloco"])
def test_checkpoint_restart_continues_exactly(algorithm, tmp_path):
    """Save mid-round (co2: with an average in flight), throw everything away, start fresh
    engines from different weights, load, continue: the same parameters as without the break.
    The checkpoint holds per-rank optimizer state (momentum) and the data position."""
    world, total, cut = 3, 17, 7                   # tau 3: step 7 is mid-round
    config = {} if algorithm == "sync" else {"tau": 3}

    def make(rank, seed):
        model = tiny_model(seed)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def uninterrupted(group):
        def rank_main(rank):
            model, optimizer = make(rank, 0)
            with local_comm(rank, world, group) as comm, co2.torch.distribute(
                    model, optimizer, algorithm=algorithm, comm=comm, **config) as trainer:
                train_steps(model, optimizer, rank, 0, total)
                trainer.finalize()
                return torch.cat([p.detach().flatten() for p in model.parameters()])
        return run_ranks(world, rank_main)

    def first_half(group):
        def rank_main(rank):
            model, optimizer = make(rank, 0)
            with local_comm(rank, world, group) as comm, co2.torch.distribute(
                    model, optimizer, algorithm=algorithm, comm=comm, **config) as trainer:
                train_steps(model, optimizer, rank, 0, cut)
                torch.save({"co2": trainer.state_dict(), "next_step": cut},
                           tmp_path / f"rank{rank}.pt")
        run_ranks(world, rank_main)

    def second_half(group):
        def rank_main(rank):
            model, optimizer = make(rank, 42)               # other weights: load must fix them
            checkpoint = torch.load(tmp_path / f"rank{rank}.pt")
            assert checkpoint["co2"]["optimizer"]["state"]   # momentum buffers were saved
            with local_comm(rank, world, group) as comm, co2.torch.distribute(
                    model, optimizer, algorithm=algorithm, comm=comm, **config) as trainer:
                trainer.load_state_dict(checkpoint["co2"])
                train_steps(model, optimizer, rank, checkpoint["next_step"], total)
                trainer.finalize()
                return torch.cat([p.detach().flatten() for p in model.parameters()])
        return run_ranks(world, rank_main)

    want = uninterrupted(unique_group())
    first_half(unique_group())
    got = second_half(unique_group())
    for rank in range(world):
        assert torch.equal(got[rank], want[rank]), f"rank {rank} differs after the restart"
    assert os.path.getsize(tmp_path / "rank0.pt") > 0

"""co2.torch with the habits torch DDP users bring (issue 14): each of them either works or fails
loudly with a message that names the cause. Ranks are threads (the `local` transport) with a short
communicator timeout, so a regression shows as a failure within seconds, not as a hang;
test_multiprocess.py repeats the collective-misuse case with real processes."""
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import co2
import co2.torch
import digits
from conftest import run_ranks, unique_group
from test_torch import tiny_batch, tiny_model

torch.set_num_threads(1)
# A misuse must fail well before this; the default (300 s) would look like a hang in CI.
SHORT_TIMEOUT_MS = 20000


def comm_of(rank, world, group):
    return co2.Communicator(rank, world, transport="local", group_name=group,
                            timeout_ms=SHORT_TIMEOUT_MS)


def train(model, optimizer, rank, first, last):
    for step in range(first, last):
        optimizer.zero_grad(set_to_none=True)
        x, y = tiny_batch(step, rank)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def run_world(world, body, timeout=120):
    group = unique_group()

    def rank_main(rank):
        with comm_of(rank, world, group) as comm:
            return body(rank, comm)
    return run_ranks(world, rank_main, timeout=timeout)


# --- 1. order-independent wiring ---------------------------------------------------------------

def wiring_run(algorithm, order):
    """Trains W=2 for 8 steps with the optimizer wired in `order`; returns (params, steps)."""
    def body(rank, comm):
        model = tiny_model(0)
        if order == "given":
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                           tau=3)
        else:
            trainer = co2.torch.distribute(model, algorithm=algorithm, comm=comm, tau=3)
            if order == "late":                 # a forward before the optimizer exists
                model(tiny_batch(0, rank)[0])
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            if order == "attach":
                trainer.attach(optimizer)
        with trainer:
            train(model, optimizer, rank, 0, 8)
            trainer.finalize()
            return flat_params(model), trainer.stats()["steps"]
    return run_world(2, body)


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_optimizer_created_after_distribute_trains_like_the_given_one(algorithm):
    """Before: 0 engine steps and every finalize reset the weights (co2), AnchorMismatchError
    (sync). Now attach() and an optimizer found at the first forward give the same run, bitwise,
    as an optimizer handed to distribute()."""
    given = wiring_run(algorithm, "given")
    for order in ("attach", "found"):
        got = wiring_run(algorithm, order)
        for rank in range(2):
            assert got[rank][1] == 8, f"{order}: engine steps {got[rank][1]}"
            assert torch.equal(got[rank][0], given[rank][0]), f"{order}, rank {rank}"
    assert not torch.equal(given[0][0], flat_params(tiny_model(0)))   # it trained


def test_optimizer_created_after_the_first_forward():
    """co2: found at the second forward, after its first step; the engine takes the step it
    missed then, so the run is still bitwise the same. sync: that first step used this rank's
    own gradient, which cannot be repaired: an error that says what to do."""
    given, late = wiring_run("co2", "given"), wiring_run("co2", "late")
    for rank in range(2):
        assert late[rank][1] == 8 and torch.equal(late[rank][0], given[rank][0])
    with pytest.raises(co2.torch.WiringError, match=r"call trainer\.attach\(optimizer\)"):
        wiring_run("sync", "late")


def test_never_stepped_engine_fails_at_the_next_collective_and_forward():
    """Parameters updated by hand (no optimizer to find, no engine step): finalize() raises on
    every rank naming the cause instead of resetting the weights silently; so does the next
    training forward."""
    def manual_update(model, rank):
        x, y = tiny_batch(0, rank)
        F.cross_entropy(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad

    def body(rank, comm):
        model = tiny_model(0)
        with co2.torch.distribute(model, comm=comm, tau=3) as trainer:
            manual_update(model, rank)
            with pytest.raises(co2.torch.WiringError, match=r"call trainer\.attach\(optimizer\)"):
                trainer.finalize()
            with pytest.raises(co2.torch.WiringError, match="never attached"):
                model(tiny_batch(1, rank)[0])
            trainer.step()                      # a manual engine step wires it again
            trainer.finalize()
            return trainer.stats()["steps"]
    assert run_world(2, body) == [1, 1]


def test_distribute_twice_is_an_error():
    model = tiny_model(0)
    with comm_of(0, 1, unique_group()) as comm:
        trainer = co2.torch.distribute(model, comm=comm)
        with pytest.raises(co2.torch.WiringError, match="already distributed"):
            co2.torch.distribute(model, comm=comm)
        trainer.close()
        co2.torch.distribute(model, comm=comm).close()     # after close() it may be again


EXIT_SCRIPT = """
import torch, co2, co2.torch
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
trainer = co2.torch.distribute(model, optimizer, comm=co2.Communicator(0, 1, transport="local",
                                                                         group_name="exit"))
for _ in range(3):
    optimizer.zero_grad(); model(torch.ones(3, 4)).sum().backward(); optimizer.step()
if FINALIZE:
    trainer.finalize()
"""


@pytest.mark.parametrize("finalize", [False, True])
def test_missing_finalize_warns_at_exit(finalize):
    script = EXIT_SCRIPT.replace("FINALIZE", str(finalize))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    warned = "finalize() was never called" in done.stderr
    assert warned != finalize, done.stderr


def test_lr_scheduler_made_before_distribute_does_not_warn():
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
    with comm_of(0, 1, unique_group()) as comm, \
            co2.torch.distribute(model, optimizer, comm=comm, tau=2) as trainer:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            train(model, optimizer, 0, 0, 3)
            scheduler.step()
        assert optimizer._step_count == 3 and trainer.stats()["steps"] == 3
        trainer.finalize()


# --- 2. buffer roles ---------------------------------------------------------------------------

class MaskedNet(torch.nn.Module):
    """A causal mask of -inf (a constant buffer), a positional table and a BatchNorm."""

    def __init__(self, rank):
        super().__init__()
        self.inp = torch.nn.Linear(6, 4)
        self.bn = torch.nn.BatchNorm1d(4)
        self.out = torch.nn.Linear(4, 3)
        self.register_buffer("mask", torch.full((4, 4), float("-inf")).triu(1))
        self.register_buffer("pos", torch.full((4,), float(rank)))    # differs per rank

    def forward(self, x):
        h = self.bn(self.inp(x)) + self.pos
        attention = torch.softmax(h.unsqueeze(1) * h.unsqueeze(2) + self.mask, dim=-1)
        return self.out((attention @ h.unsqueeze(2)).squeeze(2))


def masked_run(buffers=None, algorithm="co2"):
    def body(rank, comm):
        with digits._init_lock:
            torch.manual_seed(0)
            model = MaskedNet(rank)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm, tau=2,
                                  buffers=buffers) as trainer:
            pos_after_distribute = model.pos.clone()
            train(model, optimizer, rank, 0, 6)
            trainer.finalize()
            return {k: v.clone() for k, v in model.state_dict().items()}, pos_after_distribute
    return run_world(2, body)


def test_constant_inf_mask_is_left_alone_and_training_stays_finite():
    """Before: every float32 buffer was averaged, -inf - -inf = NaN, NonFiniteError."""
    (a, pos_a), (b, pos_b) = masked_run()
    mask = torch.full((4, 4), float("-inf")).triu(1)
    for state in (a, b):
        assert torch.equal(state["mask"], mask)
        assert all(bool(torch.isfinite(v).all()) for k, v in state.items() if k != "mask")
    assert torch.equal(a["bn.running_mean"], b["bn.running_mean"])     # averaged
    assert not torch.equal(a["bn.running_mean"], torch.zeros(4))
    assert torch.equal(pos_a, torch.zeros(4)) and torch.equal(pos_b, torch.zeros(4))


def test_buffer_roles_can_be_overridden():
    (a, pos_a), (b, pos_b) = masked_run(buffers={"pos": "ignore", "bn.running_var": "ignore"})
    assert torch.equal(pos_a, torch.zeros(4)) and torch.equal(pos_b, torch.ones(4))
    assert torch.equal(a["bn.running_mean"], b["bn.running_mean"])
    assert not torch.equal(a["bn.running_var"], b["bn.running_var"])  # per rank now
    with comm_of(0, 1, unique_group()) as comm:
        with pytest.raises(ValueError, match=r"buffer 'mask' holds NaN or Inf"):
            co2.torch.distribute(MaskedNet(0), comm=comm, buffers={"mask": "average"})
        with pytest.raises(ValueError, match=r"no buffer 'nope'"):
            co2.torch.distribute(MaskedNet(0), comm=comm, buffers={"nope": "ignore"})


def test_nonfinite_error_names_the_tensor_and_its_role():
    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, algorithm="localsgd", comm=comm,
                                  tau=2) as trainer:
            optimizer.zero_grad()
            x, y = tiny_batch(0, rank)
            if rank == 1:
                x[0, 0] = float("nan")
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            with pytest.raises(co2.NonFiniteError) as caught:
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()                   # the boundary
            trainer.close(_warn=False)
            return str(caught.value)
    messages = run_world(2, body)
    assert "parameter '0.weight' holds NaN or Inf on rank 1" in messages[1], messages[1]
    assert "no parameter or averaged buffer is NaN/Inf on rank 0" in messages[0], messages[0]


# --- 3. checkpoints ----------------------------------------------------------------------------

def test_state_dict_on_one_rank_says_it_is_collective():
    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
        try:
            train(model, optimizer, rank, 0, 2)
            if rank == 0:
                trainer.state_dict()
            train(model, optimizer, rank, 2, 8)
            trainer.finalize()
        except co2.Error as exc:
            return str(exc)
        finally:
            trainer.close(_warn=False)
    for rank, message in enumerate(run_world(2, body)):
        assert message and "state_dict() is collective: call it on every rank" in message, \
            f"rank {rank}: {message}"


def test_portable_checkpoint_saved_at_two_ranks_loads_at_one_and_two(tmp_path):
    """The portable model is the one finalize() gives at that step (issue 23, 15; before: the
    anchor, which lags the ranks by the average in flight), and the saving run goes on as if
    nothing happened."""
    path = str(tmp_path / "portable.pt")

    def save(rank, comm, action):
        model = tiny_model(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with co2.torch.distribute(model, optimizer, comm=comm, tau=3) as trainer:
            train(model, optimizer, rank, 0, 7)                     # mid-round
            anchor = torch.from_numpy(trainer.engine.consensus("anchor"))
            local = flat_params(model)
            if action == "save":
                trainer.save_portable(path)
            elif action == "finalize":
                trainer.finalize()
                return flat_params(model)
            train(model, optimizer, rank, 7, 11)
            trainer.finalize()
            return anchor, local, flat_params(model)
    (anchor, local0, end0), (_, local1, end1) = run_world(2, lambda r, c: save(r, c, "save"))
    assert not torch.equal(local0, local1)                           # mid-round: they differ
    unsaved = run_world(2, lambda r, c: save(r, c, "none"))
    assert torch.equal(end0, unsaved[0][2]) and torch.equal(end1, unsaved[1][2])
    finalized = run_world(2, lambda r, c: save(r, c, "finalize"))[0]
    saved = co2.torch.load_portable(path)
    assert saved["world_size"] == 2 and saved["optimizer"]["state"]
    plain = tiny_model(7)                                            # plain torch, no engine
    plain.load_state_dict(saved["model"])
    assert torch.equal(flat_params(plain), finalized)
    assert not torch.equal(finalized, anchor)                        # not the lagging anchor

    def resume(rank, comm):
        model = tiny_model(99)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        with co2.torch.distribute(model, optimizer, comm=comm, tau=3) as trainer:
            trainer.load_portable(path)
            loaded = flat_params(model)
            assert trainer.stats()["steps"] == 7
            train(model, optimizer, rank, 7, 12)
            trainer.finalize()
            assert bool(torch.isfinite(flat_params(model)).all())
            return loaded, flat_params(model)
    for world in (1, 2):
        results = run_world(world, resume)
        for loaded, final in results:
            assert torch.equal(loaded, finalized)
            assert torch.equal(final, results[0][1])


@pytest.mark.parametrize("algorithm", ["sync", "localsgd", "diloco"])
def test_portable_checkpoint_of_every_algorithm(algorithm, tmp_path):
    """localsgd keeps no anchor: its consensus is the ranks' average (collective). Saved at a
    boundary: the engine's save compares checksums of the model, which for localsgd are those
    of the ranks' own parameters and differ mid-round."""
    path = str(tmp_path / "portable.pt")

    def save(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                  tau=3) as trainer:
            train(model, optimizer, rank, 0, 6)
            with trainer.consensus_weights():
                consensus = flat_params(model)
            trainer.save_portable(path)
            return consensus
    consensus = run_world(2, save)
    assert torch.equal(consensus[0], consensus[1])
    plain = tiny_model(7)
    plain.load_state_dict(co2.torch.load_portable(path)["model"])
    assert torch.equal(flat_params(plain), consensus[0])

    def resume(rank, comm):
        model = tiny_model(99)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                  tau=3) as trainer:
            trainer.load_portable(path)
            assert torch.equal(flat_params(model), consensus[0])
            train(model, optimizer, rank, 6, 8)
            trainer.finalize()
    run_world(1, resume)


def test_torch_style_resume_warns_or_fails():
    """Model + optimizer only, the DDP way, would continue differently without co2's state."""
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train(model, optimizer, 0, 0, 2)                        # optimizer state from "before"
    saved_model, saved_optimizer = model.state_dict(), optimizer.state_dict()
    with comm_of(0, 1, unique_group()) as comm:
        with pytest.warns(RuntimeWarning, match="torch-style resume"):
            trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
        with trainer:
            with pytest.warns(RuntimeWarning, match="restores only the inner optimizer"):
                optimizer.load_state_dict(saved_optimizer)
            model.load_state_dict(saved_model)
            with pytest.raises(co2.torch.WiringError, match="load_state_dict"):
                train(model, optimizer, 0, 2, 3)
            with pytest.raises(ValueError, match="trainer.state_dict"):
                trainer.load_state_dict(saved_model)


# --- 4. evaluation -----------------------------------------------------------------------------

def consensus_run(evaluate):
    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with co2.torch.distribute(model, optimizer, comm=comm, tau=3) as trainer:
            train(model, optimizer, rank, 0, 5)
            if evaluate:
                local = flat_params(model)
                with trainer.consensus_weights():
                    model.eval()
                    with torch.no_grad():
                        model(tiny_batch(0, 0)[0])
                    seen = flat_params(model)
                    model.train()                   # a loss with autograd on: no step
                    F.cross_entropy(model(tiny_batch(0, 0)[0]), tiny_batch(0, 0)[1])
                assert torch.equal(seen, torch.from_numpy(trainer.engine.consensus()))
                assert not torch.equal(seen, local)
                assert torch.equal(flat_params(model), local)
            train(model, optimizer, rank, 5, 10)
            trainer.finalize()
            return flat_params(model)
    return run_world(2, body)


def test_consensus_weights_leave_the_trajectory_bitwise_unchanged():
    with_eval, without = consensus_run(True), consensus_run(False)
    for a, b in zip(with_eval, without):
        assert torch.equal(a, b)


# --- 5. uneven inputs --------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_join_lets_a_rank_run_out_of_batches(algorithm):
    batches = {0: 12, 1: 7}                                 # rank 1 is five batches short

    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        # Stepped in the loop only: it stands still on a rank that ran out (sync: the shadow's
        # own updates then differ, and join's end must hand it the others' parameters).
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        with co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                  tau=3) as trainer:
            with trainer.join():
                for step in range(batches[rank]):
                    train(model, optimizer, rank, step, step + 1)
                    scheduler.step()
            trainer.finalize()
            return flat_params(model), trainer.stats()["steps"]
    (a, steps_a), (b, steps_b) = run_world(2, body)
    assert torch.equal(a, b)
    assert steps_a == steps_b >= 12
    assert bool(torch.isfinite(a).all())


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_unequal_steps_without_join_name_the_cause(algorithm):
    batches = {0: 12, 1: 7}

    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm, tau=3)
        try:
            train(model, optimizer, rank, 0, batches[rank])
            trainer.finalize()
        except (co2.Error, co2.torch.UnequalStepsError) as exc:
            return str(exc)
        finally:
            trainer.close(_warn=False)
    messages = run_world(2, body)
    for message in messages:
        assert message and "unequal step counts" in message and "trainer.join()" in message
    assert "rank 1 stopped at step 7" in messages[1], messages[1]


def test_unequal_steps_between_boundaries_are_found_at_finalize():
    batches = {0: 5, 1: 4}                                  # tau 3: no boundary in between

    def body(rank, comm):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, comm=comm, tau=3) as trainer:
            train(model, optimizer, rank, 0, batches[rank])
            with pytest.raises(co2.torch.UnequalStepsError,
                               match=r"rank 1 stopped at step 4 while others continue"):
                trainer.finalize()
            trainer.close(_warn=False)
    run_world(2, body)


# --- 6. changes that are not in-place edits (issue 23, defect 13) ------------------------------

def distribute_one(model, optimizer, algorithm, **options):
    """A trainer of a group of one (the checks are each rank's own)."""
    comm = comm_of(0, 1, unique_group())
    trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm, tau=2,
                                   **options)
    return comm, trainer


def one_step(model, optimizer, step=0):
    optimizer.zero_grad(set_to_none=True)
    x, y = tiny_batch(step, 0)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
@pytest.mark.parametrize("flat", [True, False])
def test_cast_or_moved_memory_after_distribute_is_refused(algorithm, flat):
    """Before: model.bfloat16() after distribute() left co2 averaging its stale float32 copy
    (reported, if at all, as "model.load_state_dict() after distribute()?"). Now the next
    forward, optimizer step and collective name the cast and what to do."""
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm, trainer = distribute_one(model, optimizer, algorithm, flat=flat)
    with comm, trainer:
        one_step(model, optimizer)
        model.bfloat16()
        cast = r"parameter '0\.weight' is torch\.bfloat16 now, was torch\.float32 at " \
               r"distribute\(\): the model was cast after distribute\(\).*cast the model " \
               r"before distribute\(\)"
        with pytest.raises(co2.torch.ModelChangedError, match=cast):
            model(tiny_batch(1, 0)[0].bfloat16())
        with pytest.raises(co2.torch.ModelChangedError, match=cast):
            optimizer.step()
        with pytest.raises(co2.torch.ModelChangedError, match=cast):
            trainer.finalize()
        model.float()                    # same dtype, new memory: still not what co2 has
        with pytest.raises(co2.torch.ModelChangedError,
                           match=r"parameter '0\.weight' no longer lives in the memory co2 was "
                                 r"given"):
            model(tiny_batch(1, 0)[0])
        trainer.close(_warn=False)


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_replaced_or_added_layer_is_refused(algorithm):
    """Before: a replaced head was never averaged (under co2 and sync alike) and the ranks
    ended with different models, every call OK. Now the next forward names it."""
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm, trainer = distribute_one(model, optimizer, algorithm)
    with comm, trainer:
        one_step(model, optimizer)
        model[2] = torch.nn.Linear(8, 3)
        with pytest.raises(co2.torch.ModelChangedError,
                           match=r"parameters changed after distribute\(\) \(replaced by new "
                                 r"tensors: '2\.bias', '2\.weight' \(a layer replaced\?\)\).*"
                                 r"close\(\) this trainer and distribute\(\) the changed model"):
            model(tiny_batch(1, 0)[0])
        model.append(torch.nn.Linear(3, 3))
        with pytest.raises(co2.torch.ModelChangedError, match=r"added: '3\.bias', '3\.weight'"):
            model(tiny_batch(1, 0)[0])
        trainer.close(_warn=False)


def test_replaced_averaged_buffer_is_refused():
    """A running statistic co2 averages, replaced by a new tensor after distribute(), would be
    left out of the average."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm, trainer = distribute_one(model, optimizer, "co2")
    with comm, trainer:
        one_step(model, optimizer)
        model[1].running_mean = torch.zeros(8)
        with pytest.raises(co2.torch.ModelChangedError,
                           match=r"averaged buffer '1\.running_mean' no longer lives in the "
                                 r"memory co2 was given"):
            model(tiny_batch(1, 0)[0])
        trainer.close(_warn=False)


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_param_group_of_foreign_tensors_is_refused(algorithm):
    """Before: a parameter group added with optimizer.add_param_group() trained without ever
    being averaged. Now the next forward or step names it; a group of the module's own
    parameters (not in the optimizer at first) is fine."""
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model[0].parameters(), lr=0.1)     # the first layer only
    comm, trainer = distribute_one(model, optimizer, algorithm)
    with comm, trainer:
        one_step(model, optimizer)
        optimizer.add_param_group({"params": model[2].parameters(), "lr": 0.05})
        one_step(model, optimizer, 1)                               # the module's own: fine
        extra = torch.nn.Parameter(torch.zeros(3))
        extra.grad = torch.ones(3)
        optimizer.add_param_group({"params": [extra]})
        foreign = r"optimizer's parameter groups changed after distribute\(\) " \
                  r"\(optimizer\.add_param_group\(\)\?\): it now updates 1 tensor\(s\) that " \
                  r"are not parameters of the distributed module"
        with pytest.raises(co2.torch.ModelChangedError, match=foreign):
            model(tiny_batch(2, 0)[0])
        with pytest.raises(co2.torch.ModelChangedError, match=foreign):
            optimizer.step()
        assert torch.equal(extra, torch.zeros(3))                   # refused before it stepped
        trainer.close(_warn=False)


# --- 7. messages for a newcomer (issue 23, defect 16) -----------------------------------------

def test_second_optimizer_is_named_not_load_state_dict():
    """Before: "(model.load_state_dict() after distribute()?)" for a second optimizer."""
    model = tiny_model(0)
    attached = torch.optim.Adam(model.parameters(), lr=0.01)
    comm, trainer = distribute_one(model, attached, "co2")
    with comm, trainer:
        one_step(model, attached)
        second = torch.optim.SGD(model[2].parameters(), lr=0.1)
        one_step(model, second, 1)
        with pytest.raises(co2.torch.WiringError) as caught:
            model(tiny_batch(2, 0)[0])
        message = str(caught.value)
        assert "another one (SGD) updates this model's parameters" in message, message
        assert "attached optimizer (Adam)" in message and "load_state_dict" not in message
        trainer.close(_warn=False)


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_unfreezing_a_layer(algorithm):
    """Before, under sync: the unfrozen layer's gradients were never averaged, the ranks
    drifted apart and finalize() reported an anchor mismatch ("memory corruption"). Now the
    next forward says what happened and what to do. Under co2 the engine averages every
    parameter, frozen or not: unfreezing just works (the ranks agree at the end)."""
    def body(rank, comm):
        model = tiny_model(0)
        model[0].requires_grad_(False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                  tau=2) as trainer:
            train(model, optimizer, rank, 0, 2)
            model[0].requires_grad_(True)
            if algorithm == "sync":
                with pytest.raises(co2.torch.ModelChangedError,
                                   match=r"parameter\(s\) '0\.weight', '0\.bias' require a "
                                         r"gradient now but did not at distribute\(\): under "
                                         r"sync their gradients are never averaged"):
                    train(model, optimizer, rank, 2, 3)
                trainer.close(_warn=False)
                return None
            train(model, optimizer, rank, 2, 6)
            trainer.finalize()
            return flat_params(model)
    results = run_world(2, body)
    if algorithm == "co2":
        assert torch.equal(results[0], results[1])
        assert not torch.equal(results[0][:48], flat_params(tiny_model(0))[:48])  # it trained


def test_training_in_eval_mode_finds_the_optimizer():
    """Before: with model.eval() for the whole run (no dropout, no BatchNorm: nothing looks
    wrong) the optimizer created after distribute() was never found; every step trained
    unaveraged and finalize() reported it after the run. Now the first forward with autograd
    on finds it, in train() or eval() mode: the run equals the one with the optimizer given."""
    def run(order):
        def body(rank, comm):
            model = tiny_model(0).eval()
            if order == "given":
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
                trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
            else:
                trainer = co2.torch.distribute(model, comm=comm, tau=3)
                optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            with trainer:
                train(model, optimizer, rank, 0, 8)
                trainer.finalize()
                return flat_params(model), trainer.stats()["steps"]
        return run_world(2, body)
    given, found = run("given"), run("found")
    for rank in range(2):
        assert found[rank][1] == 8, f"engine steps {found[rank][1]}"
        assert torch.equal(found[rank][0], given[rank][0])


@pytest.mark.parametrize("algorithm", ["co2", "localsgd", "diloco"])
def test_no_sync_accumulates_where_nothing_averages_in_backward(algorithm):
    """Before: trainer.no_sync() raised under co2 (DDP users call it for gradient
    accumulation). Now it does nothing there, as nothing averages in backward: the accumulated
    gradient is the one without the context."""
    def accumulate(use_no_sync):
        model = tiny_model(0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        comm, trainer = distribute_one(model, optimizer, algorithm)
        with comm, trainer:
            optimizer.zero_grad()
            for micro in range(3):
                x, y = tiny_batch(micro, 0)
                if use_no_sync and micro < 2:
                    with trainer.no_sync():
                        F.cross_entropy(model(x), y).backward()
                else:
                    F.cross_entropy(model(x), y).backward()
            optimizer.step()
            trainer.finalize()
            return flat_params(model)
    assert torch.equal(accumulate(True), accumulate(False))


def test_sync_gradient_wait_follows_the_environment(monkeypatch):
    """CO2_TIMEOUT_MS sets the wait for the gradient buckets too (default: 5 minutes)."""
    monkeypatch.setenv("CO2_TIMEOUT_MS", "1500")
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    comm, trainer = distribute_one(model, optimizer, "sync")
    with comm, trainer:
        assert trainer.grad_sync.timeout_s == 1.5
        trainer.close(_warn=False)

"""co2.torch under "sync" averages the gradients in backward, like torch DDP (co2/_grad_sync.py):
the checks of grad_sync_checks.py with ranks as threads (local transport) and, once, as
processes started by co2run (UCX over loopback); the bucket plan; the errors."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import co2
import co2.torch
from co2._grad_sync import plan_buckets
import grad_sync_checks as checks
from conftest import local_comm, run_ranks, unique_group

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 3
# A co2run job that takes longer than this has hung; co2run and its ranks are killed.
PROCESS_TIMEOUT_S = 300


def on_threads(check, world=WORLD, **kwargs):
    group = unique_group("gradsync")

    def rank_main(rank):
        with local_comm(rank, world, group) as comm:
            return check(comm, **kwargs)

    return run_ranks(world, rank_main)


@pytest.mark.parametrize("name", sorted(checks.CHECKS))
def test_check_with_ranks_as_threads(name):
    on_threads(checks.CHECKS[name])


def test_the_clip_check_fails_when_the_average_comes_after_the_clip():
    """The behaviour before 1.1 (average in optimizer.step, after the user's clip_grad_norm_
    clipped each rank's own gradient) does not pass the clip check: it tells the two apart."""
    with pytest.raises(AssertionError):
        on_threads(checks.check_clip_sees_the_average, reduce_in_backward=False)


def test_buckets_follow_reverse_parameter_order_with_a_small_first_bucket():
    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(n)))
              for i, n in enumerate([100_000, 300_000, 50_000, 200_000, 10])]
    names = lambda plan: [[name for name, _ in b] for b in plan]    # noqa: E731
    # a bucket closes once it reaches its size: 1 MiB = 262,144 floats first, then 2 MiB
    assert names(plan_buckets(params, bucket_mb=2, first_bucket_mb=1)) == [
        ["p4", "p3", "p2", "p1"], ["p0"]]
    # 0.5 MiB = 131,072 floats; the first bucket is capped at bucket_mb too
    assert names(plan_buckets(params, bucket_mb=0.5, first_bucket_mb=1)) == [
        ["p4", "p3"], ["p2", "p1"], ["p0"]]
    assert names(plan_buckets(params, bucket_mb=25)) == [["p4", "p3", "p2", "p1"], ["p0"]]
    assert plan_buckets(params[:1], bucket_mb=0.1) == [params[:1]]   # larger than a bucket


def test_errors_are_clear():
    net = checks.make_net()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with local_comm(0, 1, unique_group("gradsync")) as comm:
        before = net.a.weight.data_ptr()
        for wrong in (0, -1.0, "25", None):
            with pytest.raises(ValueError, match="bucket_mb"):
                co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                                     bucket_mb=wrong)
        assert net.a.weight.data_ptr() == before        # refused before anything was built
        with co2.torch.distribute(checks.make_net(), None, algorithm="co2", comm=comm,
                                  tau=2) as trainer:
            with trainer.no_sync():     # nothing averages in backward under co2: a no-op
                pass
        with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm) as trainer:
            x, y = checks.batch(0, 0)
            F.cross_entropy(net(x), y).backward()
            with pytest.raises(RuntimeError, match="averaged during backward"):
                trainer.reduce_gradients()
            optimizer.step()


def test_a_rank_without_a_batch_shadows_the_collectives():
    """Rank 1 has no batch (a join): shadow_backward() issues the same bucket all-reduces with
    nothing in them; rank 0 gets its gradient / W, rank 1's gradients stay untouched."""
    def check(comm):
        net = checks.make_net()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                                  bucket_mb=checks.SMALL_BUCKET_MB) as trainer:
            own = checks.local_grads(net, 0, 0)
            if comm.rank == 0:
                x, y = checks.batch(0, 0)
                F.cross_entropy(net(x), y).backward()
                for name, p in net.named_parameters():
                    want = None if own[name] is None else own[name] / comm.world_size
                    if want is None:
                        assert p.grad is None, name
                    else:
                        torch.testing.assert_close(p.grad, want, rtol=checks.RTOL,
                                                   atol=checks.ATOL, msg=name)
            else:
                trainer.grad_sync.shadow_backward()
                assert all(p.grad is None for p in net.parameters())
            # the ranks' collectives still match: one more averaging backward on both
            optimizer.zero_grad(set_to_none=True)
            x, y = checks.batch(1, comm.rank)
            F.cross_entropy(net(x), y).backward()
            assert checks.identical_on_every_rank(comm, net.a.weight.grad)

    on_threads(check, world=2)


def test_averaging_in_step_is_still_available():
    """reduce_in_backward=False: the gradients are averaged in optimizer.step, as before 1.1."""
    def check(comm):
        net = checks.make_net()
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        with co2.torch.distribute(net, optimizer, algorithm="sync", comm=comm,
                                  reduce_in_backward=False) as trainer:
            assert trainer.grad_sync is None
            per_rank = [checks.local_grads(net, 0, r) for r in range(comm.world_size)]
            x, y = checks.batch(0, comm.rank)
            F.cross_entropy(net(x), y).backward()
            torch.testing.assert_close(net.a.weight.grad, per_rank[comm.rank]["a.weight"])
            trainer.reduce_gradients()
            want = sum(g["a.weight"] for g in per_rank) / comm.world_size
            torch.testing.assert_close(net.a.weight.grad, want, rtol=1e-5, atol=1e-7)

    on_threads(check, world=2)


def test_checks_with_processes_under_co2run():
    co2run = os.environ.get("CO2RUN")
    if not co2run:
        pytest.fail("CO2RUN (the co2run launcher of this build) is not set by meson")
    try:
        with co2.Communicator(0, 1, transport="ucx"):
            pass
    except co2.UnsupportedError as exc:
        pytest.skip(f"this libco2 has no multi-process transport: {exc.detail}")
    except co2.InvalidArgumentError:
        pass
    env = dict(os.environ, OMP_NUM_THREADS="1", UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    names = ["average_in_buckets", "clip_sees_the_average", "unused_parameters",
             "no_sync_accumulation", "bucket_order"]
    try:
        proc = subprocess.run([co2run, "--nproc-per-node", "2", sys.executable,
                               os.path.join(HERE, "grad_sync_worker.py"), *names],
                              env=env, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"co2run did not finish within {PROCESS_TIMEOUT_S} s")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for rank in range(2):
        for name in names:
            assert f"rank {rank}: {name} ok" in output, output

"""The self-supervised example (examples/python/contrast: MoCo + the consistency term) through
co2run with 2 processes, under co2 (τ 4, eager) and torch DDP: a few dozen steps, a few seconds of
torch per run. And the engine behaviour that made the example re-estimate its BatchNorm
statistics, recorded as an expected failure."""
import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import co2.torch  # noqa: E402
from conftest import local_comm, run_ranks, unique_group  # noqa: E402
from test_lm import co2run, free_port, run  # noqa: E402
from test_multiprocess import launch_env, multiprocess_unavailable  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EXAMPLE = os.path.join(ROOT, "examples", "python", "contrast", "train.py")
STEPS, TAU = 24, 4
# Chance is 10 %; a probe on broken features (NaN running statistics, a collapsed encoder)
# scores at or near it (NaN fails the comparison), while a working run here scores above 90 %.
MIN_PROBE = 0.5


@pytest.mark.skipif(multiprocess_unavailable() is not None, reason=str(multiprocess_unavailable()))
def test_contrast_example_trains_through_co2run(tmp_path):
    out = tmp_path / "contrast.jsonl"
    run([co2run(), "--nproc-per-node", "2", "--master-port", str(free_port(2)),
         sys.executable, "-u", EXAMPLE, "--algorithms", "co2", "ddp", "--losses", "consistent",
         "--steps", str(STEPS), "--tau", str(TAU), "--log-every", "12", "--json", str(out)],
        launch_env())
    runs = {r["algorithm"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(runs) == ["co2", "ddp"]
    for name, r in runs.items():
        assert r["world_size"] == 2 and r["steps"] == STEPS, name
        curve = r["curve"]
        assert curve["step"] == [12, 24], name
        assert all(math.isfinite(v) for k in ("loss", "nce", "consistency") for v in curve[k])
        assert all(v > 0 for v in curve["consistency"]), (name, curve)
        # After finalize (co2) or at every step (DDP) the query encoder is the same on every rank.
        assert r["query_spread"] == 0.0, (name, r["query_spread"])
        assert MIN_PROBE < r["probe"] <= 1.0 and MIN_PROBE < r["probe_few"] <= 1.0, (name, r)
    # The key encoder is each rank's EMA of its own query encoder: identical under DDP, apart
    # under co2 (the ranks' models differ within a round), because the engine does not own it.
    assert runs["ddp"]["key_spread"] == 0.0
    assert runs["co2"]["key_spread"] > 0.0
    assert runs["co2"]["rounds"] == STEPS // TAU


@pytest.mark.parametrize("eager", [True, False])
def test_co2_keeps_batchnorm_variance_positive(eager):
    """Two ranks, identical data, lr 0: every rank's BatchNorm running variance is a plain EMA
    toward the batch variance (~0.01 here), positive at every step. The average of positive
    values is positive, one round stale or not. Before co2's BUFFER segments carried their values
    (1.1) the stale delta update overshot (e_{t+1} = e_t - f e_{t-1}): -0.033 after 24 steps.
    Now a round starts from the values' stale average, so the distance to the batch variance
    shrinks by 0.9^τ every two rounds, without overshoot: from 1.0 to about 0.14 in 9 rounds."""
    group = unique_group("contrast-bn")
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0)) * 0.1

    def rank_main(rank):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.BatchNorm1d(4))
        with torch.no_grad():
            model[0].weight.copy_(torch.eye(4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        with local_comm(rank, 2, group) as comm:
            trainer = co2.torch.distribute(model, optimizer, algorithm="co2", comm=comm, tau=4,
                                           eager=eager)
            lowest = float("inf")
            for _ in range(36):
                optimizer.zero_grad(set_to_none=True)
                model(x).sum().backward()
                optimizer.step()
                lowest = min(lowest, model[1].running_var.min().item())
            trainer.finalize()
            final = model[1].running_var.clone()
            trainer.close()
        return lowest, final

    for lowest, final in run_ranks(2, rank_main):
        assert lowest > 0.0, lowest
        assert bool((final < 0.3).all()), final

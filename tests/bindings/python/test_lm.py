"""The language-model example (examples/python/lm) through co2run with 2 processes, and the
quality benchmark's smoke mode (bench/quality/quality.py --quick). Both use the tiny model: a
few seconds of torch on 2 cores. The corpus (Debian's python3-doc) is required, not optional:
scripts/test.sh installs it."""
import json
import math
import os
import subprocess
import sys

import pytest
from ports import free_port  # tests/ports.py (conftest.py puts tests/ on the path)

pytest.importorskip("torch")

from test_multiprocess import PROCESS_TIMEOUT_S, launch_env, multiprocess_unavailable  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
EXAMPLE = os.path.join(ROOT, "examples", "python", "lm", "train.py")
QUALITY = os.path.join(ROOT, "bench", "quality", "quality.py")
# The initial loss is ln 256 = 5.55; 24 steps of the tiny model reach about 4.1 (3.8 - 4.2 over
# seeds and algorithms): a decrease of 0.8 can only fail if training does not work.
MIN_DECREASE = 0.8

pytestmark = pytest.mark.skipif(multiprocess_unavailable() is not None,
                                reason=str(multiprocess_unavailable()))


def co2run():
    path = os.environ.get("CO2RUN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("CO2RUN (the co2run launcher of this build) is not set by meson")
    return path


def run(cmd, env):
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT_S)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.parametrize("algorithm", ["co2", "ddp"])
def test_lm_example_trains_through_co2run(algorithm, tmp_path):
    out = tmp_path / "lm.json"
    # co2's store at the port, gloo (ddp) at the next: both checked free.
    run([co2run(), "--nproc-per-node", "2", "--master-port", str(free_port(2)),
         sys.executable, "-u", EXAMPLE,
         "--algorithm", algorithm, "--tau", "4", "--size", "tiny", "--steps", "24",
         "--eval-every", "8", "--json", str(out)], launch_env())
    result = json.loads(out.read_text())
    losses = result["curve"]["loss"]
    assert result["world_size"] == 2 and result["steps"] == 24
    assert all(math.isfinite(x) for x in losses)
    assert result["final_loss"] == losses[-1]
    assert losses[0] - result["final_loss"] >= MIN_DECREASE, losses
    if algorithm == "co2":
        assert result["rounds"] == 24 // 4


def test_quality_quick(tmp_path):
    build = os.environ["CO2_BUILD_ROOT"]
    env = launch_env()
    proc = run([sys.executable, QUALITY, "--quick", "--no-plot", "--build", build,
                "--port", str(free_port(2)), "--out", str(tmp_path)], env)
    summary = json.loads((tmp_path / "quality.json").read_text())["summary"]
    for name in ("ddp", "sync", "localsgd t4", "diloco t4", "co2 t4 none/none"):
        assert math.isfinite(summary[name]["loss_mean"]), summary
        assert summary[name]["loss_mean"] < 5.55 - MIN_DECREASE / 2, summary
    eager = summary["co2+eager t4"]
    assert "unavailable" in eager or math.isfinite(eager["loss_mean"])
    assert summary["co2+arrival t4"]["loss_mean"] < 5.55 - MIN_DECREASE / 2, summary
    assert "ratio_to_ddp" in summary["co2 t4 none/none"]
    assert "co2 t4 none/none" in proc.stdout


def test_quality_delays_quick(tmp_path):
    """--delays on the tiny model at tau 4 (apply steps 1 and 2), one seed, then again with
    --merge-from: every cell of the delay table is filled and trained, the apply steps were
    applied between boundaries, and the merged run measures nothing twice."""
    build = os.environ["CO2_BUILD_ROOT"]
    env = launch_env()
    command = [sys.executable, QUALITY, "--quick", "--delays", "--no-plot", "--build", build,
               "--out", str(tmp_path)]
    run(command + ["--port", str(free_port(2))], env)
    saved = json.loads((tmp_path / "quality_delays.json").read_text())
    assert not saved["partial"] and len(saved["load_average"]["end"]) == 3
    table = saved["delays"]["4"]
    assert table["apply_steps"] == [1, 2]
    for row in ("eager + apply_step k", "apply_step k, no eager"):
        assert [cell["runs"] for cell in table["rows"][row]] == [1, 1, 1], row
    assert table["rows"]["delayed"][:2] == [None, None] and table["rows"]["delayed"][2]["runs"]
    assert len(saved["runs"]) == 8                   # DDP and the 7 co2 rows
    for result in saved["runs"]:
        assert result["final_loss"] < 5.55 - MIN_DECREASE / 2, result
        if result["engine_config"].get("apply_step") in (1, 2):
            assert result["arrival_updates"] > 0, result
    merged = run(command + ["--port", str(free_port(2)), "--merge-from",
                            str(tmp_path / "quality_delays.json")], env)
    again = json.loads((tmp_path / "quality_delays.json").read_text())
    assert again["runs"] == saved["runs"]
    assert "tau 4: final validation loss / DDP's" in merged.stdout

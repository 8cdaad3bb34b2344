"""Observability with real processes (co2run, UCX over TCP on loopback; docs/observability.md):
the CO2_TRACE file of every rank is valid Trace Event Format JSON with the events it promises,
bounded by CO2_TRACE_MAX_EVENTS; CO2_LOG_LEVEL=info writes the round line (rate-limited) and
the finalize summary, debug every round and every collective; ranks of different speeds report
the same advised tau; scripts/plot_trace.py draws the run.

Run by meson: OBSERVE_WORKER=... CO2RUN=... PLOT_TRACE=... pytest observe_test.py
"""
import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest

WORKER = os.environ.get("OBSERVE_WORKER", "")
CO2RUN = os.environ.get("CO2RUN", "")
PLOT = os.environ.get("PLOT_TRACE", "")
RUN_LIMIT_S = 120

pytestmark = pytest.mark.skipif(not (WORKER and CO2RUN), reason="OBSERVE_WORKER / CO2RUN not set")

PURPOSES = {"user", "outer-average", "parameter-average", "consensus", "anchor-check", "layout-hash",
            "initial-broadcast", "gradient-average", "split", "advisor-agreement"}
ROUND_LINE = re.compile(
    r"co2 (?:info|debug): rank (\d+) round (\d+) step (\d+): boundary wait ([\d.]+) ms, all-reduce ([\d.]+) ms, "
    r"hidden ([\d.]+)% \(run ([\d.]+)%\), round ([\d.]+) ms, advised tau (\d+|-)")
SUMMARY_LINE = re.compile(
    r"co2 info: rank (\d+) finalized after (\d+) rounds, (\d+) steps: waited ([\d.]+) ms for ([\d.]+) ms of "
    r"collectives, hidden ([\d.]+)%, advised tau (\d+|-)")


class Run:
    def __init__(self, out, stderr, elapsed_s, steps, tau, world):
        self.out, self.stderr, self.elapsed_s = out, stderr, elapsed_s
        self.steps, self.tau, self.world = steps, tau, world

    def stats(self, rank):
        with open(os.path.join(self.out, f"stats.{rank}.json")) as f:
            return json.load(f)


def run_group(out, world=2, steps=24, tau=2, count=65536, sleep_ms=5, rank_sleep_ms=10, **env):
    environment = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo", CO2_LOG_LEVEL="warn")
    environment.update({k: str(v) for k, v in env.items()})
    start = time.monotonic()
    done = subprocess.run([CO2RUN, "--nproc-per-node", str(world), WORKER, str(out), str(steps), str(tau),
                           str(count), str(sleep_ms), str(rank_sleep_ms)],
                          env=environment, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, f"co2run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return Run(str(out), done.stderr, elapsed, steps, tau, world)


def load_trace(path):
    with open(path) as f:
        trace = json.load(f)
    assert isinstance(trace["traceEvents"], list)
    return trace


def complete_events(trace):
    return [e for e in trace["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    out = tmp_path_factory.mktemp("traced")
    return run_group(out, CO2_TRACE=out / "trace.json", CO2_LOG_LEVEL="info")


def test_one_valid_trace_per_rank(traced):
    assert sorted(os.path.basename(p) for p in glob.glob(os.path.join(traced.out, "trace*"))) == [
        "trace.rank0.json", "trace.rank1.json"]
    for rank in range(traced.world):
        trace = load_trace(os.path.join(traced.out, f"trace.rank{rank}.json"))
        threads = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
                   if e.get("ph") == "M" and e["name"] == "thread_name"}
        events = complete_events(trace)
        for e in events:
            for key in ("name", "ph", "ts", "dur", "pid", "tid"):
                assert key in e, f"rank {rank}: {e} lacks {key}"
            assert e["dur"] >= 0 and e["pid"] == rank, e
            assert e["tid"] in threads, f"rank {rank}: {e} on an unnamed thread"
        names = {e["name"] for e in events}
        assert {"step", "boundary", "outer-average", "wait outer-average", "advisor-agreement", "prepare pass",
                "finalize"} <= names, names
        assert names & {"apply pass", "eager pass", "delta pass"}, names
        # Collectives lie on the progress thread: the round's all-reduce (256 KiB) on the bulk
        # lane, the agreement on the control lane.
        collectives = [e for e in events if e["name"] in PURPOSES]
        assert collectives
        for e in collectives:
            assert threads[e["tid"]].startswith("progress"), e
            assert e["args"]["bytes"] > 0, e
        assert {threads[e["tid"]] for e in collectives if e["name"] == "outer-average"} == {"progress: bulk lane"}
        assert {threads[e["tid"]] for e in collectives if e["name"] == "advisor-agreement"} == {
            "progress: control lane"}
        # Every step but the first after commit is measured; one boundary per round.
        assert sum(e["name"] == "step" for e in events) == traced.steps - 1
        assert sum(e["name"] == "boundary" for e in events) == traced.steps // traced.tau
        # Waits happen inside an engine call: a boundary or finalize.
        calls = [e for e in events if e["name"] in ("boundary", "finalize") and e["tid"] == 1]
        for wait in (e for e in events if e["name"].startswith("wait")):
            assert any(c["ts"] - 1e-3 <= wait["ts"] and wait["ts"] + wait["dur"] <= c["ts"] + c["dur"] + 1e-3
                       for c in calls), wait
        assert trace["otherData"]["dropped_events"] == 0


def test_advised_tau_is_the_same_on_every_rank(traced):
    stats = [traced.stats(r) for r in range(traced.world)]
    # Each rank's own step time is at least its sleep (5 and 15 ms) and they differ...
    assert stats[0]["rank_step_time_ns"] >= 5e6 and stats[1]["rank_step_time_ns"] >= 15e6, stats
    assert stats[0]["rank_step_time_ns"] != stats[1]["rank_step_time_ns"], stats
    # ... but the advice and its inputs are agreed.
    assert stats[0]["advised_tau"] >= 1, stats
    for key in ("advised_tau", "step_time_ns", "allreduce_time_ns"):
        assert len({s[key] for s in stats}) == 1, (key, stats)
    assert stats[0]["step_time_ns"] == max(s["rank_step_time_ns"] for s in stats)


def test_info_log_has_round_and_summary_lines(traced):
    for rank in range(traced.world):
        rounds = [m for m in map(ROUND_LINE.search, traced.stderr.splitlines()) if m and int(m.group(1)) == rank]
        assert rounds, f"rank {rank}: no round line in\n{traced.stderr}"
        for m in rounds:
            assert 0.0 <= float(m.group(6)) <= 100.0 and 0.0 <= float(m.group(7)) <= 100.0, m.group(0)
            assert int(m.group(3)) == int(m.group(2)) * traced.tau, m.group(0)
        summaries = [m for m in map(SUMMARY_LINE.search, traced.stderr.splitlines()) if m and int(m.group(1)) == rank]
        assert len(summaries) == 1, traced.stderr
        assert int(summaries[0].group(2)) == traced.steps // traced.tau
        assert summaries[0].group(7) == str(traced.stats(rank)["advised_tau"])
    assert "co2 debug" not in traced.stderr


def test_plot_script_draws_the_run(traced):
    if not PLOT:
        pytest.skip("PLOT_TRACE not set")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pytest.skip("matplotlib is not installed")
    png = os.path.join(traced.out, "overlap.png")
    done = subprocess.run([sys.executable, PLOT, os.path.join(traced.out, "trace.json"), "-o", png],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 10000
    assert "2 rank(s)" in done.stdout


def test_trace_keeps_at_most_max_events(tmp_path):
    run = run_group(tmp_path, CO2_TRACE=tmp_path / "t.json", CO2_TRACE_MAX_EVENTS=25)
    for rank in range(run.world):
        trace = load_trace(tmp_path / f"t.rank{rank}.json")
        events = complete_events(trace)
        assert len(events) == 25
        assert trace["otherData"]["dropped_events"] > 0
        # The ring keeps the newest: the run's end (finalize) is there.
        assert "finalize" in {e["name"] for e in events}


def test_debug_logs_every_round_and_collective(tmp_path):
    """Short rounds (tau 1, no sleep): debug writes every round; info at most ~1 line a second.
    A bad CO2_TRACE_MAX_EVENTS is reported and the default used."""
    steps = 120
    debug = run_group(tmp_path, steps=steps, tau=1, count=1024, sleep_ms=0, rank_sleep_ms=0, CO2_LOG_LEVEL="debug",
                      CO2_TRACE=tmp_path / "d.json", CO2_TRACE_MAX_EVENTS="lots")
    lines = debug.stderr.splitlines()
    for rank in range(debug.world):
        rounds = [m for m in map(ROUND_LINE.search, lines) if m and int(m.group(1)) == rank]
        # Every round from the second on (co2 waits for nothing at its first boundary).
        assert len(rounds) >= steps - 1, debug.stderr
        assert any(re.search(rf"co2 debug: rank {rank}: outer-average of 4096 bytes: [\d.]+ ms submit to "
                             r"completion, waited [\d.]+ ms", line) for line in lines), debug.stderr
    assert "CO2_TRACE_MAX_EVENTS=lots is not an integer" in debug.stderr
    assert len(complete_events(load_trace(tmp_path / "d.rank0.json"))) > steps

    info = run_group(tmp_path, steps=steps, tau=1, count=1024, sleep_ms=0, rank_sleep_ms=0, CO2_LOG_LEVEL="info")
    for rank in range(info.world):
        rounds = [m for m in map(ROUND_LINE.search, info.stderr.splitlines()) if m and int(m.group(1)) == rank]
        assert 1 <= len(rounds) <= info.elapsed_s + 1, (len(rounds), info.elapsed_s, info.stderr)
    assert "co2 debug" not in info.stderr

"""The Prometheus endpoint with real processes (co2run, UCX over TCP on loopback;
docs/observability.md, "Metrics"): two ranks with CO2_METRICS_PORT=0 each serve their own
/metrics; a scrape while they wait after training, and another after finalize, reads exactly
the statistics co2_engine_get_stats gives at that point (steps, rounds, boundary wait,
collective time, wire bytes, the non-finite round, anchor checks, ...), with Prometheus's
types and the `rank` label; every metric is documented and every metric the Grafana dashboard
(docs/grafana-dashboard.json) queries exists. Bad settings (not a port, a port in use, a port
plus local rank beyond 65535) fail engine creation with a message naming CO2_METRICS_PORT.

The workers stop at known points and wait for files the test writes (metrics_worker.cpp), so
nothing here depends on timing.

Run by meson: METRICS_WORKER=... CO2RUN=... DOCS_DIR=... pytest metrics_test.py
"""
import json
import math
import os
import re
import socket
import subprocess
import time
import urllib.request

import pytest

WORKER = os.environ.get("METRICS_WORKER", "")
CO2RUN = os.environ.get("CO2RUN", "")
DOCS = os.environ.get("DOCS_DIR", "")
WAIT_LIMIT_S = 120
ROUNDS, TAU, COUNT, WORLD = 6, 3, 4096, 2

pytestmark = pytest.mark.skipif(not (WORKER and CO2RUN and DOCS), reason="METRICS_WORKER / CO2RUN / DOCS_DIR not set")

ENDPOINT_LINE = re.compile(r"co2 info: metrics for Prometheus at http://([\d.]+):(\d+)/metrics")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

# metric -> (type, the co2_engine_get_stats field it exports, scale to the metric's unit)
EXPECTED = {
    "co2_steps_total": ("counter", "steps", 1),
    "co2_rounds_total": ("counter", "rounds", 1),
    "co2_outer_updates_total": ("counter", "outer_updates", 1),
    "co2_boundary_wait_seconds_total": ("counter", "boundary_wait_ns", 1e-9),
    "co2_collective_seconds_total": ("counter", "collective_ns", 1e-9),
    "co2_reduced_bytes_total": ("counter", "bytes_reduced", 1),
    "co2_wire_sent_bytes_total": ("counter", "wire_bytes_total", 1),
    "co2_nonfinite_rounds_total": ("counter", "nonfinite_rounds", 1),
    "co2_nonfinite_local_total": ("counter", "nonfinite_local", 1),
    "co2_anchor_checks_total": ("counter", "anchor_checks", 1),
    "co2_hidden_ratio": ("gauge", "hidden_fraction", 1),
    "co2_last_round_seconds": ("gauge", "last_round_ns", 1e-9),
    "co2_advised_tau": ("gauge", "advised_tau", 1),
    "co2_world_size": ("gauge", "world_size", 1),
    "co2_outer_state_bytes": ("gauge", "outer_state_bytes", 1),
}


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    types, samples = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        elif line and not line.startswith("#"):
            match = SAMPLE.match(line)
            assert match, f"not an exposition line: {line!r}"
            labels = tuple(sorted(LABEL.findall(match.group(2) or "")))
            samples[(match.group(1), labels)] = float(match.group(3))
    return types, samples


def wait_until(condition, what, run):
    """Polls `condition` until it holds; fails (with co2run's output) if the run ends first or
    WAIT_LIMIT_S passes."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not condition():
        assert run.process.poll() is None, f"co2run ended ({run.process.returncode}) before {what}:\n{run.log()}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_LIMIT_S} s:\n{run.log()}"
        time.sleep(0.02)


def environment(**extra):
    env = dict(os.environ, UCX_TLS="tcp", UCX_NET_DEVICES="lo", CO2_LOG_LEVEL="info")
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Run:
    """A two-rank run paused after training; `advance` lets it finalize, then exit."""

    def __init__(self, out):
        self.out = str(out)
        self.stderr_path = os.path.join(self.out, "stderr.txt")
        self.stderr = open(self.stderr_path, "w")
        self.process = subprocess.Popen(
            [CO2RUN, "--nproc-per-node", str(WORLD), WORKER, self.out, str(ROUNDS), str(TAU), str(COUNT)],
            env=environment(CO2_METRICS_PORT=0), stdout=subprocess.DEVNULL, stderr=self.stderr, text=True)

    def log(self):
        with open(self.stderr_path) as f:
            return f.read()

    def ports(self):
        return sorted(int(m.group(2)) for m in ENDPOINT_LINE.finditer(self.log()))

    def stats(self, stage):
        result = {}
        for rank in range(WORLD):
            with open(os.path.join(self.out, f"stats.{stage}.{rank}.json")) as f:
                result[rank] = json.load(f)
        return result

    def reach(self, stage):
        wait_until(lambda: all(os.path.exists(os.path.join(self.out, f"stats.{stage}.{r}.json")) for r in range(WORLD)),
                   f"stats.{stage} files", self)

    def release(self, name):
        open(os.path.join(self.out, name), "w").close()

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = Run(tmp_path_factory.mktemp("metrics"))
    try:
        run.reach("trained")
        # The line is written at engine creation, long before the stats file; co2run forwards
        # it, so wait for it as for any other output.
        wait_until(lambda: len(run.ports()) == WORLD, "endpoint line per rank", run)
        run.scraped = {"trained": [scrape(p) for p in run.ports()]}
        run.release("go")
        run.reach("finalized")
        run.scraped["finalized"] = [scrape(p) for p in run.ports()]
        run.release("done")
        assert run.process.wait(timeout=WAIT_LIMIT_S) == 0, run.log()
        yield run
    finally:
        run.close()


def by_rank(scrapes):
    """rank -> (types, samples of that rank), checking that each endpoint serves one rank."""
    result = {}
    for types, samples in scrapes:
        ranks = {dict(labels).get("rank") for (name, labels) in samples if name.startswith("co2_")}
        assert len(ranks) == 1 and None not in ranks, f"one rank per endpoint, got {ranks}"
        result[int(ranks.pop())] = (types, samples)
    return result


def value(samples, name, rank):
    return samples[(name, (("rank", str(rank)),))]


@pytest.mark.parametrize("stage", ["trained", "finalized"])
def test_scrape_reads_the_engine_statistics(run, stage):
    stats = run.stats(stage)
    ranks = by_rank(run.scraped[stage])
    assert sorted(ranks) == list(range(WORLD))
    for rank, (types, samples) in ranks.items():
        for name, (kind, field, scale) in EXPECTED.items():
            assert types.get(name) == kind, f"{name}: type {types.get(name)}, want {kind}"
            assert math.isclose(value(samples, name, rank), stats[rank][field] * scale, rel_tol=1e-12,
                                abs_tol=1e-12), f"rank {rank} {name}"


def test_counters_count_what_happened(run):
    trained = by_rank(run.scraped["trained"])
    finalized = by_rank(run.scraped["finalized"])
    for rank in range(WORLD):
        samples = trained[rank][1]
        assert value(samples, "co2_steps_total", rank) == ROUNDS * TAU
        assert value(samples, "co2_rounds_total", rank) == ROUNDS
        assert value(samples, "co2_nonfinite_rounds_total", rank) == 1  # rank 1's NaN reached every rank
        assert value(samples, "co2_nonfinite_local_total", rank) == (1 if rank == 1 else 0)
        assert value(samples, "co2_anchor_checks_total", rank) == ROUNDS // 2
        assert value(samples, "co2_world_size", rank) == WORLD
        assert value(samples, "co2_tau", rank) == TAU
        assert value(samples, "co2_wire_sent_bytes_total", rank) > 0
        assert value(samples, "co2_collective_seconds_total", rank) > 0
        assert 0 <= value(samples, "co2_hidden_ratio", rank) <= 1
        after = finalized[rank][1]
        # finalize adds no step and waits for the last all-reduce (collective time grows)
        assert value(after, "co2_steps_total", rank) == ROUNDS * TAU
        assert value(after, "co2_collective_seconds_total", rank) > value(samples, "co2_collective_seconds_total", rank)


def test_every_metric_is_documented(run):
    with open(os.path.join(DOCS, "observability.md")) as f:
        docs = f.read()
    types, _ = run.scraped["trained"][0]
    assert set(EXPECTED) <= set(types)
    undocumented = sorted(name for name in types if f"`{name}`" not in docs)
    assert not undocumented, f"not in docs/observability.md: {undocumented}"
    for name, kind in types.items():
        assert name.startswith(("co2_", "exposer_")), name  # exposer_*: prometheus-cpp's own
        if name.startswith("co2_"):
            assert kind in ("counter", "gauge")
            assert name.endswith("_total") == (kind == "counter"), name


def test_the_dashboard_queries_exported_metrics(run):
    with open(os.path.join(DOCS, "grafana-dashboard.json")) as f:
        dashboard = json.load(f)
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(expressions) >= 6
    types, _ = run.scraped["trained"][0]
    queried = {name for expr in expressions for name in re.findall(r"\bco2_[a-z_]+", expr)}
    assert queried, "the dashboard queries no co2 metric"
    missing = sorted(queried - set(types))
    assert not missing, f"the dashboard queries metrics the endpoint does not export: {missing}"


def failed_run(tmp_path, world, port_setting):
    done = subprocess.run(
        [CO2RUN, "--nproc-per-node", str(world), WORKER, str(tmp_path), "1", "1", "16"],
        env=environment(CO2_METRICS_PORT=port_setting), capture_output=True, text=True, timeout=WAIT_LIMIT_S)
    assert done.returncode != 0
    return done.stderr


def test_not_a_port(tmp_path):
    stderr = failed_run(tmp_path, 1, "metrics")
    assert "co2_engine_create(comm, &engine_config, &engine) -> 1 " in stderr  # CO2_ERR_INVALID_ARGUMENT
    assert "CO2_METRICS_PORT=metrics: 'metrics' is not a port number" in stderr


def test_port_in_use(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stderr = failed_run(tmp_path, 1, f"127.0.0.1:{port}")
    assert f"cannot listen on 127.0.0.1:{port}" in stderr
    assert "the port is in use" in stderr


def test_port_plus_local_rank_beyond_the_range(tmp_path):
    stderr = failed_run(tmp_path, 2, "65535")
    assert "port 65535 + local rank 1 is above 65535" in stderr

"""Faults between real processes over UCX/TCP on loopback: a killed rank, a stopped rank, a bad
auth token, a wrong world size, a rank that never arrives. Each must end every other rank with a
specific status within the communicator's timeout plus a margin, never a hang: every test has
its own deadline and kills what is left.

Run by meson: FAULT_WORKER=path/to/fault_worker pytest faults_test.py
"""
import os
import signal
import subprocess
import tempfile
import time

import pytest

from processes import free_port, group_fixture, launcher_env, wait_all

WORKER = os.environ.get("FAULT_WORKER", "")
TIMEOUT_MS = 4000          # the communicators' no-progress timeout in these tests
MARGIN_S = 8.0             # how much later than the timeout a status may arrive
DESTROY_LIMIT_MS = 3000    # destroy after a failure must be prompt

PEER_LOST, PEER_TIMEOUT, ABORTED, RENDEZVOUS = 100, 101, 103, 105

pytestmark = pytest.mark.skipif(not WORKER, reason="FAULT_WORKER is not set")


class Group:
    """World-size-W group of fault_worker processes, each with its own environment."""

    def __init__(self, world, port=None, token="secret-token", max_steps=100000):
        self.world = world
        self.port = port or free_port()
        self.token = token
        self.max_steps = max_steps
        self.ready_dir = tempfile.mkdtemp(prefix="co2-faults-")
        self.procs = {}

    def start(self, rank, **overrides):
        env = launcher_env(rank, self.world, self.port, self.token, **overrides)
        self.procs[rank] = subprocess.Popen(
            [WORKER, self.ready_dir, str(TIMEOUT_MS), str(self.max_steps)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def wait_ready(self, ranks, limit_s=60):
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if all(os.path.exists(os.path.join(self.ready_dir, f"ready.{r}")) for r in ranks):
                return
            for r in ranks:
                if self.procs[r].poll() is not None:
                    out, err = self.procs[r].communicate()
                    pytest.fail(f"rank {r} exited early with {self.procs[r].returncode}: {out}{err}")
            time.sleep(0.05)
        pytest.fail("the group never became ready")

    def wait_exit(self, ranks, limit_s):
        """Exit codes of `ranks`, each within limit_s of now; a rank still running fails the test."""
        return wait_all(self.procs, ranks, limit_s, hang="a hang after the fault")


@pytest.fixture
def group_factory():
    yield from group_fixture(Group)


def destroy_times(outputs):
    times = []
    for text in outputs.values():
        for line in text.splitlines():
            if line.startswith("status ") and "after_error_ms" in line:
                times.append(int(line.split()[-1]))
    return times


def test_killed_rank_fails_the_others_with_peer_lost(group_factory):
    g = group_factory(3)
    for r in range(3):
        g.start(r)
    g.wait_ready(range(3))
    time.sleep(0.3)  # mid-training: all-reduces in flight
    g.procs[1].kill()
    codes, outputs = g.wait_exit([0, 2], TIMEOUT_MS / 1000 + MARGIN_S)
    assert set(codes.values()) <= {PEER_LOST, PEER_TIMEOUT, ABORTED}, (codes, outputs)
    assert PEER_LOST in codes.values() or PEER_TIMEOUT in codes.values(), (codes, outputs)
    assert all(t < DESTROY_LIMIT_MS for t in destroy_times(outputs)), outputs


def test_stopped_rank_fails_the_others_with_peer_timeout(group_factory):
    g = group_factory(3)
    for r in range(3):
        g.start(r)
    g.wait_ready(range(3))
    time.sleep(0.3)
    g.procs[2].send_signal(signal.SIGSTOP)
    started = time.monotonic()
    codes, outputs = g.wait_exit([0, 1], TIMEOUT_MS / 1000 + MARGIN_S)
    elapsed = time.monotonic() - started
    assert set(codes.values()) <= {PEER_TIMEOUT, ABORTED}, (codes, outputs)
    assert PEER_TIMEOUT in codes.values(), (codes, outputs)
    # "No progress for T": not before the timeout (minus scheduling slack).
    assert elapsed > TIMEOUT_MS / 1000 * 0.5, elapsed
    assert all(t < DESTROY_LIMIT_MS for t in destroy_times(outputs)), outputs


def test_bad_auth_token_is_refused(group_factory):
    g = group_factory(3)
    g.start(0)
    g.start(1, CO2_AUTH_TOKEN="not-the-token")
    g.start(2)
    codes, outputs = g.wait_exit([1], MARGIN_S + TIMEOUT_MS / 1000)
    assert codes[1] == RENDEZVOUS, outputs
    assert "token" in outputs[1].lower(), outputs[1]
    codes, outputs = g.wait_exit([0, 2], TIMEOUT_MS / 1000 + MARGIN_S)
    assert codes == {0: RENDEZVOUS, 2: RENDEZVOUS}, (codes, outputs)


def test_wrong_world_size_is_a_rendezvous_error(group_factory):
    g = group_factory(2)
    g.start(0)
    g.start(1, WORLD_SIZE=3, LOCAL_WORLD_SIZE=3)
    codes, outputs = g.wait_exit([0, 1], TIMEOUT_MS / 1000 + MARGIN_S)
    assert codes == {0: RENDEZVOUS, 1: RENDEZVOUS}, (codes, outputs)
    assert "world size" in outputs[0], outputs[0]


def test_rank_that_never_arrives_is_a_rendezvous_error(group_factory):
    g = group_factory(3)
    g.start(0)
    g.start(1)
    started = time.monotonic()
    codes, outputs = g.wait_exit([0, 1], TIMEOUT_MS / 1000 + MARGIN_S)
    assert codes == {0: RENDEZVOUS, 1: RENDEZVOUS}, (codes, outputs)
    assert "never arrived" in outputs[0] or "never arrived" in outputs[1], outputs
    assert time.monotonic() - started > TIMEOUT_MS / 1000 * 0.5

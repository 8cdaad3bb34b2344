"""What the multi-process pytest suites (faults_test.py, elastic_test.py) share: a free port, a
rank's launcher environment over UCX/TCP on loopback, collecting exit codes within a deadline (a
process still running then is a hang and fails the test), and killing what is left."""
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from ports import free_port  # noqa: E402,F401  (tests/ports.py; re-exported to the tests here)


def launcher_env(rank, world, port, token, **extra):
    """The environment co2run gives rank `rank` of `world` on one host, plus `extra`."""
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), CO2_AUTH_TOKEN=token,
               UCX_TLS="tcp", UCX_NET_DEVICES="lo")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wait_all(procs, keys, limit_s, hang="a hang"):
    """Exit codes and outputs (stdout + stderr) of procs[k] for k in keys, all within limit_s."""
    deadline = time.monotonic() + limit_s
    codes, outputs = {}, {}
    for key in keys:
        try:
            out, err = procs[key].communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"rank {key} still running after {limit_s:.1f} s: {hang}")
        codes[key], outputs[key] = procs[key].returncode, out + err
    return codes, outputs


def kill_all(procs):
    """Kills every process still running, a stopped one too."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def group_fixture(group_class):
    """A pytest fixture body: yields a factory of group_class objects, each cleaned up after."""
    groups = []

    def make(*args, **kwargs):
        group = group_class(*args, **kwargs)
        groups.append(group)
        return group

    yield make
    for group in groups:
        kill_all(group.procs)

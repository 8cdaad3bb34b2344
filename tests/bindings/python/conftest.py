"""Helpers for the co2 Python tests: ranks as threads of this process (the `local` transport).

Every collective blocks until all ranks joined, so these tests also prove that the binding
releases the GIL around blocking calls: otherwise the first rank to block would hold it and the
others could never arrive.
"""
import itertools
import os
import sys
import threading

import pytest

# tests/ports.py, shared with the C API's process tests
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

_groups = itertools.count()
# Generous: a rank that does not finish within this is reported as hung instead of hanging CI.
RANK_THREAD_TIMEOUT_S = 240


def unique_group(prefix="test"):
    return f"{prefix}-{os.getpid()}-{next(_groups)}"


def run_ranks(world, fn, timeout=RANK_THREAD_TIMEOUT_S):
    """Runs fn(rank) on `world` threads; returns the results in rank order, re-raises the
    first exception, fails if a rank hangs."""
    results, errors = [None] * world, [None] * world

    def main(rank):
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors[rank] = exc

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for rank, t in enumerate(threads):
        t.join(timeout)
        if t.is_alive():
            pytest.fail(f"rank {rank} did not finish within {timeout} s (hang)")
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def local_comm(rank, world, group):
    import co2
    return co2.Communicator(rank, world, transport="local", group_name=group)

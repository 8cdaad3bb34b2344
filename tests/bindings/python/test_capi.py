"""co2.capi and the co2 package: round trips of numpy arrays and torch tensors through the C API,
bad input, exceptions, the GIL, checkpoints as bytes and as streams."""
import io
import threading
import time

import numpy as np
import pytest
import torch

import co2
import co2.torch
from co2 import capi
from conftest import local_comm, run_ranks, unique_group


# --- version, defaults, errors ------------------------------------------------------------------

def test_version_and_defaults_come_from_the_c_api():
    assert co2.__version__ == "%d.%d.%d" % tuple(capi.get_version())
    defaults = co2.engine_defaults()
    assert defaults["tau"] == capi.CO2_DEFAULT_TAU == 12
    assert defaults["outer_momentum"] == capi.CO2_OUTER_MOMENTUM_AUTO
    assert defaults["algorithm"] == capi.CO2_ALGO_CO2
    assert co2.comm_defaults()["timeout_ms"] == capi.CO2_DEFAULT_TIMEOUT_MS


def test_failing_status_raises_with_the_library_message():
    with co2.Communicator(0, 1, transport="local", group_name=unique_group()) as comm:
        with co2.Engine(comm, algorithm="sync") as engine:
            with pytest.raises(co2.InvalidStateError) as info:
                engine.commit()                         # nothing registered
            err = info.value
            assert err.status == capi.CO2_ERR_INVALID_STATE
            assert err.detail and err.detail in str(err)
            assert err.status_string == capi.status_string(capi.CO2_ERR_INVALID_STATE)
            engine.register("w", np.zeros(4, np.float32))
            with pytest.raises(co2.DuplicateTensorError):
                engine.register("w", np.zeros(4, np.float32))
            with pytest.raises(co2.InvalidStateError):
                engine.step()                           # before commit
        with pytest.raises(co2.UnknownEnumError) as info:
            co2.Engine(comm, algorithm=99)
        assert info.value.status == capi.CO2_ERR_UNKNOWN_ENUM
        assert isinstance(info.value, ValueError)
        with pytest.raises(ValueError, match="unknown algorithm"):
            co2.Engine(comm, algorithm="adam")
        with pytest.raises(TypeError, match="unexpected keyword argument 'taux'"):
            co2.Engine(comm, taux=3)
        with pytest.raises(co2.InvalidArgumentError, match="world"):
            co2.Communicator(0, 0, transport="local", group_name=unique_group())


def test_engine_keywords_reach_the_engine():
    with co2.Communicator(0, 1, transport="local", group_name=unique_group()) as comm, \
            co2.Engine(comm, algorithm="diloco", tau=5, outer_lr=0.7, outer_momentum=0.9,
                       nesterov=True, clip="norm", clip_threshold=2.0) as engine:
        assert engine.algorithm == "diloco"
        assert engine.get_param("tau") == 5
        assert engine.get_param("outer_lr") == pytest.approx(0.7)
        assert engine.get_param("outer_momentum") == pytest.approx(0.9)
        assert engine.get_param("clip_threshold") == pytest.approx(2.0)
        engine.set_param("tau", 7)
        assert engine.get_param("tau") == 7
        with pytest.raises(co2.InvalidArgumentError):
            engine.set_param("outer_momentum", 1.5)
        assert engine.get_param("outer_momentum") == pytest.approx(0.9)   # refused: unchanged


def test_eager_policy_reaches_the_engine():
    """eager=True: after a boundary every rank holds the same anchor but starts its round from
    its own point, anchor - (alpha/W) * its own delta (beta = 0)."""
    group, world, n, alpha = unique_group(), 2, 9, 0.5
    assert co2.engine_defaults()["eager"] == capi.CO2_DEFAULT_EAGER

    def rank_main(rank):
        w = np.zeros(n, np.float32)
        with local_comm(rank, world, group) as comm, co2.Engine(
                comm, algorithm="co2", tau=1, outer_lr=alpha, outer_momentum=0.0,
                eager=True) as engine:
            engine.register("w", w)
            engine.commit()
            w -= np.float32(rank + 1)               # this rank's local step: delta = rank + 1
            assert engine.step()
            return w.copy(), engine.consensus("anchor")

    (w0, a0), (w1, a1) = run_ranks(world, rank_main)
    np.testing.assert_array_equal(a0, a1)
    np.testing.assert_array_equal(a0, np.zeros(n, np.float32))   # nothing arrived yet
    np.testing.assert_allclose(w0, -alpha / world * 1.0)
    np.testing.assert_allclose(w1, -alpha / world * 2.0)


def test_fp4_wire_format_reaches_the_engine():
    """wire_format="fp4": 4 bits a value and a scale per 64 (about 7x fewer bytes than fp32),
    the same anchor on every rank; a uniform delta is one of its exact values."""
    group, world, n = unique_group(), 2, 1000

    def rank_main(rank):
        w = np.zeros(n, np.float32)
        with local_comm(rank, world, group) as comm, co2.Engine(
                comm, algorithm="diloco", tau=1, outer_lr=1.0, outer_momentum=0.0,
                wire_format="fp4") as engine:
            engine.register("w", w)
            engine.commit()
            w -= np.float32(0.25) * (rank + 1)
            assert engine.step()
            return engine.consensus("anchor"), engine.stats()

    (a0, s0), (a1, _) = run_ranks(world, rank_main)
    np.testing.assert_array_equal(a0, a1)
    np.testing.assert_allclose(a0, -0.375, rtol=1e-6)
    assert 6.5 * s0["wire_bytes_last_round"] < s0["bytes_reduced"] < 7.5 * s0["wire_bytes_last_round"]


def test_wire_format_reaches_the_engine():
    """wire_format="bf16": the anchor is the bf16 round trip of the average, the same on every
    rank; the statistics count half the fp32 bytes; bad values raise."""
    group, world, n = unique_group(), 2, 1000
    defaults = co2.engine_defaults()
    assert defaults["wire_format"] == capi.CO2_WIRE_FP32
    assert defaults["error_feedback"] == capi.CO2_DEFAULT_ERROR_FEEDBACK == 1

    def rank_main(rank):
        w = np.zeros(n, np.float32)
        with local_comm(rank, world, group) as comm, co2.Engine(
                comm, algorithm="diloco", tau=1, outer_lr=1.0, outer_momentum=0.0,
                wire_format="bf16", error_feedback=True) as engine:
            engine.register("w", w)
            engine.commit()
            w -= np.float32(0.3) * (rank + 1)
            assert engine.step()
            return engine.consensus("anchor"), engine.stats()

    (a0, s0), (a1, s1) = run_ranks(world, rank_main)
    np.testing.assert_array_equal(a0, a1)
    exact = -np.float32(0.3) * np.float32(1.5)
    assert a0[0] != exact                                   # compressed ...
    np.testing.assert_allclose(a0, exact, rtol=2 ** -8)     # ... to bf16 precision
    assert s0["wire_bytes_last_round"] * 2 == s0["bytes_reduced"]
    assert s0["wire_bytes_total"] == s0["wire_bytes_last_round"]
    with local_comm(0, 1, unique_group()) as comm:
        with pytest.raises(ValueError, match="unknown wire_format"):
            co2.Engine(comm, wire_format="int4")
        with pytest.raises(co2.InvalidArgumentError, match="co2 and diloco"):
            co2.Engine(comm, algorithm="sync", wire_format="int8")


class _Captured(Exception):
    """Raised in place of engine_create once the config that would reach the C API is seen."""


def _capture_engine_config(monkeypatch):
    seen = []

    def fake_engine_create(comm_handle, config):
        seen.append(config.shard_outer_state)
        raise _Captured()

    monkeypatch.setattr(capi, "engine_create", fake_engine_create)
    return seen


def test_shard_outer_state_reaches_the_c_struct(monkeypatch):
    """shard_outer_state: default 0, True reaches co2_engine_config_t as 1, a value other than
    0 / 1 is refused by the C API naming the field; the statistics carry outer_state_bytes.
    (Whether the engine implements sharding is not this test's business: nothing trains.)"""
    assert co2.engine_defaults()["shard_outer_state"] == 0
    config = capi.engine_config()
    config.shard_outer_state = 1
    assert config.shard_outer_state == 1
    with local_comm(0, 1, unique_group()) as comm:
        with pytest.raises(co2.InvalidArgumentError, match="shard_outer_state"):
            co2.Engine(comm, shard_outer_state=2)
        with co2.Engine(comm, algorithm="co2", tau=2) as engine:
            engine.register("w", np.zeros(8, np.float32))
            engine.commit()
            engine.step()
            stats = engine.stats()
            assert isinstance(stats["outer_state_bytes"], int)
            assert stats["outer_state_bytes"] == capi.engine_get_stats(engine.handle).outer_state_bytes
        seen = _capture_engine_config(monkeypatch)
        for value in (True, False, 1):
            with pytest.raises(_Captured):
                co2.Engine(comm, shard_outer_state=value)
        with pytest.raises(_Captured):
            co2.Engine(comm)
        assert seen == [1, 0, 1, 0]


def test_distribute_passes_shard_outer_state_to_the_engine(monkeypatch):
    seen = _capture_engine_config(monkeypatch)
    model = torch.nn.Linear(3, 2)
    with local_comm(0, 1, unique_group()) as comm:
        with pytest.raises(_Captured):
            co2.torch.distribute(model, comm=comm, tau=2, shard_outer_state=True)
    assert seen == [1]


def _capture_whole_engine_config(monkeypatch):
    """Every co2_engine_config_t that would reach engine_create, as a dict of Engine keywords."""
    seen = []

    def fake_engine_create(comm_handle, config):
        seen.append({key: getattr(config, key) for key in co2.engine_defaults()})
        raise _Captured()

    monkeypatch.setattr(capi, "engine_create", fake_engine_create)
    return seen


def test_engine_keywords_take_exactly_the_documented_values(monkeypatch):
    """Issue 23, defect 10. Before: nesterov=-3 / 2 and error_feedback=-1 / 2 reached C as 1,
    eager=-1 (C's CO2_EAGER_AUTO) as 1 (forced eager), a string "False" as True, tau=2.7 as 2.
    Now the documented values and the C constants reach C unchanged, and anything else raises
    naming the key, the value and what is allowed, before C sees it."""
    seen = _capture_whole_engine_config(monkeypatch)
    accepted = [({"nesterov": True}, "nesterov", 1), ({"nesterov": False}, "nesterov", 0),
                ({"nesterov": 1}, "nesterov", 1), ({"nesterov": np.bool_(True)}, "nesterov", 1),
                ({"error_feedback": False}, "error_feedback", 0),
                ({"error_feedback": 0}, "error_feedback", 0),
                ({"eager": True}, "eager", 1), ({"eager": False}, "eager", 0),
                ({"eager": "auto"}, "eager", capi.CO2_EAGER_AUTO),
                ({"eager": capi.CO2_EAGER_AUTO}, "eager", capi.CO2_EAGER_AUTO),
                ({"eager": 0}, "eager", 0), ({"tau": np.int64(5)}, "tau", 5),
                ({"outer_lr": 1}, "outer_lr", 1.0), ({"algorithm": "SYNC"}, "algorithm",
                                                     capi.CO2_ALGO_SYNC)]
    with local_comm(0, 1, unique_group()) as comm:
        for keywords, key, expected in accepted:
            with pytest.raises(_Captured):
                co2.Engine(comm, **keywords)
            assert seen[-1][key] == expected, (keywords, seen[-1][key])
        # engine_defaults() passed back as keywords is the C API's default config
        with pytest.raises(_Captured):
            co2.Engine(comm, **co2.engine_defaults())
        assert seen[-1] == co2.engine_defaults()
        refused = [({"nesterov": -3}, co2.InvalidArgumentError,
                    r"nesterov=-3 \(int\): nesterov is True or False"),
                   ({"nesterov": 2}, co2.InvalidArgumentError, r"nesterov=2 \(int\)"),
                   ({"nesterov": "False"}, TypeError,
                    r"nesterov='False' \(str\): nesterov is True or False"),
                   ({"nesterov": 0.0}, TypeError, r"nesterov=0\.0 \(float\)"),
                   ({"error_feedback": -1}, co2.InvalidArgumentError,
                    r"error_feedback=-1 \(int\): error_feedback is True or False"),
                   ({"error_feedback": 2}, co2.InvalidArgumentError, r"error_feedback=2"),
                   ({"shard_outer_state": "yes"}, TypeError, r"shard_outer_state='yes'"),
                   ({"eager": 2}, co2.InvalidArgumentError,
                    r"eager=2 \(int\): eager is True, False or 'auto'"),
                   ({"eager": "False"}, co2.InvalidArgumentError, r"eager='False'"),
                   ({"eager": 1.0}, TypeError, r"eager=1\.0 \(float\)"),
                   ({"tau": 2.7}, TypeError, r"tau=2\.7 \(float\): tau is an integer"),
                   ({"tau": True}, TypeError, r"tau=True \(bool\)"),
                   ({"tau": -1}, co2.InvalidArgumentError, r"tau=-1 \(int\): tau is an integer"),
                   ({"warmup_sync_rounds": "2"}, TypeError, r"warmup_sync_rounds='2'"),
                   ({"outer_lr": "0.5"}, TypeError, r"outer_lr='0\.5' \(str\): outer_lr is a "
                                                    r"number"),
                   ({"outer_momentum": True}, TypeError, r"outer_momentum=True"),
                   ({"outer_momentum": "fast"}, co2.InvalidArgumentError,
                    r"outer_momentum='fast'.*'auto'"),
                   ({"algorithm": 1.0}, TypeError, r"algorithm=1\.0 \(float\): algorithm is "
                                                   r"one of co2, sync"),
                   ({"clip": True}, TypeError, r"clip=True"),
                   ({"wire_format": "int4"}, co2.UnknownEnumError, r"unknown wire_format 'int4'")]
        calls = len(seen)
        for keywords, error, message in refused:
            with pytest.raises(error, match=message):
                co2.Engine(comm, **keywords)
        assert len(seen) == calls, "a refused value reached the C API"


def test_apply_step_takes_boundary_arrival_or_a_step(monkeypatch):
    """apply_step (1.2): "boundary" (the default), "arrival", a step k >= 1 or the C constants
    reach co2_engine_config_t; anything else raises naming the choices before C sees it; what
    C refuses (another algorithm than co2) it refuses naming apply_step; sharded outer state
    takes it. The statistics carry arrival_updates and last_apply_step."""
    assert co2.engine_defaults()["apply_step"] == capi.CO2_APPLY_AT_BOUNDARY == 0
    assert capi.CO2_APPLY_ON_ARRIVAL == -1
    with local_comm(0, 1, unique_group()) as comm:
        with pytest.raises(co2.InvalidArgumentError, match="apply_step"):
            co2.Engine(comm, algorithm="diloco", apply_step=2)
        for sharded in (False, True):
            with co2.Engine(comm, tau=4, apply_step=2, shard_outer_state=sharded) as engine:
                engine.register("w", np.zeros(8, np.float32))
                engine.commit()
                for _ in range(7):
                    engine.step()
                stats = engine.stats()
                raw = capi.engine_get_stats(engine.handle)
                assert (stats["arrival_updates"], stats["last_apply_step"]) == \
                    (raw.arrival_updates, raw.last_apply_step) == (1, 2)
        seen = _capture_whole_engine_config(monkeypatch)
        for value, expected in [("boundary", 0), ("arrival", -1), (1, 1), (np.int64(6), 6),
                                (capi.CO2_APPLY_ON_ARRIVAL, -1), (0, 0)]:
            with pytest.raises(_Captured):
                co2.Engine(comm, apply_step=value)
            assert seen[-1]["apply_step"] == expected, value
        with pytest.raises(_Captured):
            co2.torch.distribute(torch.nn.Linear(3, 2), comm=comm, apply_step="arrival")
        assert seen[-1]["apply_step"] == -1
        calls = len(seen)
        choices = r"apply_step is 'boundary', 'arrival' or a step k >= 1"
        for value, error in [("soon", co2.InvalidArgumentError), ("Arrival ", ValueError),
                             (-2, co2.InvalidArgumentError), (2 ** 31, ValueError),
                             (2.0, TypeError), (True, TypeError), ([1], TypeError)]:
            with pytest.raises(error, match=choices):
                co2.Engine(comm, apply_step=value)
        assert len(seen) == calls, "a refused value reached the C API"


def test_other_c_fields_take_exactly_the_documented_values():
    """The same rule for the communicator's options and the engine's other calls."""
    group = unique_group()
    for keywords, error, message in [
            ({"timeout_ms": 2.5}, TypeError, r"timeout_ms=2\.5 \(float\)"),
            ({"timeout_ms": 0}, co2.InvalidArgumentError, r"timeout_ms=0 \(int\)"),
            ({"chunk_bytes": "1M"}, TypeError, r"chunk_bytes='1M'"),
            ({"transport": 1.0}, TypeError, r"transport=1\.0"),
            ({"node_id": True}, TypeError, r"node_id=True"),
            ({"connections_per_peer": 0}, co2.InvalidArgumentError, r"connections_per_peer=0"),
            ({"connections_per_peer": 17}, co2.InvalidArgumentError, r"connections_per_peer=17")]:
        with pytest.raises(error, match=message):
            co2.Communicator(0, 1, transport=keywords.pop("transport", "local"),
                             group_name=group, **keywords)
    with pytest.raises(TypeError, match=r"rank='0' \(str\)"):
        co2.Communicator("0", 1, transport="local", group_name=group)
    with local_comm(0, 1, unique_group()) as comm, co2.Engine(comm, tau=3) as engine:
        with pytest.raises(TypeError, match=r"color=1\.5"):
            comm.split(1.5)
        engine.register("w", np.zeros(4, np.float32))
        engine.commit()
        with pytest.raises(TypeError, match=r"tau=2\.5 \(float\): tau is an integer"):
            engine.set_param("tau", 2.5)
        with pytest.raises(TypeError, match=r"outer_lr='1' \(str\)"):
            engine.set_param("outer_lr", "1")
        with pytest.raises(TypeError, match=r"tau=2\.5 \(float\): tau is an integer"):
            engine.set_param(capi.CO2_PARAM_TAU, 2.5)           # the C constant: the same rule
        engine.set_param("TAU", 4)
        assert engine.get_param(capi.CO2_PARAM_TAU) == 4 and engine.get_param("tau") == 4
        with pytest.raises(TypeError, match=r"keep='False' \(str\)"):
            engine.save(keep="False")
        with pytest.raises(TypeError, match=r"role=1\.0"):
            engine.register("v", np.zeros(4, np.float32), role=1.0)
    with local_comm(0, 1, unique_group()) as comm:
        model = torch.nn.Linear(3, 2)
        for keywords, message in [({"flat": "False"}, r"flat='False' \(str\): flat is True or "
                                                      r"False"),
                                  ({"reduce_in_backward": 2}, r"reduce_in_backward=2 \(int\)"),
                                  ({"nesterov": "no"}, r"nesterov='no'")]:
            with pytest.raises((TypeError, ValueError), match=message):
                co2.torch.distribute(model, comm=comm, **keywords)
        # hierarchy as the C constant or in capitals is hierarchical for co2.torch too
        for hierarchy in ("NODES", capi.CO2_HIERARCHY_NODES):
            with co2.torch.distribute(torch.nn.Linear(3, 2), comm=comm, hierarchy=hierarchy,
                                      intra_node_average="framework") as trainer:
                assert trainer.hierarchical


def test_timeout_comes_from_the_environment(monkeypatch):
    """Issue 23, defect 16: CO2_TIMEOUT_MS replaces the 5-minute default no-progress timeout of
    communicators made without timeout_ms=. Before: a peer that never arrives was reported after
    5 minutes whatever the environment said (here: the rank threads' own limit fails the
    test)."""
    monkeypatch.setenv("CO2_TIMEOUT_MS", "1500")
    group, rank0_done = unique_group(), threading.Event()

    def rank_main(rank):
        with co2.Communicator(rank, 2, transport="local", group_name=group) as comm:
            if rank == 1:                       # stays in the group, never joins the all-reduce
                rank0_done.wait(120)
                return None
            try:
                with pytest.raises(co2.PeerTimeoutError):
                    comm.allreduce(np.ones(4, np.float32))
            finally:
                rank0_done.set()
            return True

    assert run_ranks(2, rank_main, timeout=60)[0]
    monkeypatch.setenv("CO2_TIMEOUT_MS", "5s")
    with pytest.raises(co2.InvalidArgumentError, match=r"CO2_TIMEOUT_MS='5s'.*milliseconds"):
        co2.Communicator(0, 1, transport="local", group_name=unique_group())
    # an explicit timeout_ms= wins over the environment
    co2.Communicator(0, 1, transport="local", group_name=unique_group(), timeout_ms=1000).close()


def test_closed_handles_refuse_use():
    comm = co2.Communicator(0, 1, transport="local", group_name=unique_group())
    engine = co2.Engine(comm)
    engine.close()
    engine.close()                                      # idempotent, like destroy(NULL)
    comm.close()
    with pytest.raises(ValueError, match="closed"):
        engine.step()
    with pytest.raises(ValueError, match="closed"):
        comm.abort()


# --- zero-copy round trips -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_commit_writes_rank0_values_into_the_callers_memory(kind):
    """No copy: the arrays the ranks registered are the memory the engine writes."""
    group, world, n = unique_group(), 3, 37

    def rank_main(rank):
        values = np.arange(n, dtype=np.float32) + 100 * rank
        tensor = values if kind == "numpy" else torch.from_numpy(values.copy())
        before = tensor.ctypes.data if kind == "numpy" else tensor.data_ptr()
        with local_comm(rank, world, group) as comm, co2.Engine(comm, algorithm="co2",
                                                                tau=2) as engine:
            engine.register("w", tensor)
            engine.commit()
            after = tensor.ctypes.data if kind == "numpy" else tensor.data_ptr()
            assert before == after
            got = np.array(tensor if kind == "numpy" else tensor.numpy())
            out = engine.consensus("anchor")
            return got, out

    for got, out in run_ranks(world, rank_main):
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))
        np.testing.assert_array_equal(out, np.arange(n, dtype=np.float32))


def test_allreduce_numpy_dtypes_and_torch_in_place():
    group, world = unique_group(), 3

    def rank_main(rank):
        with local_comm(rank, world, group) as comm:
            arrays = [np.full(5, rank + 1, np.float32), np.full(3, rank + 1, np.float64),
                      np.full(4, rank + 1, np.int32), np.full(2, rank + 1, np.int64)]
            for a in arrays:
                assert comm.allreduce(a) is a          # in place, the same object
            t = torch.full((2, 3), float(rank + 1))
            comm.allreduce(t, "max")
            b = np.full(6, float(rank), np.float32)
            comm.broadcast(b, root=2)
            return arrays, t, b

    for arrays, t, b in run_ranks(world, rank_main):
        for a in arrays:
            assert (a == 6).all()
        assert (t == 3).all()
        assert (b == 2).all()


def test_request_test_and_wait():
    group = unique_group()

    def rank_main(rank):
        with local_comm(rank, 2, group) as comm:
            a = np.ones(1000, np.float32)
            request = comm.allreduce_async(a)
            while not request.test():
                time.sleep(0.001)
            assert request.wait() is a
            return a

    for a in run_ranks(2, rank_main):
        assert (a == 2).all()


# --- bad input: clear exceptions, never a silent copy ------------------------------------------------

def _one_rank_engine(algorithm="sync"):
    comm = co2.Communicator(0, 1, transport="local", group_name=unique_group())
    return comm, co2.Engine(comm, algorithm=algorithm)


def test_wrong_dtype_raises():
    comm, engine = _one_rank_engine()
    with comm, engine:
        with pytest.raises(TypeError, match=r"fp64 parameters are not supported: train in "
                                            r"float32 \(model.float\(\)\)"):
            engine.register("w", np.zeros(4))
        with pytest.raises(TypeError, match="float32"):
            engine.register("w", np.zeros(4, np.int32))
        with pytest.raises((TypeError, co2.Error), match="(?i)fp64|float64|dtype"):
            engine.register("t", torch.zeros(4, dtype=torch.float64))
        with pytest.raises(TypeError, match="numpy array or a torch tensor"):
            engine.register("l", [1.0, 2.0])
        with pytest.raises(TypeError, match="bool"):
            comm.allreduce(np.zeros(3, bool))


def test_non_contiguous_and_read_only_raise():
    comm, engine = _one_rank_engine()
    with comm, engine:
        matrix = np.zeros((4, 4), np.float32)
        with pytest.raises(TypeError, match="not C-contiguous"):
            engine.register("col", matrix[:, 1])
        with pytest.raises(TypeError, match="not C-contiguous"):
            engine.register("ft", np.asfortranarray(matrix))
        with pytest.raises(TypeError, match="not contiguous"):
            engine.register("tt", torch.zeros(3, 4).t())
        frozen = np.zeros(4, np.float32)
        frozen.setflags(write=False)
        with pytest.raises(TypeError, match="read-only"):
            engine.register("ro", frozen)
        with pytest.raises(ValueError, match="empty"):
            engine.register("empty", np.zeros(0, np.float32))


def test_too_short_and_wrong_count_arrays_raise_without_writing():
    comm, engine = _one_rank_engine()
    with comm, engine:
        w, b = np.ones(10, np.float32), np.ones(3, np.float32)
        engine.register("w", w)
        engine.register("b", b)
        engine.commit()
        short = np.full(9, 7.0, np.float32)
        with pytest.raises(ValueError, match="expected 10 elements, got 9"):
            engine.reduce_gradients([short, np.ones(3, np.float32)])
        with pytest.raises(ValueError, match="expected 2 gradients"):
            engine.reduce_gradients([np.ones(10, np.float32)])
        with pytest.raises(ValueError, match="expected 3 elements"):
            engine.reduce_gradients([np.ones(10, np.float32), torch.ones(4)])
        with pytest.raises(TypeError, match="not C-contiguous"):
            engine.reduce_gradients([np.ones(20, np.float32)[::2], np.ones(3, np.float32)])
        out = np.full(12, -1.0, np.float32)                  # one too short
        with pytest.raises(co2.InvalidArgumentError):
            engine.consensus("anchor", out)
        assert (out == -1.0).all()                           # nothing written
        engine.reduce_gradients([np.full(10, 2.0, np.float32), None])   # one rank: unchanged
        assert engine.consensus().shape == (13,)


# --- the GIL ----------------------------------------------------------------------------------------

def test_blocking_wait_releases_the_gil():
    """Rank 0 blocks in a collective while rank 1 still has Python work to do before joining.
    If the wait held the GIL, rank 1 could not run and rank 0's wait would time out."""
    group = unique_group()
    joined = threading.Event()

    def rank_main(rank):
        with local_comm(rank, 2, group) as comm:
            a = np.ones(8, np.float32)
            if rank == 0:
                comm.allreduce_async(a).wait(timeout_ms=60000)
                assert joined.is_set()
            else:
                total = sum(i * i for i in range(200000))   # Python code: needs the GIL
                assert total > 0
                joined.set()
                comm.allreduce(a)
            return a

    for a in run_ranks(2, rank_main):
        assert (a == 2).all()


def test_abort_from_another_thread_wakes_a_blocked_rank():
    group = unique_group()
    comms, blocked = {}, threading.Event()

    def rank_main(rank):
        comm = local_comm(rank, 2, group)
        comms[rank] = comm
        if rank == 1:
            blocked.wait(60)
            time.sleep(0.1)
            comm.abort()                                   # rank 0 is inside a blocking call
            return None
        blocked.set()
        with pytest.raises(co2.AbortedError) as info:
            comm.allreduce(np.ones(4, np.float32))         # rank 1 never joins
        return info.value

    results = run_ranks(2, rank_main)
    assert isinstance(results[0], co2.PeerError)
    for comm in comms.values():
        comm.close()


# --- unique ids ---------------------------------------------------------------------------------------

def test_unique_id_names_a_group():
    uid = co2.unique_id()
    assert isinstance(uid, bytes) and len(uid) == capi.CO2_UNIQUE_ID_BYTES
    assert co2.unique_id() != uid

    def rank_main(rank):
        with co2.Communicator(rank, 2, transport="local", unique_id=uid) as comm:
            return comm.allreduce(np.full(3, rank + 1.0, np.float32))

    for a in run_ranks(2, rank_main):
        assert (a == 3).all()
    with pytest.raises(ValueError, match="128 bytes"):
        co2.Communicator(0, 1, transport="local", unique_id=b"short")
    with pytest.raises(TypeError, match="bytes"):
        co2.Communicator(0, 1, transport="local", unique_id="text")


def test_split_forms_nodes_and_lanes():
    def rank_main(rank):
        with co2.Communicator(rank, 4, transport="local", unique_id=uid) as world:
            node, local = divmod(rank, 2)
            with world.split(node, local) as nodes, world.split(local, key=node) as lanes:
                none = world.split(None)
                return (nodes.rank, nodes.world_size, lanes.rank, lanes.world_size, none,
                        nodes.allreduce(np.array([rank], np.int64))[0],
                        lanes.allreduce(np.array([rank], np.int64))[0])

    uid = co2.unique_id()
    results = run_ranks(4, rank_main)
    for rank, (node_rank, nodes, lane_rank, lanes, none, node_sum, lane_sum) in enumerate(results):
        node, local = divmod(rank, 2)
        assert (node_rank, nodes, lane_rank, lanes, none) == (local, 2, node, 2, None)
        assert node_sum == (1 if node == 0 else 5) and lane_sum == (2 if local == 0 else 4)
    with co2.Communicator(0, 1, transport="local", unique_id=co2.unique_id()) as alone:
        with pytest.raises(ValueError, match="color"):
            alone.split(-3)


def test_split_nodes_from_node_ids():
    def rank_main(rank):
        # The node id given at creation is split_nodes' default: ranks 0, 2 on one node, 1, 3 on
        # the other (the node of rank 0 is node 0).
        with co2.Communicator(rank, 4, transport="local", unique_id=uid, node_id=10 + rank % 2) as world:
            intra, inter = world.split_nodes()
            with intra, inter:
                out = (intra.rank, intra.world_size, inter.rank, inter.world_size,
                       intra.allreduce(np.array([rank], np.int64))[0],
                       inter.allreduce(np.array([rank], np.int64))[0])
            try:
                world.split_nodes(node_id=0 if rank < 3 else 1)
            except co2.InvalidArgumentError as error:
                return out + (str(error),)
            return out + ("no error",)

    uid = co2.unique_id()
    for rank, result in enumerate(run_ranks(4, rank_main)):
        node, local = rank % 2, rank // 2
        assert result[:4] == (local, 2, node, 2)
        assert result[4] == (0 + 2 if node == 0 else 1 + 3)
        assert result[5] == (0 + 1 if local == 0 else 2 + 3)
        assert "has 3 ranks" in result[6] and "has 1 rank" in result[6]


# --- checkpoints ---------------------------------------------------------------------------------------

def _trained_engines(group, world, steps=5):
    """Engines after a few co2 steps; returns (comm, engine, w) per rank via the callback."""

    def setup(rank):
        comm = local_comm(rank, world, group)
        engine = co2.Engine(comm, algorithm="co2", tau=2)
        w = np.linspace(0, 1, 50, dtype=np.float32) + rank
        engine.register("w", w)
        engine.commit()
        for step in range(steps):
            w -= 0.01 * (rank + 1) * (step + 1)
            engine.step()
        return comm, engine, w
    return setup


def test_checkpoint_bytes_round_trip_and_bad_blobs():
    group, world = unique_group(), 2
    setup = _trained_engines(group, world)

    def rank_main(rank):
        comm, engine, w = setup(rank)
        blob = engine.save(keep=(rank == 0))
        assert (blob is None) == (rank != 0)
        size = engine.state_size()
        anchor = engine.consensus()
        engine.close()
        comm.close()
        return blob, size, anchor

    results = run_ranks(world, rank_main)
    blob, size, anchor = results[0]
    assert isinstance(blob, bytes) and len(blob) == size

    with co2.Communicator(0, 1, transport="local", group_name=unique_group()) as comm, \
            co2.Engine(comm, algorithm="co2", tau=2) as engine:
        w = np.zeros(50, np.float32)
        engine.register("w", w)
        engine.commit()
        engine.load(bytearray(blob))                       # any bytes-like object
        np.testing.assert_array_equal(engine.consensus(), anchor)
        np.testing.assert_array_equal(w, anchor)            # parameters = restored anchor
        # A co2.CheckpointCorruptError (a ValueError too) that says what to do.
        with pytest.raises(co2.CheckpointCorruptError, match="ends before the saved state does.*"
                                                             "load an earlier checkpoint"):
            engine.load(blob[:-1])
        corrupt = bytearray(blob)
        corrupt[len(blob) // 2] ^= 0xFF
        with pytest.raises(co2.CheckpointCorruptError):
            engine.load(bytes(corrupt))
        np.testing.assert_array_equal(engine.consensus(), anchor)   # transactional
        with pytest.raises(ValueError, match="follow the saved state"):
            engine.load(blob + b"\0")


def test_a_sharded_engine_saves_its_shard_and_exports_the_portable_state():
    """shard_outer_state: save() is this rank's shard (smaller than the portable state), which
    every rank loads back at once; save(portable=True) / save_to(..., portable=True) is one
    state that a replicated engine loads, and a shard is refused there naming the way out."""
    group, world = unique_group(), 2

    def rank_main(rank):
        comm = local_comm(rank, world, group)
        # eager off: the parameters restored are then the anchor on every rank (with it, each
        # rank's own round start, which a replicated engine at another W does not restore)
        engine = co2.Engine(comm, algorithm="co2", tau=2, outer_momentum=0.5, eager=False,
                            shard_outer_state=True)
        w = np.linspace(0, 1, 1000, dtype=np.float32) + rank
        engine.register("w", w)
        engine.commit()
        for step in range(5):
            w -= 0.01 * (rank + 1) * (step + 1)
            engine.step()
        shard = engine.save()
        assert len(shard) == engine.state_size()
        portable = engine.save(keep=(rank == 0), portable=True)
        stream = io.BytesIO()
        engine.save_to(stream if rank == 0 else None, portable=True)
        anchor = engine.consensus()
        engine.load(shard)                                  # every rank its own, at once
        np.testing.assert_array_equal(engine.consensus(), anchor)
        restored = w.copy()                                 # parameters = the restored anchor
        engine.close()
        comm.close()
        return shard, portable, stream.getvalue(), restored

    results = run_ranks(world, rank_main)
    shard, portable, streamed, restored = results[0]
    assert streamed == portable
    assert len(shard) < len(portable) * 0.75                # the shard: about half the state
    with co2.Communicator(0, 1, transport="local", group_name=unique_group()) as comm, \
            co2.Engine(comm, algorithm="co2", tau=2, outer_momentum=0.5, eager=False) as engine:
        w = np.zeros(1000, np.float32)
        engine.register("w", w)
        engine.commit()
        with pytest.raises(co2.CheckpointMismatchError, match="co2_engine_save_portable"):
            engine.load(shard)
        engine.load(portable)
        np.testing.assert_array_equal(w, restored)


def test_checkpoint_streams_through_file_objects():
    group = unique_group()
    setup = _trained_engines(group, 1)
    comm, engine, w = setup(0)
    with comm, engine:
        stream = io.BytesIO()
        engine.save_to(stream)
        assert stream.getvalue() == engine.save()
        stream.seek(0)
        engine.load_from(stream)

        class Broken(io.RawIOBase):
            def write(self, data):
                raise OSError("disk full")

        with pytest.raises(OSError, match="disk full"):        # the file's own error
            engine.save_to(Broken())
        with pytest.raises(co2.CheckpointCorruptError, match="ends before the saved state does"):
            engine.load_from(io.BytesIO(stream.getvalue()[:10]))


def test_stats_is_a_dict():
    group = unique_group()
    comm, engine, w = _trained_engines(group, 1, steps=4)(0)
    with comm, engine:
        stats = engine.stats()
        assert stats["steps"] == 4 and stats["rounds"] == 2 and stats["world_size"] == 1
        assert {"boundary_wait_ns", "collective_ns", "bytes_reduced",
                "resolved_outer_momentum", "advised_tau"} <= stats.keys()
        # 1.1: the overlap read directly, and this rank's own advisor inputs
        assert {"last_collective_ns", "last_round_ns", "hidden_fraction", "last_hidden_fraction",
                "rank_step_time_ns", "rank_allreduce_time_ns"} <= stats.keys()
        assert 0.0 <= stats["hidden_fraction"] <= 1.0 and stats["last_round_ns"] > 0

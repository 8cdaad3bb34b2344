"""The five environment mistakes newcomers make most, each with real processes where it takes
them: what co2 raises must name the cause and the fix (bindings/python/README.md, "When
something is missing or mis-set").

1. MASTER_PORT held by another program: rank 0 cannot serve the store, the other ranks meet a
   stranger there.
2. torchrun's agent holds MASTER_PORT: co2.Communicator() goes through torch's store by itself.
3. UCX that cannot start (UCX_TLS / UCX_NET_DEVICES naming what this host lacks), or a build
   without UCX.
4. CUDA tensors where libco2 has no CUDA or the machine no usable GPU.
5. An old checkpoint: saved from a model changed since, by another algorithm, or by a newer co2.
"""
import json
import os
import re
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest
from ports import free_port  # tests/ports.py (conftest.py puts tests/ on the path)
import torch

import co2
import co2.torch
from co2 import capi

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "environment_errors_worker.py")
# A process that runs longer than this has hung: killed, and the test fails.
PROCESS_TIMEOUT_S = 180
# The ranks' no-progress timeout where a test waits for one to expire (a stranger that never
# answers the store's hello): short, and the wait is certain to expire, never a race.
SHORT_TIMEOUT_MS = 3000


def rank_env(rank, world, port, **extra):
    """A launcher's environment for `rank`; port None: no MASTER_PORT."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CO2_MASTER_PORT", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "UCX_TLS",
                        "UCX_NET_DEVICES")}
    env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                "OMP_NUM_THREADS": "1", "CO2_TIMEOUT_MS": str(SHORT_TIMEOUT_MS)})
    if port is not None:
        env["MASTER_PORT"] = str(port)
    env.update(extra)
    return env


def run_ranks(world, port, **extra):
    """Starts `world` worker processes; returns each rank's JSON line."""
    processes = [subprocess.Popen([sys.executable, WORKER], env=rank_env(r, world, port, **extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in range(world)]
    results = []
    for rank, process in enumerate(processes):
        try:
            out, err = process.communicate(timeout=PROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            pytest.fail(f"rank {rank} hung")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"rank {rank} printed no result (exit {process.returncode}): {err}"
        results.append(json.loads(lines[-1]))
    return results


def one_sentence_fix(message, *parts):
    """The message names every part (the cause and the fix)."""
    for part in parts:
        assert part in message, f"{part!r} not in: {message}"


# --- 1. a port in use ---------------------------------------------------------------------

def test_master_port_held_by_another_program():
    with socket.socket() as holder:        # listens, never answers: any other program
        holder.bind(("127.0.0.1", 0))
        holder.listen(16)
        port = holder.getsockname()[1]
        rank0, rank1 = run_ranks(2, port)
    assert rank0.get("error") == "RendezvousError", rank0
    one_sentence_fix(rank0["message"], f"MASTER_PORT={port} is already in use",
                     "set MASTER_PORT", "to a free port on every rank")
    # Rank 1 reached the holder, which never answers like a co2 store.
    assert rank1.get("error") == "RendezvousError", rank1
    one_sentence_fix(rank1["message"], f"127.0.0.1:{port}", "does not answer as a co2 store",
                     "another program holds the port", "CO2_MASTER_PORT")


def test_a_rank_that_never_starts_is_named():
    [rank0] = run_ranks(1, free_port(), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    assert rank0.get("error") == "RendezvousError", rank0
    one_sentence_fix(rank0["message"], "rank 1 never arrived", "start all 2 ranks of WORLD_SIZE",
                     "co2run -n 2")


def test_ranks_set_by_hand_without_master_port_are_told_what_is_missing():
    results = run_ranks(2, None)
    for result in results:
        assert result.get("error") == "InvalidArgumentError", result
        one_sentence_fix(result["message"], "needs MASTER_ADDR and MASTER_PORT",
                         "as co2run and torchrun set them")


# --- 2. torchrun's agent holds MASTER_PORT ---------------------------------------------------

def test_communicator_under_torchrun_meets_through_torchs_store():
    env = {k: v for k, v in os.environ.items()
           if k not in ("CO2_MASTER_PORT", "RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR")}
    env.update({"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "OMP_NUM_THREADS": "1"})
    # "--redirects 2 --tee 2": torch 1.13 under Python 3.11 cannot parse the default "0".
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), "--redirects", "2", "--tee", "2",
                          WORKER], env=env, capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S)
    # The ranks share torchrun's stdout: their lines may interleave.
    results = [json.loads(found) for found in re.findall(r"\{[^{}]*\}", run.stdout)]
    assert run.returncode == 0, run.stdout + run.stderr
    assert sorted(r["rank"] for r in results) == [0, 1], run.stdout
    assert all(r["sum"] == 2.0 for r in results), run.stdout


def test_port_in_use_under_torchrun_names_torchruns_agent():
    # What rank 0 says when the agent's port is co2's after all: co2_comm_create in C, or a
    # Python rank given rank and world explicitly. TORCHELASTIC_RUN_ID is what torchrun sets.
    with socket.socket() as agent:
        agent.bind(("127.0.0.1", 0))
        agent.listen(16)
        port = agent.getsockname()[1]
        env = rank_env(0, 2, port, TORCHELASTIC_RUN_ID="test")
        code = ("import co2, json, os\n"
                "try:\n"
                "    co2.Communicator(0, 2)\n"
                "except co2.Error as e:\n"
                "    print(json.dumps({'error': type(e).__name__, 'message': str(e)}))\n")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=PROCESS_TIMEOUT_S)
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["error"] == "RendezvousError", result
    one_sentence_fix(result["message"], f"MASTER_PORT={port} is taken by torchrun's agent",
                     "CO2_MASTER_PORT", "co2.Communicator() in Python does this by itself")


# --- 3. UCX missing or mis-set --------------------------------------------------------------

def test_ucx_that_cannot_start_says_which_setting():
    results = run_ranks(2, free_port(), UCX_TLS="tcp", UCX_NET_DEVICES="nosuchnic0")
    for rank, result in enumerate(results):
        assert "error" in result, result
        if "built without UCX" in result["message"]:     # a build without UCX says so
            one_sentence_fix(result["message"], "install libucx-dev", "pip install .")
            continue
        assert result["error"] == "RendezvousError", result
        one_sentence_fix(result["message"], "UCX cannot start here",
                         "UCX_NET_DEVICES=nosuchnic0", "ucx_info -d")
        assert "this build has no UCX" not in result["message"]


# --- 4. CUDA tensors without CUDA ------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="a usable GPU: CUDA tensors work here")
def test_cuda_tensors_without_cuda_say_what_to_do():
    # What co2 hands the C API for a CUDA tensor (co2/_buffers.py: TensorMemory).
    with co2.Communicator(0, 1) as comm, co2.Engine(comm) as engine:
        with pytest.raises(co2.UnsupportedError) as raised:
            capi.engine_register_address(engine.handle, "w", 1 << 20, 16, capi.CO2_DTYPE_FP32,
                                         capi.CO2_DEVICE_CUDA, 0, capi.CO2_ROLE_PARAMETER)
    message = str(raised.value)
    one_sentence_fix(message, "keep the parameters in host memory (model.cpu() in torch)")
    assert ("this one was built without it" in message or
            "cudaGetDeviceCount found none" in message), message


# --- 5. an old checkpoint ------------------------------------------------------------------

def _trainer(model, algorithm="co2"):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, tau=2)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return trainer


def test_checkpoint_of_a_changed_model_names_the_change(tmp_path):
    torch.manual_seed(0)
    old = _trainer(torch.nn.Sequential(torch.nn.Linear(4, 3)))
    state = old.state_dict()
    old.save_portable(str(tmp_path / "old.pt"))
    old.finalize()
    old.close()
    changed = _trainer(torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Linear(5, 2)))
    for load in (lambda: changed.load_state_dict(state),
                 lambda: changed.load_portable(str(tmp_path / "old.pt"))):
        with pytest.raises(co2.CheckpointMismatchError) as raised:
            load()
        one_sentence_fix(str(raised.value), "saved from another model",
                         "not in the checkpoint: 1.bias, 1.weight", "resized: 0.bias [3] -> [5]",
                         "strict=False")
    changed.finalize()
    changed.close()


def test_checkpoint_of_another_algorithm_names_both():
    torch.manual_seed(0)
    old = _trainer(torch.nn.Linear(4, 3), "diloco")
    state = old.state_dict()
    old.finalize()
    old.close()
    new = _trainer(torch.nn.Linear(4, 3), "co2")
    with pytest.raises(co2.CheckpointMismatchError) as raised:
        new.load_state_dict(state)
    one_sentence_fix(str(raised.value), "saved by algorithm 'diloco'", "runs 'co2'",
                     "algorithm='diloco'")
    # The engine's own check says the same for C and numpy users.
    with pytest.raises(co2.CheckpointMismatchError) as raised:
        new.engine.load(state["engine"])
    one_sentence_fix(str(raised.value), "saved by algorithm diloco", "runs co2",
                     "with the checkpoint's algorithm")
    new.finalize()
    new.close()


def test_engine_checkpoint_of_another_layout_or_a_newer_co2():
    def engine(comm, sizes):
        e = co2.Engine(comm, "co2")
        for i, n in enumerate(sizes):
            e.register(f"w{i}", np.zeros(n, np.float32))
        e.commit()
        return e

    with co2.Communicator(0, 1) as comm:
        with engine(comm, [8]) as saved:
            blob = saved.save()
        with engine(comm, [8, 3]) as grown:
            with pytest.raises(co2.CheckpointMismatchError) as raised:
                grown.load(blob)
            one_sentence_fix(str(raised.value), "another parameter layout",
                             "it holds 1 tensors, this engine 2", "the model changed since the save",
                             "resume with the model it was saved from")
        with engine(comm, [8]) as same:
            newer = blob[:8] + struct.pack("<I", 99) + blob[12:]   # the format version field
            with pytest.raises(co2.CheckpointMismatchError) as raised:
                same.load(newer)
            one_sentence_fix(str(raised.value), "format version 99",
                             "written by a newer co2", "load it with that version")


# --- and before any of these: a Python without numpy or torch --------------------------------

@pytest.mark.parametrize("hidden, imported, parts", [
    ("numpy", "co2", ["co2 needs numpy", "python3-numpy", "/usr/bin/python3"]),
    ("torch", "co2.torch", ["co2.torch needs PyTorch", "python3-torch",
                            "the co2 package itself works without torch"]),
])
def test_a_python_without_numpy_or_torch_is_told_which(hidden, imported, parts):
    # None in sys.modules is Python's own "this module cannot be imported".
    code = f"import sys; sys.modules[{hidden!r}] = None; import {imported}"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError"), run.stderr
    one_sentence_fix(last, *parts)


def test_a_wire_codec_the_cpu_cannot_run_fails_at_the_communicator():
    """CO2_WIRE_CODEC naming no instruction set fails where the group forms, with the choices,
    not later on the progress thread; a valid choice trains."""
    code = ("import co2\n"
            "try:\n"
            "    co2.Communicator(rank=0, world_size=1)\n"
            "    print('ok')\n"
            "except co2.InvalidArgumentError as e:\n"
            "    print('invalid:', e)\n")
    env = {k: v for k, v in os.environ.items() if k != "CO2_WIRE_CODEC"}
    bad = subprocess.run([sys.executable, "-c", code], env={**env, "CO2_WIRE_CODEC": "avx3"},
                         capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert bad.returncode == 0, bad.stderr
    assert bad.stdout.startswith("invalid:"), bad.stdout
    assert "CO2_WIRE_CODEC=avx3" in bad.stdout and "generic, avx2 or avx512" in bad.stdout, bad.stdout
    good = subprocess.run([sys.executable, "-c", code], env={**env, "CO2_WIRE_CODEC": "generic"},
                          capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert good.stdout.strip() == "ok", good.stdout + good.stderr

"""bf16 / fp16 parameters with co2's fp32 outer state from Python (docs/capi.md, "Parameter
dtypes"): the Engine takes 16-bit torch tensors and numpy float16 arrays, co2.torch adopts a
flat storage in the parameters' dtype, fp64 and mixed-dtype flats are refused with what to do,
and a bf16 model trains on 2 real processes."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import co2
import co2.torch
from conftest import local_comm, run_ranks, unique_group
from test_multiprocess import free_port, launch_env, multiprocess_unavailable, wait_all

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "mixed_precision_worker.py")
FP64_ADVICE = r"fp64 parameters are not supported: train in float32 \(model.float\(\)\)"


def small_model(dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2)).to(dtype)


def test_engine_takes_16_bit_parameters_and_gradients():
    """bf16 torch tensors and numpy float16 arrays as parameters; gradients of the parameter's
    dtype are averaged (in fp32, rounded once); another dtype is refused by name."""
    world = 2
    group = unique_group()

    def rank_main(rank):
        w = torch.full((7,), 1.0 + rank, dtype=torch.bfloat16)
        v = np.full(5, 2.0 + rank, np.float16)
        with local_comm(rank, world, group) as comm, co2.Engine(comm, "sync") as engine:
            engine.register("w", w)
            engine.register("v", v)
            engine.commit()
            assert torch.all(w == 1.0) and np.all(v == 2.0)   # rank 0's values
            gw = torch.full((7,), 0.25 * (rank + 1), dtype=torch.bfloat16)
            gv = np.full(5, 1.0 + rank, np.float16)
            with pytest.raises(TypeError, match=r"expected bfloat16 \(the parameter's dtype\)"):
                engine.reduce_gradients([gw.float(), gv])
            engine.reduce_gradients([gw, gv])
            return gw.clone(), gv.copy()

    for gw, gv in run_ranks(world, rank_main):
        assert gw.dtype == torch.bfloat16 and torch.all(gw == 0.375)
        assert gv.dtype == np.float16 and np.all(gv == 1.5)


def test_float16_arrays_are_checked_like_float32_ones():
    comm = co2.Communicator(0, 1, transport="local", group_name=unique_group())
    with comm, co2.Engine(comm, "co2") as engine:
        with pytest.raises(TypeError, match="not C-contiguous"):
            engine.register("strided", np.zeros((4, 4), np.float16)[:, 1])
        frozen = np.zeros(4, np.float16)
        frozen.flags.writeable = False
        with pytest.raises(TypeError, match="read-only"):
            engine.register("frozen", frozen)
        with pytest.raises(TypeError, match=FP64_ADVICE):
            engine.register("wide", np.zeros(4))
        with pytest.raises(TypeError, match=r"int32 is not a parameter dtype \(float32, "
                                            r"bfloat16, float16\)"):
            engine.register("int", np.zeros(4, np.int32))


def test_fp64_model_is_refused_with_what_to_do():
    for flat in (True, False):
        model = small_model(torch.float64)
        with local_comm(0, 1, unique_group()) as comm:
            with pytest.raises(TypeError, match=FP64_ADVICE):
                co2.torch.distribute(model, algorithm="co2", comm=comm, flat=flat)


def test_bf16_model_gets_a_bf16_flat():
    model = small_model(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with local_comm(0, 1, unique_group()) as comm, \
            co2.torch.distribute(model, optimizer, algorithm="co2", comm=comm, tau=2) as trainer:
        assert trainer.flat.dtype == torch.bfloat16
        start = trainer.flat.data_ptr()
        offsets = [p.data_ptr() - start for p in model.parameters()]
        assert offsets == sorted(offsets) and offsets[0] == 0
        assert offsets[1] == 2 * model[0].weight.numel()        # 2-byte elements
        for _ in range(4):
            optimizer.zero_grad()
            F.cross_entropy(model(torch.ones(3, 4, dtype=torch.bfloat16)).float(),
                            torch.tensor([0, 1, 0])).backward()
            optimizer.step()
        trainer.finalize()
        anchor = torch.from_numpy(trainer.engine.consensus())
        assert torch.equal(trainer.flat, anchor.to(torch.bfloat16))  # parameters = rounded anchor
        assert trainer.engine.stats()["outer_updates"] >= 1


def test_mixed_dtypes_need_flat_false():
    def mixed():
        model = small_model()
        model[2].to(torch.bfloat16)
        return model

    with local_comm(0, 1, unique_group()) as comm:
        with pytest.raises(TypeError, match=r"flat storage holds one dtype but the module has "
                                            r"torch.bfloat16, torch.float32.*flat=False"):
            co2.torch.distribute(mixed(), algorithm="co2", comm=comm)
    model = mixed()
    with local_comm(0, 1, unique_group()) as comm, \
            co2.torch.distribute(model, algorithm="co2", comm=comm, flat=False, tau=1) as trainer:
        before = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5)
        trainer.step()
        trainer.finalize()
        for p, b in zip(model.parameters(), before):
            assert p.dtype == b.dtype
            assert torch.equal(p, (b.float() + 0.5).to(p.dtype))   # outer lr 1: the local model


@pytest.mark.skipif(multiprocess_unavailable() is not None,
                    reason=str(multiprocess_unavailable()))
@pytest.mark.parametrize("algorithm,dtype,flat", [("co2", "bfloat16", "1"),
                                                  ("sync", "bfloat16", "0")])
def test_16_bit_model_trains_on_2_processes(algorithm, dtype, flat, tmp_path):
    world = 2
    port = free_port()
    processes = [subprocess.Popen([sys.executable, WORKER, algorithm, dtype, flat, str(tmp_path)],
                                  env=launch_env(r, world, port), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for r in range(world)]
    wait_all(processes, f"{dtype} {algorithm}")
    results = []
    for r in range(world):
        with open(tmp_path / f"result{r}.json") as f:
            results.append(json.load(f))
    params = [np.load(tmp_path / f"params{r}.npy") for r in range(world)]
    np.testing.assert_array_equal(params[1], params[0])       # one model on every rank
    for result in results:
        assert result["after"] < 0.5 * result["before"], result
        assert result["flat_dtype"] == (f"torch.{dtype}" if flat == "1" else None)
        if algorithm == "co2":
            assert result["outer_updates"] >= 20, result

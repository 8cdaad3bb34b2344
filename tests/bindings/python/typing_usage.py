"""Type-checked by test_typing.py, never run: what mypy must accept and what it must report when
it reads the installed co2 package. A line ending in `# error: [code]` must get exactly that
mypy error code; every other line must get none. Were the package's types not seen (no py.typed,
a stub that is not shipped, an annotation that says Any), the misuses below would pass silently.
"""
from typing import Any, Optional, assert_type

import numpy as np
import numpy.typing as npt
import torch

import co2
import co2.torch
from co2 import capi


def plain_api(weights: npt.NDArray[np.float32]) -> None:
    comm = co2.Communicator(0, 1, transport="local", group_name="typing")
    assert_type(comm.rank, int)
    assert_type(comm.allreduce(weights, "avg"), npt.NDArray[np.float32])
    assert_type(comm.broadcast_async(torch.zeros(4)).wait(), torch.Tensor)
    assert_type(co2.unique_id(), bytes)
    assert_type(co2.rank_and_world(), Optional[tuple[int, int]])
    engine = co2.Engine(comm, "co2", tau=4, outer_lr=0.7, outer_momentum="auto", eager="auto",
                        nesterov=True, wire_format="bf16", clip="norm", clip_threshold=1.0)
    engine.register("w", weights)
    engine.commit()
    assert_type(engine.step(), bool)
    assert_type(engine.stats(), co2.EngineStats)
    assert_type(engine.stats()["advised_tau"], int)
    assert_type(engine.stats()["hidden_fraction"], float)
    assert_type(engine.save(), Optional[bytes])
    assert_type(engine.get_param("tau"), float)
    co2.Engine(comm, **co2.engine_defaults())               # the C defaults, passed back

    co2.Engine(comm, tau="12")                              # error: [arg-type]
    co2.Engine(comm, taux=12)                               # error: [call-arg]
    co2.Engine(comm, "co3")                                 # error: [arg-type]
    co2.Engine(comm, wire_format="fp8")                     # error: [arg-type]
    co2.Engine(comm, outer_momentum="fast")                 # error: [arg-type]
    engine.stats()["stepz"]                                 # error: [typeddict-item]
    engine.set_param("outer_lrr", 0.5)                      # error: [arg-type]
    comm.allreduce(weights, "mean")                         # error: [arg-type]
    comm.allreduce([1.0, 2.0])                              # error: [type-var]
    co2.Communicator(rank="0", world_size=1)                # error: [arg-type]
    engine.register("b", weights, role="frozen")            # error: [arg-type]


def low_level(weights: npt.NDArray[np.float32]) -> None:
    config = capi.comm_config()
    config.rank, config.world_size = 0, 1
    comm = capi.comm_create(config, "typing")
    engine = capi.engine_create(comm, capi.engine_config())
    assert_type(capi.engine_step(engine, None), int)
    assert_type(capi.engine_get_stats(engine).steps, int)
    assert_type(capi.get_version(), list[int])
    capi.engine_step(comm, None)                            # error: [arg-type]
    capi.comm_rank(engine)                                  # error: [arg-type]
    capi.engine_register_array(engine, "w", weights)        # error: [call-arg]
    config.transport = "ucx"                                # error: [assignment]


def with_torch(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    trainer = co2.torch.distribute(model, optimizer, algorithm="diloco", tau=8, outer_lr=0.7,
                                   buffers={"bn.running_mean": "average"}, bucket_mb=25,
                                   hierarchy="nodes", intra_node_average="framework")
    assert_type(trainer, co2.torch.Distributed)
    assert_type(trainer.rank, int)
    assert_type(trainer.finalize(), None)
    with trainer.consensus_weights() as evaluated:
        assert_type(evaluated, torch.nn.Module)
    with trainer.no_sync(), trainer.join():
        pass
    assert_type(co2.torch.load_portable("model.pt")["model"], Any)
    options: co2.torch.DistributeOptions = {"tau": 2, "intra_node_average": "co2"}
    co2.torch.distribute(model, **options)

    co2.torch.distribute(model, tau=2.5)                    # error: [arg-type]
    co2.torch.distribute(model, intra_node_average="ddp")   # error: [arg-type]
    co2.torch.distribute(model, apply_step="arrival")
    co2.torch.distribute(model, apply_step=3)
    co2.torch.distribute(model, apply_step="soon")          # error: [arg-type]
    assert_type(trainer.stats()["arrival_updates"], int)
    co2.torch.distribute(model, buffers={"bn": "sum"})      # error: [dict-item]
    co2.torch.distribute(optimizer)                         # error: [arg-type]
    trainer.finalize(True)                                  # error: [call-arg]
    bad: co2.EngineOptions = {"tau": 2, "penalty": "huge"}  # error: [typeddict-item]

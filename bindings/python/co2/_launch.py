"""Rank and world size from the launcher's environment.

torchrun and co2run set RANK / WORLD_SIZE (and LOCAL_RANK, MASTER_ADDR, MASTER_PORT); mpirun
sets OMPI_COMM_WORLD_*; srun sets SLURM_*. The library reads the store's address itself
(MASTER_ADDR; CO2_MASTER_PORT, else MASTER_PORT); this module only needs rank and size, the same
families in the same order as rendezvous/launch_environment.cpp.
"""
from __future__ import annotations

import os
from typing import Iterator, Mapping, Optional

def _families(environ: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(rank variable, size variable) pairs in rendezvous/launch_environment's order."""
    yield "RANK", "WORLD_SIZE"                                    # torchrun, co2run
    yield "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"          # mpirun
    if "SLURM_STEP_ID" in environ:                                # srun, inside a job step
        yield "SLURM_PROCID", ("SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in environ
                               else "SLURM_NTASKS")


def rank_and_world(environ: Optional[Mapping[str, str]] = None) -> Optional[tuple[int, int]]:
    """(rank, world_size) from the environment, or None when no launcher set them."""
    environ = os.environ if environ is None else environ
    for rank_name, size_name in _families(environ):
        if rank_name in environ and size_name in environ:
            try:
                rank, world = int(environ[rank_name]), int(environ[size_name])
            except ValueError:
                raise ValueError(f"{rank_name}={environ[rank_name]!r} and "
                                 f"{size_name}={environ[size_name]!r} must be integers") from None
            if world < 1 or not 0 <= rank < world:
                raise ValueError(f"{rank_name}={rank} is outside [0, {size_name}={world})")
            return rank, world
    return None


def under_torchrun(environ: Optional[Mapping[str, str]] = None) -> bool:
    """torchrun's agent holds MASTER_PORT for its own store: co2 must not bind it."""
    environ = os.environ if environ is None else environ
    return "TORCHELASTIC_RUN_ID" in environ

"""One rank of test_mixed_precision.py's multi-process test, launched as a real process with the
launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    mixed_precision_worker.py ALGORITHM DTYPE FLAT OUT_DIR    (DTYPE: a torch dtype name,
                                                              FLAT: 1 | 0)

Trains a small classifier whose parameters are DTYPE with co2.torch (the engine keeps its outer
state in fp32) and writes the loss before and after and the final parameters."""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import co2
import co2.torch

STEPS = 96
TAU = 4


def batch(step, rank, dtype, size=32):
    """A fixed teacher (a linear map) labels random points; each rank sees its own points."""
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(6, 3, generator=teacher)
    g = torch.Generator().manual_seed(100000 * rank + step)
    x = torch.randn(size, 6, generator=g)
    return x.to(dtype), (x @ w).argmax(dim=1)


def loss_on(model, dtype):
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).float(), y) for x, y in
                  (batch(10 ** 6 + i, 99, dtype, 256) for i in range(2))]
    return float(sum(losses) / len(losses))


def main(algorithm, dtype_name, flat, out):
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    comm = co2.Communicator.from_env()
    rank = comm.rank
    torch.manual_seed(rank)                      # commit gives every rank rank 0's weights
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                                torch.nn.Linear(16, 3)).to(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5)
    trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm,
                                   flat=flat == "1", tau=TAU)
    before = loss_on(model, dtype)
    for step in range(STEPS):
        optimizer.zero_grad()
        x, y = batch(step, rank, dtype)
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
    trainer.finalize()
    after = loss_on(model, dtype)
    params = [p.detach() for p in model.parameters()]
    assert all(p.dtype == dtype for p in params), [p.dtype for p in params]
    flat_params = torch.cat([p.float().flatten() for p in params]).numpy()
    np.save(os.path.join(out, f"params{rank}.npy"), flat_params)
    with open(os.path.join(out, f"result{rank}.json"), "w") as f:
        json.dump({"before": before, "after": after,
                   "flat_dtype": None if trainer.flat is None else str(trainer.flat.dtype),
                   "outer_updates": trainer.engine.stats()["outer_updates"]}, f)
    trainer.close()
    comm.close()


if __name__ == "__main__":
    main(*sys.argv[1:])

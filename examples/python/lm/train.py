#!/usr/bin/python3
"""co2 example: a byte-level decoder-only transformer (model.py) trained on the Python
documentation (corpus.py, Debian's python3-doc), data-parallel with co2 or torch DDP.

    co2run --nproc-per-node 2 /usr/bin/python3 -u examples/python/lm/train.py \
        --algorithm co2 --tau 12 --steps 480
    co2run --nproc-per-node 2 /usr/bin/python3 -u examples/python/lm/train.py --algorithm ddp

The co2 change to the training loop is the three lines marked "co2:" in train(). Each rank
draws its own random windows of the training bytes (seeded by seed and rank); every rank
evaluates the same held-out windows, so ranks stay in step and the evaluation costs every
algorithm alike. AdamW with linear warm-up and cosine decay, gradient clipping by norm.

What is evaluated during training: for `ddp` and `sync` the model itself (identical on every
rank); for diloco and co2 the engine's anchor (trainer.engine.consensus("anchor"), the last
model every rank agreed on; no communication), for localsgd (which keeps no anchor) the average
of the ranks' models (consensus("local_average"), collective), loaded into a second copy of the
model: the trajectory is not changed. The final validation loss is always that of the model after
trainer.finalize() (every rank then holds the same consensus model), on all held-out windows.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import corpus  # noqa: E402
from model import SIZES, VOCAB, ByteLM, Size  # noqa: E402

CO2_ALGORITHMS = ("sync", "localsgd", "diloco", "co2")
ALGORITHMS = ("ddp",) + CO2_ALGORITHMS
LR = 3e-3
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
CLIP_NORM = 1.0
WARMUP_FRACTION = 0.05
FINAL_LR_FRACTION = 0.1
EVAL_SEQUENCES = 64       # held-out windows, fixed: the same for every run and evaluation
EVAL_BATCH = 32


def lr_factor(step, steps):
    """Linear warm-up over WARMUP_FRACTION of the steps, then cosine down to FINAL_LR_FRACTION."""
    warmup = max(1, int(WARMUP_FRACTION * steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress))


class Data:
    def __init__(self, size, train=None, validation=None):
        if train is None:
            train, validation = corpus.load()
        self.size = size
        self.train = torch.from_numpy(np.ascontiguousarray(train))
        validation = torch.from_numpy(np.ascontiguousarray(validation))
        # Evenly spaced held-out windows over the whole validation text.
        span = size.context + 1
        starts = torch.linspace(0, len(validation) - span - 1, EVAL_SEQUENCES).long()
        self.eval_windows = validation[starts[:, None] + torch.arange(span)].long()

    def batches(self, seed, rank, stream=0):
        """This rank's training minibatches: random windows, seeded by (seed, rank). An elastic
        loop starts a new `stream` after each membership change (its rank may be another's)."""
        generator = torch.Generator().manual_seed(seed * 1000 + rank + 1_000_003 * stream)
        span = self.size.context + 1
        offsets = torch.arange(span)
        while True:
            starts = torch.randint(0, len(self.train) - span, (self.size.batch,),
                                   generator=generator)
            window = self.train[starts[:, None] + offsets].long()
            yield window[:, :-1], window[:, 1:]


def make_model(size, seed):
    torch.manual_seed(seed)
    return ByteLM(size)


def make_optimizer(model, lr=LR):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=BETAS)


def evaluate(model, data):
    """Mean next-byte cross-entropy (nats) on the held-out windows, dropout off."""
    was_training = model.training
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, len(data.eval_windows), EVAL_BATCH):
            window = data.eval_windows[i:i + EVAL_BATCH]
            total += model.loss(window[:, :-1], window[:, 1:]).item() * len(window)
    model.train(was_training)
    return total / len(data.eval_windows)


def train(algorithm, data, seed, steps, *, comm=None, rank=0, world=1, eval_every=40,
          on_eval=None, **engine_config):
    """One rank's run. algorithm "ddp" needs an initialised torch.distributed (gloo) group;
    the co2 algorithms use `comm` (a co2.Communicator). Returns rank-local results: the
    validation curve (step, training seconds, loss), final validation loss, wall seconds
    (training only: evaluation time is taken out), evaluation seconds, engine statistics."""
    size = data.size
    model = make_model(size, seed)
    trainer = None
    if algorithm == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model)
        optimizer = make_optimizer(model)
        # DDP hooks the forward of the wrapper: the loss must come out of net(...).
        loss_of = lambda x, y: torch.nn.functional.cross_entropy(  # noqa: E731
            net(x).reshape(-1, VOCAB), y.reshape(-1))
    else:
        import co2.torch
        optimizer = make_optimizer(model)
        trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm,    # co2:
                                       comm=comm, **engine_config)
        loss_of = model.loss
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, steps))
    shadow = None
    if algorithm in ("localsgd", "diloco", "co2"):
        shadow = make_model(size, seed)       # holds the anchor for evaluation
        anchor = torch.empty(sum(p.numel() for p in shadow.parameters()))

    def validation_loss():
        if shadow is None:
            return evaluate(model, data)
        # localsgd keeps no anchor: the average of the ranks' models (collective; every rank
        # evaluates at the same steps).
        assert trainer is not None           # a shadow model only for co2's algorithms
        trainer.engine.consensus("local_average" if algorithm == "localsgd" else "anchor",
                                 out=anchor)
        torch.nn.utils.vector_to_parameters(anchor, shadow.parameters())
        return evaluate(shadow, data)

    curve: dict[str, list[float]] = {"step": [], "seconds": [], "loss": [], "train_loss": []}
    eval_seconds = 0.0
    start = time.perf_counter()

    def record(step, train_loss):
        nonlocal eval_seconds
        entered = time.perf_counter()
        curve["seconds"].append(entered - start - eval_seconds)   # training time so far
        loss = validation_loss()
        eval_seconds += time.perf_counter() - entered
        curve["step"].append(step)
        curve["loss"].append(loss)
        curve["train_loss"].append(train_loss)
        if on_eval:
            on_eval(step, loss, train_loss)

    record(0, float("nan"))
    batches = data.batches(seed, rank)
    model.train()
    recent = []
    for step in range(1, steps + 1):
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        # Clipped before the average: under co2's sync each rank clips its own gradient (the
        # average happens in optimizer.step); DDP clips the averaged one.
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()          # co2: sync averages the gradients first; the engine steps after
        scheduler.step()
        recent.append(loss.item())
        if step % eval_every == 0 and step < steps:
            record(step, sum(recent) / len(recent))
            recent = []
    stats = None
    if trainer is not None:
        trainer.finalize()                                                   # co2:
        stats = trainer.stats()
    wall = time.perf_counter() - start - eval_seconds
    final = evaluate(model, data)
    curve["step"].append(steps)
    curve["seconds"].append(wall)
    curve["loss"].append(final)
    curve["train_loss"].append(sum(recent) / len(recent) if recent else float("nan"))
    if on_eval:
        on_eval(steps, final, curve["train_loss"][-1])
    if trainer is not None:
        trainer.close()
    return {"algorithm": algorithm, "seed": seed, "rank": rank, "world_size": world,
            "steps": steps, "final_loss": final, "wall_s": wall, "eval_s": eval_seconds,
            "curve": curve,
            "boundary_wait_s": stats["boundary_wait_ns"] / 1e9 if stats else None,
            "rounds": stats["rounds"] if stats else None,
            "advised_tau": stats.get("advised_tau") if stats else None,
            # co2's averages applied between boundaries (apply_step) and the step of the last
            "arrival_updates": stats.get("arrival_updates") if stats else None,
            "last_apply_step": stats.get("last_apply_step") if stats else None,
            "engine_config": {k: v for k, v in engine_config.items()}}


def init_gloo(rank, world, timeout_s=300):
    """torch.distributed for DDP: torchrun's store, else (co2run, bench) MASTER_PORT + 1 (co2's
    store holds MASTER_PORT)."""
    import datetime
    import torch.distributed as dist
    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        return
    port = int(os.environ.get("DDP_PORT", int(os.environ["MASTER_PORT"]) + 1))
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def size_from(args):
    size = SIZES[args.size]
    if args.batch:
        size = Size(**{**size.__dict__, "batch": args.batch})
    return size


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="co2", choices=ALGORITHMS)
    parser.add_argument("--tau", type=int, default=12)
    parser.add_argument("--outer-lr", type=float)
    parser.add_argument("--outer-momentum", type=float)
    parser.add_argument("--nesterov", action="store_true")
    parser.add_argument("--penalty", choices=("none", "constant", "gap"))
    parser.add_argument("--clip", choices=("none", "norm"))
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, help="sequences per rank and step (default: size's)")
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--json", help="rank 0 writes its result here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import co2
    rank, world = co2.rank_and_world() or (0, 1)     # no launcher: a group of one
    comm = None
    if args.algorithm == "ddp":
        init_gloo(rank, world)
    else:
        comm = co2.Communicator.from_env()
    config = {}
    if args.algorithm != "sync":
        config["tau"] = args.tau
    for key in ("outer_lr", "outer_momentum", "penalty", "clip"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    if args.nesterov:
        config["nesterov"] = True
    size = size_from(args)
    data = Data(size)
    if rank == 0:
        print(f"{args.algorithm} W={world} {size} ({size.parameters():,} parameters), "
              f"train {len(data.train):,} bytes, {args.steps} steps", flush=True)

    def show(step, loss, train_loss):
        if rank == 0:
            print(f"step {step:5d}  train {train_loss:.4f}  validation {loss:.4f}", flush=True)

    result = train(args.algorithm, data, args.seed, args.steps, comm=comm, rank=rank,
                   world=world, eval_every=args.eval_every, on_eval=show, **config)
    if rank == 0:
        print(f"final validation loss {result['final_loss']:.4f}, {result['wall_s']:.1f} s "
              f"training (+{result['eval_s']:.1f} s evaluation)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if comm is not None:
        comm.close()
    else:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""co2 example: self-supervised contrastive learning (MoCo, and MoCo + the consistency term of
Consistent Contrast, Wei et al., ICLR 2021) on scikit-learn's digits, trained data-parallel with
co2's `sync` and `co2`, and with torch.distributed DDP (gloo) as the outside baseline, in the same
processes, on the same initial weights and the same data shards. Evaluated by a linear probe
(logistic regression) on the frozen encoder's features of held-out images.

    co2run --nproc-per-node 4 /usr/bin/python3 -u examples/python/contrast/train.py \
        --algorithms ddp sync co2 --losses moco consistent --seeds 0 --json out.json

Roles (README.md says why): the query encoder (backbone + projection head) is the module handed
to co2.torch.distribute: co2 averages it. The key encoder is an exponential moving average of the
rank's own query encoder, and the queue of negatives holds the keys of the rank's own shard:
both stay per rank, outside the engine. BatchNorm normalises over shuffled groups of a batch;
its running statistics are re-estimated after training (recompute_batchnorm).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

ALGORITHMS = ("ddp", "sync", "co2")
LOSSES = ("moco", "consistent")
# Hyper-parameters (README.md "Settings"): MoCo v2's temperature 0.2 for InfoNCE, the
# Consistent Contrast paper's 0.04 for the consistency term, whose weight was chosen here.
BATCH = 32            # per rank
QUEUE = 256           # negatives per rank (a rank's shard is 337 images)
STEPS = 1000
LR = 0.06
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
EMA = 0.99            # key encoder momentum (MoCo's 0.999 is for ~10^5 steps; this run has 10^3)
TEMPERATURE = 0.2
CONSISTENCY_TEMPERATURE = 0.04
CONSISTENCY_WEIGHT = 0.1   # README.md "Settings": α 1 collapses the encoder here
WIDTH = 16
FEATURES = 64
PROJECTION = 32
CO2_CONFIG = {"tau": 12, "eager": True}   # α 1, β auto (0 for 4 ranks): the engine's defaults
TEST_FRACTION = 0.25                      # 450 of 1797 images held out (as examples/python/digits.py)
FEW_LABELS = 10                           # per class, for the few-label probe
BN_GROUPS = 2                             # BatchNorm groups per batch (Encoder.forward)


# --- data -----------------------------------------------------------------------------------------

def load_digits():
    """(train_x, train_y, test_x, test_y): 1x8x8 float32 images in [0, 1], int64 labels; the fixed
    split of examples/python/digits.py."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split
    x, y = sklearn_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    train_x, test_x, train_y, test_y = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=0, stratify=y)
    return (torch.from_numpy(train_x), torch.from_numpy(train_y).long(),
            torch.from_numpy(test_x), torch.from_numpy(test_y).long())


def augment(x, generator):
    """A random view of every image: an affine map (rotation ±15°, scale 0.85-1.15, shift
    ±1.5 px: a random crop and a small rotation at once), contrast 0.7-1.3, Gaussian noise 0.1."""
    n = len(x)

    def uniform(low, high, *shape):
        return low + (high - low) * torch.rand(n, *shape, generator=generator)

    angle = uniform(-math.pi / 12, math.pi / 12)
    scale = uniform(0.85, 1.15)
    shift = uniform(-0.375, 0.375, 2)            # grid units: 8 px span 2, so 0.25 per px
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1),
                         torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, x.shape, align_corners=False)
    out = F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)
    out = out * uniform(0.7, 1.3, 1, 1, 1)
    return out + 0.1 * torch.randn(out.shape, generator=generator)


def batches(x, seed, rank):
    """Endless shuffled passes over this rank's shard, BATCH images at a time."""
    generator = torch.Generator().manual_seed(seed * 1000 + rank)
    while True:
        order = torch.randperm(len(x), generator=generator)
        for i in range(len(x) // BATCH):
            yield x[order[i * BATCH:(i + 1) * BATCH]], generator


# --- model ----------------------------------------------------------------------------------------

class Encoder(torch.nn.Module):
    """A small CNN backbone (its output is what the probe sees) and an MLP projection head;
    forward() gives L2-normalised projections. BatchNorm after every layer but the last: without
    it the outputs collapse to one constant direction within a hundred steps (the InfoNCE loss
    climbs to ln(1 + QUEUE), the probe falls below that of the random initialisation). README.md
    "BatchNorm" says which statistics are averaged and why the key batch is shuffled."""

    def __init__(self, width=WIDTH, features=FEATURES, projection=PROJECTION):
        super().__init__()
        nn = torch.nn
        self.backbone = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.BatchNorm2d(2 * width),
            nn.ReLU(), nn.Flatten(),
            nn.Linear(2 * width * 16, features), nn.BatchNorm1d(features), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(features, features), nn.BatchNorm1d(features),
                                  nn.ReLU(), nn.Linear(features, projection))

    def forward(self, x, order=None):
        """L2-normalised projections of x; with `order` (a permutation of x's rows), BatchNorm
        statistics come from BN_GROUPS groups of x[order] (rows returned in x's order). That is
        MoCo's shuffling BN on one rank: the query's groups are contiguous, the key's
        interleaved (each mixes halves of both query groups), so a query and its positive key
        are normalised with different statistics, which therefore cannot mark the pair."""
        if order is None:
            return F.normalize(self.head(self.backbone(x)), dim=1)
        out = torch.cat([self.forward(x[rows]) for rows in order.chunk(BN_GROUPS)])
        return out[torch.argsort(order)]


def make_encoder(seed):
    torch.manual_seed(seed)
    return Encoder()


def contrastive_loss(q, k, queue, loss, temperature, consistency_temperature, alpha):
    """(total, InfoNCE, consistency) for queries q and positive keys k (no gradient) against the
    queue. The consistency term (Consistent Contrast): the query's softmax over its similarities
    to the negatives must match the positive key's (the pseudo-label), symmetric KL."""
    negatives_q = q @ queue.t()
    logits = torch.cat([(q * k).sum(1, keepdim=True), negatives_q], 1) / temperature
    nce = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long))
    if loss == "moco":
        return nce, nce, torch.zeros(())
    log_p = F.log_softmax(negatives_q / consistency_temperature, 1)
    log_r = F.log_softmax((k @ queue.t()) / consistency_temperature, 1)
    p, r = log_p.exp(), log_r.exp()
    consistency = 0.5 * ((p * (log_p - log_r)).sum(1) + (r * (log_r - log_p)).sum(1)).mean()
    return nce + alpha * consistency, nce, consistency


# --- linear probe ---------------------------------------------------------------------------------

def probe(encoder, data, seed=0):
    """Held-out accuracy of a logistic regression on the frozen backbone's features: trained on
    all training labels, and on FEW_LABELS per class (the same images for every run)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    train_x, train_y, test_x, test_y = data
    with torch.no_grad():
        features = encoder.backbone if encoder is not None else torch.nn.Flatten()  # raw pixels
        train_f, test_f = features(train_x).numpy(), features(test_x).numpy()
    if not (np.isfinite(train_f).all() and np.isfinite(test_f).all()):
        return {"probe": float("nan"), "probe_few": float("nan")}   # a diverged run
    rng = np.random.default_rng(seed)
    few = np.concatenate([rng.choice(np.flatnonzero(train_y.numpy() == c), FEW_LABELS,
                                     replace=False) for c in range(10)])
    result = {}
    for name, rows in (("probe", slice(None)), ("probe_few", few)):
        scaler = StandardScaler().fit(train_f[rows])
        classifier = LogisticRegression(max_iter=3000).fit(scaler.transform(train_f[rows]),
                                                           train_y.numpy()[rows])
        result[name] = float((classifier.predict(scaler.transform(test_f)) ==
                              test_y.numpy()).mean())
    return result


def recompute_batchnorm(encoder, x, comm):
    """Sets every BatchNorm's running statistics to those of the trained encoder over the rank's
    training images (unaugmented, the probe's input), averaged over ranks: the same for every
    algorithm, whatever happened to the running statistics during training (README.md
    "BatchNorm"). Collective."""
    layers = [m for m in encoder.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for layer in layers:
        layer.reset_running_stats()
        # A cumulative average: one pass gives the shard's statistics (torch 1.13's annotation
        # says float, its code takes None).
        layer.momentum = None  # type: ignore[assignment]
    encoder.train()
    with torch.no_grad():
        encoder(x)
    for layer in layers:
        for stat in (layer.running_mean, layer.running_var):
            assert stat is not None          # reset_running_stats() above: they are tracked
            total = comm.allreduce(stat.detach().double().numpy().copy(), "sum")
            stat.copy_(torch.from_numpy(total / comm.world_size))
    encoder.eval()


# --- training -------------------------------------------------------------------------------------

def spread(comm, module):
    """The largest difference between ranks of any parameter of `module` (0: identical)."""
    flat = torch.cat([p.detach().flatten() for p in module.parameters()]).double().numpy()
    high, low = comm.allreduce(flat.copy(), "max"), comm.allreduce(flat.copy(), "min")
    return float(np.max(high - low))


def train(algorithm, loss, data, seed, args, comm, rank, world):
    """One rank's run; returns its result dict. `ddp` needs an initialised torch.distributed
    (gloo) group; every algorithm uses `comm` (a co2.Communicator) for the final agreement check
    and the wall time."""
    train_x = data[0][rank::world].contiguous()
    query = make_encoder(seed)
    optimizer = torch.optim.SGD(query.parameters(), lr=args.lr, momentum=MOMENTUM,
                                weight_decay=WEIGHT_DECAY)
    trainer = None
    if algorithm == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        forward = DistributedDataParallel(query)
    else:
        import co2.torch
        config = {} if algorithm == "sync" else dict(CO2_CONFIG, tau=args.tau)
        # co2: the query encoder only. The key encoder and the queue are not the engine's.
        trainer = co2.torch.distribute(query, optimizer, algorithm=algorithm, comm=comm,
                                       **config)
        forward = query
    # The key encoder starts as the query encoder every rank committed (rank 0's weights).
    key = make_encoder(seed)
    key.load_state_dict(query.state_dict())
    key.requires_grad_(False)
    query_params, key_params = list(query.parameters()), list(key.parameters())
    # Random unit vectors until real keys push them out (as MoCo); seeded per rank.
    queue = F.normalize(torch.randn(QUEUE, PROJECTION,
                                    generator=torch.Generator().manual_seed(seed * 1000 + rank
                                                                            + 500)), dim=1)
    pointer = 0
    contiguous = torch.arange(BATCH)
    interleaved = torch.arange(BATCH).view(BN_GROUPS, -1).t().flatten()
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, args.steps) / args.steps)))
    curve: dict[str, list[float]] = {"step": [], "loss": [], "nce": [], "consistency": []}
    window = []
    source = batches(train_x, seed, rank)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        images, generator = next(source)
        view_q, view_k = augment(images, generator), augment(images, generator)
        q = forward(view_q, contiguous)
        with torch.no_grad():
            k = key(view_k, interleaved)
        total, nce, consistency = contrastive_loss(q, k, queue, loss, args.temperature,
                                                   args.consistency_temperature, args.alpha)
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()      # co2: sync averages the gradients first; the engine steps after
        scheduler.step()
        with torch.no_grad():
            torch._foreach_mul_(key_params, args.ema)
            torch._foreach_add_(key_params, query_params, alpha=1 - args.ema)
            queue[pointer:pointer + len(k)] = k
            pointer = (pointer + len(k)) % QUEUE
        window.append((total.item(), nce.item(), consistency.item()))
        if step % args.log_every == 0 or step == args.steps:
            means = np.mean(window, 0)
            window = []
            curve["step"].append(step)
            for name, value in zip(("loss", "nce", "consistency"), means):
                curve[name].append(float(value))
    stats = None
    if trainer is not None:
        trainer.finalize()   # co2: every rank now holds the same query encoder
        stats = trainer.stats()
    wall = time.perf_counter() - start
    result = {"algorithm": algorithm, "loss": loss, "seed": seed, "rank": rank,
              "world_size": world, "steps": args.steps, "curve": curve,
              "wall_s": float(comm.allreduce(np.array([wall]), "max")[0]),
              "query_spread": spread(comm, query), "key_spread": spread(comm, key),
              "rounds": stats["rounds"] if stats else None,
              "boundary_wait_s": stats["boundary_wait_ns"] / 1e9 if stats else None,
              "config": {"tau": None if algorithm in ("ddp", "sync") else args.tau,
                         "temperature": args.temperature, "alpha": args.alpha,
                         "consistency_temperature": args.consistency_temperature,
                         "ema": args.ema, "lr": args.lr}}
    recompute_batchnorm(query, train_x, comm)
    result.update(probe(query, data))
    if trainer is not None:
        trainer.close()
    return result


# --- launching ------------------------------------------------------------------------------------

def init_gloo(rank, world, timeout_s=300):
    """torch.distributed for DDP: torchrun's store, else (co2run) MASTER_PORT + 1 (co2's store
    holds MASTER_PORT)."""
    import datetime
    import torch.distributed as dist
    if "TORCHELASTIC_RUN_ID" in os.environ:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
        return
    port = int(os.environ.get("DDP_PORT", int(os.environ["MASTER_PORT"]) + 1))
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--tau", type=int, default=CO2_CONFIG["tau"])
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--ema", type=float, default=EMA, help="key encoder momentum")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE, help="InfoNCE τ")
    parser.add_argument("--consistency-temperature", type=float,
                        default=CONSISTENCY_TEMPERATURE, help="τ_con of the consistency term")
    parser.add_argument("--alpha", type=float, default=CONSISTENCY_WEIGHT,
                        help="weight α of the consistency term")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--json", help="rank 0 appends one JSON line per run here")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.tau < 1 or args.log_every < 1:
        parser.error("--steps, --tau and --log-every must be at least 1")
    if args.temperature <= 0 or args.consistency_temperature <= 0 or args.alpha < 0:
        parser.error("the temperatures must be positive and --alpha not negative")
    if not 0 <= args.ema < 1:
        parser.error("--ema must be in [0, 1)")
    return args


def main(argv=None):
    args = parse(argv)
    torch.set_num_threads(1)
    import co2
    rank, world = co2.rank_and_world() or (0, 1)   # no launcher: a group of one
    if "ddp" in args.algorithms:
        init_gloo(rank, world)
    comm = co2.Communicator.from_env()
    data = load_digits()
    for seed in args.seeds:
        for loss in args.losses:
            for algorithm in args.algorithms:
                result = train(algorithm, loss, data, seed, args, comm, rank, world)
                if rank != 0:
                    continue
                print(f"seed {seed} {loss:10} {algorithm:4} probe {100 * result['probe']:.2f} % "
                      f"(10/class {100 * result['probe_few']:.2f} %) "
                      f"loss {result['curve']['loss'][-1]:.3f} wall {result['wall_s']:.1f} s "
                      f"query spread {result['query_spread']:.1e} "
                      f"key spread {result['key_spread']:.1e}", flush=True)
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(result) + "\n")
    comm.close()
    if "ddp" in args.algorithms:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

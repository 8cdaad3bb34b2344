#!/usr/bin/python3
"""One rank of the overlap benchmark whose training step is the digits example's MLP
(examples/python/digits.py): forward, backward and optimizer.step() on one minibatch of 16
images, PyTorch on the CPU with one thread. Prints one JSON line per run with the fields
bench/overlap/overlap.c prints (work = "digits"), so run.py tabulates both alike.

    digits_rank.py --algo none|sync|localsgd|diloco|co2|ddp [--tau T] [--hidden H]
                   [--steps S] [--warmup-steps W] [--timeout-s T]
    digits_rank.py --plan co2:4:60:4,sync:1:30:2,...   # several runs in one process
    digits_rank.py --calibrate 32,64,128               # ms per step alone, per hidden width

Ranks: --mode process (the default) takes RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
environment as a launcher sets them; co2 meets through its own store at MASTER_PORT and torch
DDP (gloo) at MASTER_PORT + 1. --mode threads --world W runs W ranks as threads of this
process on co2's local transport (whose link model reads CO2_LOCAL_TEST_BANDWIDTH); DDP needs
processes there.

`none` trains alone with torch's SGD (no communication); the co2 algorithms wrap the same
optimizer with co2.torch.distribute (the example's outer settings); `ddp` is torch's
DistributedDataParallel over gloo. A --plan runs its entries in order in the same processes
(torch and scikit-learn take seconds to import; the benchmark runs dozens of configurations),
every rank entering each run together (a barrier on the group).

engine_ms is the time inside co2's calls per rank over the measured steps: the engine's step
(boundary pass, waits for the all-reduce) and, for sync, the gradient all-reduce; not torch's
SGD step, which every algorithm runs.
"""

import argparse
import datetime
import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# sync-step: sync averaging in optimizer.step (reduce_in_backward=False, co2 before 1.1) beside
# sync's default, the average in backward hooks (bucketed, overlapped with backward, like DDP).
CO2_ALGOS = ("sync", "sync-step", "localsgd", "diloco", "co2")
ALGOS = ("none", "ddp") + CO2_ALGOS
EPOCHS_WITHOUT_END = 1 << 30  # batches() is lazy: as many epochs as the steps need
_print_lock = threading.Lock()


def mlp_params(hidden, depth=2):
    """Parameters of the digits MLP 64 -> hidden (x depth) -> 10."""
    return 64 * hidden + hidden + (depth - 1) * (hidden * hidden + hidden) + 10 * hidden + 10


def make_model(seed, hidden, depth=2):
    """The example's MLP (depth 2), or the same with `depth` hidden layers."""
    import digits
    if depth == 2:
        return digits.make_model(seed, hidden=hidden)
    with digits._init_lock:
        torch.manual_seed(seed)
        layers = [torch.nn.Linear(64, hidden), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers, torch.nn.Linear(hidden, 10))


class Group:
    """The rank's connections, made on first use and shared by the runs of a plan."""

    def __init__(self, rank, world, mode, timeout_s, group_name=None):
        self.rank, self.world, self.mode = rank, world, mode
        self.timeout_s = timeout_s
        self.group_name = group_name
        self.comm = None
        self.gloo = False

    def co2_comm(self):
        if self.comm is None:
            import co2
            if self.mode == "threads":
                self.comm = co2.Communicator(self.rank, self.world, transport="local",
                                             group_name=self.group_name,
                                             timeout_ms=int(self.timeout_s * 1000))
            else:
                self.comm = co2.Communicator(self.rank, self.world,
                                             timeout_ms=int(self.timeout_s * 1000))
        return self.comm

    def init_gloo(self):
        import torch.distributed as dist
        if self.mode == "threads":
            raise RuntimeError("ddp needs one process per rank (--mode process)")
        if not self.gloo:
            port = int(os.environ["MASTER_PORT"]) + 1
            dist.init_process_group(
                "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}", rank=self.rank,
                world_size=self.world, timeout=datetime.timedelta(seconds=self.timeout_s))
            self.gloo = True

    def barrier(self):
        """Every rank starts a run's clock together (the compute-only runs too: the ranks
        share the cores, as in the runs they are the reference for)."""
        if self.world < 2:
            return
        if self.comm is not None:
            self.comm.allreduce(np.zeros(1, dtype=np.float32))
        elif self.gloo:
            import torch.distributed as dist
            dist.barrier()

    def close(self):
        if self.comm is not None:
            self.comm.close()
            self.comm = None
        if self.gloo:
            import torch.distributed as dist
            dist.destroy_process_group()
            self.gloo = False


class EngineClock:
    """Time inside the co2 calls optimizer.step() makes (and which were boundaries), plus, for
    sync, the wait for the gradient all-reduces at the end of backward."""

    def __init__(self, trainer):
        self.ns = 0
        self.boundaries = 0
        self.grad_sync = trainer.grad_sync
        self._grad_wait_start = 0
        # optimizer.step's hook calls the engine step behind trainer.step() (the layout check
        # runs before the optimizer's step, not again here): that is the call to time.
        step, reduce = trainer._engine_step, trainer.reduce_gradients

        def timed_step():
            t0 = time.perf_counter_ns()
            boundary = step()
            self.ns += time.perf_counter_ns() - t0
            self.boundaries += bool(boundary)
            return boundary

        def timed_reduce():
            t0 = time.perf_counter_ns()
            reduce()
            self.ns += time.perf_counter_ns() - t0

        # optimizer.step's hook looks these up on the instance at every call.
        trainer._engine_step, trainer.reduce_gradients = timed_step, timed_reduce

    def reset(self):
        self.ns = 0
        self.boundaries = 0
        self._grad_wait_start = self.grad_sync.wait_ns if self.grad_sync else 0

    def total_ns(self):
        grad_wait = self.grad_sync.wait_ns - self._grad_wait_start if self.grad_sync else 0
        return self.ns + grad_wait


def run(group, data, algo, tau, hidden, steps, warmup, seed=0, depth=2, bucket_mb=None):
    """One measured run on this rank; returns its JSON-ready dict."""
    import digits
    x, y = digits.shard(data[0], data[1], group.rank, group.world)
    model = make_model(seed, hidden, depth)
    net = model
    trainer = clock = None
    if algo == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        group.init_gloo()
        net = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=digits.LR, momentum=digits.MOMENTUM)
    if algo in CO2_ALGOS:
        import co2.torch
        config = dict(digits.OUTER.get(algo, {}))
        if algo == "sync-step":
            config["reduce_in_backward"] = False
        elif algo == "sync" and bucket_mb is not None:
            config["bucket_mb"] = bucket_mb
        elif algo != "sync":
            config["tau"] = tau
        trainer = co2.torch.distribute(model, optimizer, algorithm=algo.split("-")[0],
                                       comm=group.co2_comm(), **config)
        clock = EngineClock(trainer)
    params = mlp_params(hidden, depth)
    group.barrier()
    stream = digits.batches(x, y, seed, group.rank, EPOCHS_WITHOUT_END)
    t_measure = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            t_measure = time.perf_counter()
            if clock:
                clock.reset()
        _, bx, by = next(stream)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(net(bx), by).backward()
        optimizer.step()
    seconds = time.perf_counter() - t_measure
    measured = steps - warmup
    out = {"rank": group.rank, "world": group.world, "algo": algo,
           "tau": tau if algo in ("localsgd", "diloco", "co2") else 1, "params": params,
           "hidden": hidden, "depth": depth, "work": "digits", "steps": measured, "seconds": seconds,
           "steps_per_s": measured / seconds if seconds > 0 else 0.0}
    if trainer is not None:
        s = trainer.stats()
        engine_ns = clock.total_ns()
        grad_reductions = trainer.grad_sync.backward_reductions if trainer.grad_sync else 0
        trainer.finalize()
        trainer.close()
        out.update(boundary_wait_ms=s["boundary_wait_ns"] / 1e6, collective_ms=s["collective_ns"] / 1e6,
                   allreduces=round(s["bytes_reduced"] / (4 * params)),
                   grad_reductions=grad_reductions,
                   step_time_ms=s["step_time_ns"] / 1e6, allreduce_time_ms=s["allreduce_time_ns"] / 1e6,
                   advised_tau=s["advised_tau"], engine_ms=engine_ns / 1e6, boundaries=clock.boundaries)
    return out


def run_plan(group, plan, hidden, depth=2, bucket_mb=None):
    import digits
    torch.set_num_threads(1)
    data = digits.load_digits()
    try:
        # Connect first, so that even the first run (compute only) starts on a barrier.
        if any(algo in CO2_ALGOS for algo, *_ in plan):
            group.co2_comm()
        elif any(algo == "ddp" for algo, *_ in plan):
            group.init_gloo()
        for algo, tau, steps, warmup in plan:
            line = json.dumps(run(group, data, algo, tau, hidden, steps, warmup, depth=depth,
                                  bucket_mb=bucket_mb))
            with _print_lock:
                print(line, flush=True)
    finally:
        group.close()


def calibrate(widths, repeats=3, steps=20, depth=2):
    """Milliseconds per step of one rank alone, per hidden width (the best of `repeats`)."""
    import digits
    torch.set_num_threads(1)
    x, y = digits.load_digits()[:2]
    result = {}
    for hidden in widths:
        model = make_model(0, hidden, depth)
        optimizer = torch.optim.SGD(model.parameters(), lr=digits.LR, momentum=digits.MOMENTUM)
        stream = digits.batches(x, y, 0, 0, EPOCHS_WITHOUT_END)

        def step():
            _, bx, by = next(stream)
            optimizer.zero_grad(set_to_none=True)
            F.cross_entropy(model(bx), by).backward()
            optimizer.step()

        for _ in range(steps // 2):
            step()
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            best = min(best, (time.perf_counter() - t0) / steps)
        result[str(hidden)] = best * 1e3
    return result


def parse_plan(text, ap):
    plan = []
    for entry in text.split(","):
        parts = entry.split(":")
        if len(parts) != 4 or parts[0] not in ALGOS:
            ap.error(f"--plan: '{entry}' is not algo:tau:steps:warmup with algo one of {', '.join(ALGOS)}")
        try:
            tau, steps, warmup = (int(p) for p in parts[1:])
        except ValueError:
            ap.error(f"--plan: '{entry}': tau, steps and warmup must be integers")
        plan.append((parts[0], tau, steps, warmup))
    return plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algo", choices=ALGOS, default="none")
    ap.add_argument("--tau", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64, help="width of both hidden layers")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="unmeasured steps first (default: one round, tau; 2 for sync and ddp)")
    ap.add_argument("--plan", help="algo:tau:steps:warmup,... run in order (replaces --algo ...)")
    ap.add_argument("--timeout-s", type=float, default=60.0,
                    help="how long a rank waits for the others (rendezvous, collectives)")
    ap.add_argument("--mode", choices=("process", "threads"), default="process")
    ap.add_argument("--world", type=int, default=2, help="ranks, with --mode threads")
    ap.add_argument("--calibrate", help="hidden widths: print ms per step alone for each")
    ap.add_argument("--depth", type=int, default=2,
                    help="hidden layers (2: the example's MLP)")
    ap.add_argument("--bucket-mb", type=float, default=None,
                    help="sync's gradient bucket size in MiB (default: co2.torch's)")
    args = ap.parse_args(argv)

    try:
        import co2  # noqa: F401 - the example imports it at the top
    except ImportError as e:
        print(f"digits_rank: the co2 Python package is not importable ({e}); build it and set "
              "PYTHONPATH=BUILD/bindings/python", file=sys.stderr)
        return 77
    if args.calibrate:
        try:
            widths = [int(w) for w in args.calibrate.split(",")]
        except ValueError:
            ap.error("--calibrate takes hidden widths, e.g. 32,64,128")
        print(json.dumps({"step_ms": calibrate(widths, depth=args.depth)}), flush=True)
        return 0
    if args.hidden < 1 or args.timeout_s <= 0 or args.depth < 1:
        ap.error("--hidden and --depth must be >= 1 and --timeout-s > 0")
    if args.plan:
        plan = parse_plan(args.plan, ap)
    else:
        warmup = args.warmup_steps
        if warmup is None:
            warmup = args.tau if args.algo in ("localsgd", "diloco", "co2") else 2
        plan = [(args.algo, args.tau, args.steps, warmup)]
    for algo, tau, steps, warmup in plan:
        if tau < 1 or warmup < 0 or steps <= warmup:
            ap.error(f"{algo}: tau must be >= 1 and steps ({steps}) must exceed the warm-up ({warmup})")

    if args.mode == "threads":
        if args.world < 1:
            ap.error("--world must be >= 1")
        if any(algo == "ddp" for algo, *_ in plan):
            ap.error("ddp needs --mode process (one process per rank)")
        errors = []
        name = f"digits-bench-{os.getpid()}"

        def rank_main(rank):
            try:
                run_plan(Group(rank, args.world, "threads", args.timeout_s, name), plan, args.hidden,
                         args.depth, args.bucket_mb)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append((rank, exc))

        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(args.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for rank, exc in errors:
            print(f"digits_rank: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1 if errors else 0

    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            ap.error(f"{name} must be set (as a launcher sets it), or use --mode threads")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if not 0 <= rank < world:
        ap.error(f"RANK={rank} is outside [0, WORLD_SIZE={world})")
    try:
        run_plan(Group(rank, world, "process", args.timeout_s), plan, args.hidden, args.depth,
                 args.bucket_mb)
    except Exception as exc:  # one line, not a traceback per rank
        print(f"digits_rank: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

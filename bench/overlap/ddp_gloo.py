"""torch DDP (gloo) with the overlap benchmark's step model: the outside reference for co2's `sync`.

One rank per process; RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and GLOO_SOCKET_IFNAME inside
a network namespace) come from the environment, as torchrun would set them. Prints one JSON line
with the fields bench/overlap/overlap.c prints.

The step: a timed wait of --step-us (forward and backward as a GPU step looks to the host), then
backward of a parameter of --params fp32 elements whose gradient is a fixed tensor (no O(N) host
arithmetic besides what DDP itself does: copy into its bucket, all-reduce, copy back). As in
co2's `sync` here, the all-reduce starts when backward ends, so it cannot hide behind the wait:
both measure a blocking gradient average per step.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class FixedGradient(torch.autograd.Function):
    """loss = 0 with d loss / d p = the given gradient: backward costs nothing of its own."""

    @staticmethod
    def forward(ctx, p, grad):
        ctx.save_for_backward(grad)
        return p.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        (grad,) = ctx.saved_tensors
        return grad, None


class OneTensorModel(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(params))

    def forward(self, grad):
        return FixedGradient.apply(self.p, grad)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", type=int, required=True)
    ap.add_argument("--step-us", type=int, default=10000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument("--timeout-s", type=int, default=120)
    args = ap.parse_args()
    if args.steps <= args.warmup_steps or args.params < 1:
        ap.error("--steps must exceed --warmup-steps, --params must be >= 1")
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            ap.error(f"{name} must be set (as a launcher sets it)")
    torch.set_num_threads(1)
    import datetime

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(OneTensorModel(args.params))
    grad = torch.full((args.params,), 1e-3 * (rank + 1))
    step_s = args.step_us / 1e6
    t_measure = time.perf_counter()
    for step in range(args.steps):
        if step == args.warmup_steps:
            t_measure = time.perf_counter()
        deadline = time.perf_counter() + step_s
        loss = model(grad)
        remaining = deadline - time.perf_counter()
        if remaining > 0:
            time.sleep(remaining)
        model.zero_grad(set_to_none=True)
        loss.backward()  # DDP's hook all-reduces the gradient; backward returns when it is done
    seconds = time.perf_counter() - t_measure
    measured = args.steps - args.warmup_steps
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({
        "rank": rank, "world": world, "algo": "ddp", "tau": 1, "params": args.params,
        "work": "wait", "step_us": args.step_us, "steps": measured, "seconds": seconds,
        "steps_per_s": measured / seconds,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

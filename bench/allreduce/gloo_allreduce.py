"""torch.distributed (gloo) all_reduce over the same sizes, printed in the same columns as co2's
benchmark. Launched once per rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set (co2run does).
    co2run --nproc-per-node W /usr/bin/python3 gloo_allreduce.py [MIN_MIB MAX_MIB]"""
import os
import sys
import time

import torch
import torch.distributed as dist

MIN_SECONDS = 1.0
MIN_ITERS = 3


def main():
    torch.set_num_threads(1)
    min_mib, max_mib = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) == 3 else (1, 256)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"# tool gloo ranks {world}\n# bytes seconds algbw_GBps busbw_GBps cpu_seconds", flush=True)
    mib = min_mib
    while mib <= max_mib:
        nbytes = mib << 20
        buffer = torch.full((nbytes // 4,), 1e-3 * (rank + 1), dtype=torch.float32)
        dist.all_reduce(buffer)  # warm-up
        dist.barrier()
        iters, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while True:
            dist.all_reduce(buffer)
            iters += 1
            done = torch.tensor([int(iters >= MIN_ITERS and time.perf_counter() - start >= MIN_SECONDS)])
            dist.broadcast(done, 0)
            if done.item():
                break
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
        cpu = torch.tensor([(time.process_time() - cpu_start) / iters], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu)
        t = elapsed.item()
        if rank == 0:
            print(f"{nbytes} {t:.6f} {nbytes / t / 1e9:.3f} {2 * (world - 1) / world * nbytes / t / 1e9:.3f} {cpu.item() / world:.6f}", flush=True)
        mib *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

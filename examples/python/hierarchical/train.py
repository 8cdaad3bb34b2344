#!/usr/bin/python3
"""Hierarchical co2 with PyTorch: synchronous data parallelism inside a node, co2 across nodes
(docs/algorithm.md, "Hierarchical CO2"). Local rank j of every node carries shard j of the
inter-node all-reduce, so every node's ranks use their links at once, and keeps only its shard
of the outer state.

The intra-node average is either co2's (gradients averaged over the node's ranks in backward
buckets) or the framework's own: torch DDP over a process group of the node's ranks, with co2
running only the inter-node outer update. The co2 change to the training loop is the lines
marked "co2:".

Run (2 simulated nodes of 2 processes on one machine; on a cluster, co2run --nnodes N
--nproc-per-node L --node-rank K --master-addr HOST on every machine, or torchrun / srun):
    co2run --nnodes 2 --nproc-per-node 2 /usr/bin/python3 -u examples/python/hierarchical/train.py --intra co2
    co2run --nnodes 2 --nproc-per-node 2 /usr/bin/python3 -u examples/python/hierarchical/train.py --intra ddp

Each rank draws its own minibatches of a synthetic regression task (y = a teacher MLP's output);
the ranks of a node see different data, the node's average gradient is what its model follows.
--check asserts what the tests check: the loss went down and every rank ends with the same model.
The outer state each rank holds is printed in model copies (docs/capi.md gives the formula: with
L ranks per node, 1 + 3/L delayed, 2 + 5/L eager — the default —, fewer without outer momentum).
"""
import argparse
import os

import torch

import co2
import co2.torch


def teacher_batch(generator, batch, dim):
    x = torch.randn(batch, dim, generator=generator)
    with torch.no_grad():
        y = torch.tanh(x @ TEACHER_IN) @ TEACHER_OUT
    return x, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--intra", choices=("co2", "ddp", "none"), default="co2",
                        help="who averages the gradients inside a node (none: nobody — the "
                             "mistake co2 refuses at its first check, with what to do)")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--tau", type=int, default=12)
    parser.add_argument("--check", action="store_true", help="assert the results (tests)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, per_node = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    node = rank // per_node

    torch.manual_seed(0)  # the same initial model on every rank (co2 broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(DIM, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    engine_options = dict(algorithm="co2", tau=args.tau, outer_lr=0.8, hierarchy="nodes")
    if args.intra == "none":
        trainer = co2.torch.distribute(model, intra_node_average="framework", anchor_check_interval=1,
                                       **engine_options)
        forward: torch.nn.Module = model
    elif args.intra == "co2":
        # co2: one call; gradients are averaged over the node's ranks during backward.
        trainer = co2.torch.distribute(model, **engine_options)
        forward = model
    else:
        # torch.distributed for DDP on a port next to co2's store; one process group per node.
        torch.distributed.init_process_group(
            "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 1}",
            rank=rank, world_size=world)
        groups = [torch.distributed.new_group(list(range(n * per_node, (n + 1) * per_node)))
                  for n in range(world // per_node)]
        # DDP first: its construction copies the node's rank 0 parameters into the others, which
        # after distribute() would be a change outside co2 (a WiringError).
        forward = torch.nn.parallel.DistributedDataParallel(model, process_group=groups[node])
        # co2: the inter-node outer update only; DDP averages inside the node.
        trainer = co2.torch.distribute(model, intra_node_average="framework", **engine_options)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    trainer.attach(optimizer)  # co2

    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    losses = []
    for _ in range(args.steps):
        x, y = teacher_batch(generator, 32, DIM)
        loss = torch.nn.functional.mse_loss(forward(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # co2: the engine step runs inside
        losses.append(loss.item())
    trainer.finalize()  # co2

    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    stats = trainer.stats()
    state_copies = stats["outer_state_bytes"] / (4 * sum(p.numel() for p in model.parameters()))
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    print(f"rank {rank} (node {node}, local {local}): loss {first:.4f} -> {last:.4f}, "
          f"{stats['outer_updates']} outer updates, outer state {state_copies:.2f} model copies", flush=True)
    if args.check:
        assert last < 0.5 * first, f"the loss did not go down: {first} -> {last}"
        # Every rank the same model: the min and max of each value over the ranks agree.
        low, high = flat.clone(), flat.clone()
        trainer.comm.allreduce(low, op="min")
        trainer.comm.allreduce(high, op="max")
        assert torch.equal(low, high), "the ranks ended with different models"
    trainer.close()
    if args.intra == "ddp":
        torch.distributed.destroy_process_group()


DIM = 16
_teacher = torch.Generator().manual_seed(7)
TEACHER_IN = torch.randn(DIM, 32, generator=_teacher) / DIM ** 0.5
TEACHER_OUT = torch.randn(32, 1, generator=_teacher) / 32 ** 0.5

if __name__ == "__main__":
    main()

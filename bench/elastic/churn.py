#!/usr/bin/python3
"""Quality through churn (issue 26): the project's LM (examples/python/lm) trained by an elastic
co2 group that loses a rank and takes a new process in every few rounds, against the same run
without churn, at equal steps of the group.

    /usr/bin/python3 bench/elastic/churn.py [--seeds 3] [--world 4] [--steps 480] [--tau 12]
        [--kill-every 48] [--kill-offset 30] [--out bench/results]

Per seed, two launches of `co2run --nproc-per-node W --elastic 2 --max-restarts R` (real
processes over UCX/TCP on loopback, one torch thread each), both running this file's rank loop:
- steady: nobody dies;
- churn: while the group is whole, its highest rank SIGKILLs itself at every step s with
  s % kill_every == kill_offset (mid round: the survivors meet the loss in the round's
  all-reduce or at the next boundary); co2run starts it again and the new process joins the running
  group at a boundary, healed from the live ranks (anchor, outer momentum, step count; co2.torch
  sends rank 0's AdamW state). No kill in the last kill_every steps, so that the joiner is in before
  the end.
The loop follows the group's step count (after a loss the survivors go on from the agreed anchor's
step: the dropped round is trained again), sets the learning rate from it, draws a new data stream
after each change, and ends with finalize() at `steps`. Rank 0 (never killed) evaluates the final
model on every held-out window. Printed per seed: final validation loss steady and churn, their
ratio, kills, joins, the steps rank 0 trained twice (work the losses dropped), wall time. Writes
DIR/churn.json.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LM = os.path.join(ROOT, "examples", "python", "lm")
PYTHON = "/usr/bin/python3"


def rank_main(args):
    import torch
    sys.path.insert(0, LM)
    import co2
    import co2.torch
    import train as lm

    torch.set_num_threads(1)
    comm = co2.Communicator.from_env()
    full_world = int(os.environ["WORLD_SIZE"])
    size = lm.SIZES[args.size]
    data = lm.Data(size)
    model = lm.make_model(size, args.seed)
    optimizer = lm.make_optimizer(model)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, algorithm="co2", tau=args.tau)
    joined = trainer.engine.stats()["steps"] > 0
    # A joiner's streams start from its first step: each joiner draws other windows.
    stream = 10_000 + trainer.engine.stats()["steps"] if joined else 0
    batches = data.batches(args.seed, comm.rank, stream)
    trained = changes = kills_seen = 0
    start = time.perf_counter()
    while True:
        done = trainer.engine.stats()["steps"]
        if (args.churn and comm.world_size == full_world and comm.rank == full_world - 1 and
                done % args.kill_every == args.kill_offset and done < args.steps - args.kill_every):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            if done < args.steps:
                x, y = next(batches)
                for group in optimizer.param_groups:
                    group["lr"] = lm.LR * lm.lr_factor(done, args.steps)
                optimizer.zero_grad(set_to_none=True)
                loss = model.loss(x, y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), lm.CLIP_NORM)
                trained += 1  # before step(): the step that meets a membership change counts too
                optimizer.step()
                continue
            trainer.finalize()
            break
        except co2.MembershipChangedError:
            changes += 1
            kills_seen += comm.world_size < full_world
            stream += 1
            batches = data.batches(args.seed, comm.rank, stream)
    wall = time.perf_counter() - start
    if comm.rank == 0 and not joined:
        with open(args.json, "w") as f:
            json.dump({"final_loss": lm.evaluate(model, data), "steps": trainer.engine.stats()["steps"],
                       "trained": trained, "changes": changes, "losses": kills_seen,
                       "final_world": comm.world_size, "wall_s": wall}, f)
    trainer.close()
    comm.close()
    return 0


def launch(args, seed, churn, out):
    co2run = os.path.join(args.build, "launcher", "co2run")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.abspath(args.build), "bindings", "python"),
               OMP_NUM_THREADS="1", UCX_TLS="tcp", UCX_NET_DEVICES="lo", CO2_LOG_LEVEL="error")
    command = [co2run, "--nproc-per-node", str(args.world), "--elastic", "2",
               "--max-restarts", str(args.steps // args.kill_every + 2),
               PYTHON, "-u", os.path.abspath(__file__), "--rank", "--seed", str(seed),
               "--steps", str(args.steps), "--tau", str(args.tau), "--size", args.size,
               "--kill-every", str(args.kill_every), "--kill-offset", str(args.kill_offset),
               "--json", out] + (["--churn"] if churn else [])
    begun = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"seed {seed} {'churn' if churn else 'steady'}: co2run exited "
                           f"{done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    with open(out) as f:
        result = json.load(f)
    result["launch_s"] = time.perf_counter() - begun
    result["joins"] = result["changes"] - result["losses"]  # as rank 0 saw them
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--steps", type=int, default=480)
    parser.add_argument("--tau", type=int, default=12)
    parser.add_argument("--size", default="small")
    parser.add_argument("--kill-every", type=int, default=48)
    parser.add_argument("--kill-offset", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per launch, seconds")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--churn", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kill_offset % args.tau == 0 or not 0 < args.kill_offset < args.kill_every:
        parser.error("--kill-offset must lie inside a round (not a multiple of --tau) and below --kill-every")
    if args.rank:
        return rank_main(args)
    print(f"# churn, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: LM {args.size}, W {args.world} "
          f"over UCX/TCP loopback, co2 tau {args.tau}, {args.steps} steps; churn: the highest rank "
          f"SIGKILLed at step % {args.kill_every} == {args.kill_offset} while the group is whole, "
          f"restarted by co2run as a joiner; load average {os.getloadavg()[0]:.2f}", flush=True)
    print("| seed | steady loss | churn loss | churn / steady | losses | joins | steps trained twice "
          "(rank 0) | final W | wall steady / churn |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            steady = launch(args, seed, False, os.path.join(scratch, f"steady{seed}.json"))
            churn = launch(args, seed, True, os.path.join(scratch, f"churn{seed}.json"))
            ratio = churn["final_loss"] / steady["final_loss"]
            runs.append({"seed": seed, "steady": steady, "churn": churn, "ratio": ratio})
            print(f"| {seed} | {steady['final_loss']:.4f} | {churn['final_loss']:.4f} | {ratio:.4f} "
                  f"| {churn['losses']} | {churn['joins']} | {churn['trained'] - churn['steps']} "
                  f"| {churn['final_world']} | {steady['wall_s']:.0f} s / {churn['wall_s']:.0f} s |",
                  flush=True)
    ratios = [r["ratio"] for r in runs]
    spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    print(f"# churn / steady: mean {statistics.mean(ratios):.4f} ± {spread:.4f} (std over "
          f"{len(ratios)} seeds), worst {max(ratios):.4f}; load average at the end "
          f"{os.getloadavg()[0]:.2f}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "churn.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "args": vars(args), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

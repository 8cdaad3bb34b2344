#!/usr/bin/python3
"""The table of examples/python/contrast: linear-probe accuracy of MoCo and MoCo + consistency
under torch DDP, co2 `sync` and `co2` (τ 12, eager), mean ± std over seeds, and wall time. One
co2run launch (4 processes) per seed runs the six trainings; rank 0's lines are collected.

    /usr/bin/python3 examples/python/contrast/table.py              # 3 seeds, ~21 min on 2 loaded cores
    /usr/bin/python3 examples/python/contrast/table.py --seeds 1 --steps 100 --out /tmp/x   # smoke

Writes --out/contrast.json (every run, the summary, the command) and prints the table.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)

import train  # noqa: E402

LAUNCH_TIMEOUT_S = 3600      # one seed's six trainings; 7-12 min on 2 loaded cores


def launch(args, seed, out):
    build = os.path.abspath(args.build)
    env = dict(os.environ)
    env.update({"PYTHONPATH": os.path.join(build, "bindings", "python"),
                "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1",
                "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo",
                "CO2_LOG_LEVEL": env.get("CO2_LOG_LEVEL", "warn")})
    command = [os.path.join(build, "launcher", "co2run"), "--nproc-per-node", str(args.world),
               "--master-port", str(args.port), sys.executable, "-u",
               os.path.join(HERE, "train.py"), "--seeds", str(seed), "--steps", str(args.steps),
               "--tau", str(args.tau), "--json", out]
    started = time.monotonic()
    proc = subprocess.run(command, env=env, timeout=LAUNCH_TIMEOUT_S, capture_output=True,
                          text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("[rank 0] seed"):
            print(line[len("[rank 0] "):], flush=True)
    if proc.returncode != 0:
        sys.exit(f"seed {seed}: co2run exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                 f"{proc.stderr[-3000:]}")
    return time.monotonic() - started


def references(seeds):
    """Probe accuracy of raw pixels and of the untrained encoders (per seed): what training must
    beat."""
    import torch
    torch.set_num_threads(1)
    data = train.load_digits()
    raw = train.probe(None, data)
    untrained = []
    for seed in seeds:
        encoder = train.make_encoder(seed)
        encoder.eval()                # fresh running statistics: BatchNorm is the identity
        untrained.append(train.probe(encoder, data))
    return {"raw pixels": {"probe": [raw["probe"]], "probe_few": [raw["probe_few"]]},
            "untrained encoder": {"probe": [r["probe"] for r in untrained],
                                  "probe_few": [r["probe_few"] for r in untrained]}}


def mean_std(values):
    values = [100 * v for v in values]
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(runs):
    summary = {}
    for loss in train.LOSSES:
        for algorithm in train.ALGORITHMS:
            mine = [r for r in runs if r["loss"] == loss and r["algorithm"] == algorithm]
            if not mine:
                continue
            probe, probe_std = mean_std([r["probe"] for r in mine])
            few, few_std = mean_std([r["probe_few"] for r in mine])
            summary[f"{loss} {algorithm}"] = {
                "runs": len(mine), "probe_mean": probe, "probe_std": probe_std,
                "probe_few_mean": few, "probe_few_std": few_std,
                "wall_mean_s": statistics.mean(r["wall_s"] for r in mine),
                "final_nce": statistics.mean(r["curve"]["nce"][-1] for r in mine),
                "key_spread_max": max(r["key_spread"] for r in mine),
                "query_spread_max": max(r["query_spread"] for r in mine)}
    return summary


def print_table(summary, refs, out=sys.stdout):
    print(f"{'run':22} {'n':>2} {'probe %':>14} {'10/class %':>14} {'wall s':>7} "
          f"{'InfoNCE':>8}", file=out)
    for name, row in summary.items():
        print(f"{name:22} {row['runs']:>2} {row['probe_mean']:>7.2f} ± {row['probe_std']:<4.2f} "
              f"{row['probe_few_mean']:>7.2f} ± {row['probe_few_std']:<4.2f} "
              f"{row['wall_mean_s']:>7.1f} {row['final_nce']:>8.3f}", file=out)
    for name, ref in refs.items():
        probe, probe_std = mean_std(ref["probe"])
        few, few_std = mean_std(ref["probe_few"])
        print(f"{'(' + name + ')':22} {len(ref['probe']):>2} {probe:>7.2f} ± {probe_std:<4.2f} "
              f"{few:>7.2f} ± {few_std:<4.2f} {'-':>7} {'-':>8}", file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=train.STEPS)
    parser.add_argument("--tau", type=int, default=train.CO2_CONFIG["tau"])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--port", type=int, default=29400 + os.getpid() % 500 * 2,
                        help="co2's store port (gloo takes the next)")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            path = os.path.join(tmp, f"seed{seed}.jsonl")
            launch(args, seed, path)
            with open(path) as f:
                runs += [json.loads(line) for line in f]
    summary = summarize(runs)
    refs = references(range(args.seeds))
    print(f"# contrast on digits, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"W={args.world}, {args.steps} steps of {train.BATCH} per rank, co2 τ {args.tau} "
          f"eager, seeds 0-{args.seeds - 1}; {time.monotonic() - started:.0f} s")
    print_table(summary, refs)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "contrast.json"), "w") as f:
        json.dump({"command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
                   "steps": args.steps, "world": args.world, "tau": args.tau,
                   "seeds": list(range(args.seeds)), "summary": summary,
                   "references": refs, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""Sharded and hierarchical co2 on shaped links (issue 16): throughput as a ratio to the
compute-only loop measured in the same invocation, timed-wait step (like run.py's primary table).

    /usr/bin/python3 bench/overlap/hierarchy.py [--rates 100mbit,1gbit] [--taus 12,48]
        [--nodes 2] [--ranks-per-node 2] [--params 400000] [--repeats 3] [--seconds 1.5]

K nodes x L ranks, one process per rank, each in its own network namespace
(bench/overlap/netns.sh --nodes K): the ranks of a node share an uncapped bridge, each node's
uplink is capped at the rate (tc tbf, both directions), so only traffic between nodes is capped.
Rows, all over the K * L ranks:
  co2 flat       every rank an outer participant, replicated outer state
  co2 sharded    the same, shard_outer_state = 1
  co2 hier       hierarchy = nodes: the gradient is averaged inside the node every step
                 (co2_engine_reduce_gradients over the uncapped links, part of the step), co2's
                 outer all-reduce runs across the nodes, its state sharded over the node's ranks
GROUP_RANK (the node index) is set per rank, as co2run --nnodes sets it. Each repeat measures
compute-only and then every row once; a row's ratio is its steps/s over that repeat's
compute-only, the table gives the median over repeats and the range.

Writes OUT/hierarchy.json (every run) and prints the table.
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
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import run as overlap  # noqa: E402  (launcher, netns, aggregation)

ROWS = (("co2 flat", []), ("co2 sharded", ["--shard"]), ("co2 hier", ["--hierarchy", "nodes"]))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def inner(args):
    """Inside netns.sh: every repeat of every row at this rate."""
    prefix, rate = os.environ["CO2_NETNS_PREFIX"], os.environ["CO2_NETNS_RATE"]
    world = int(os.environ["CO2_NETNS_RANKS"])
    per_node = world // int(os.environ["CO2_NETNS_NODES"])
    runner = overlap.Runner(args, "netns", world, rate, prefix)
    # The flat ring's time on the capped link sizes the run length (the hierarchical one's is
    # shorter); an underestimate only makes a run shorter, never wrong.
    ar_s = overlap.ring_seconds(args.params, world, overlap.link_bytes_per_s(rate, "netns"))
    step_s = args.step_ms / 1e3
    out = []

    def one(name, algo, tau, extra):
        steps, warmup = overlap.plan_steps(algo, tau, step_s, ar_s, args.seconds)
        argv = [runner.overlap, "--mode", "process", "--algo", algo, "--tau", str(tau),
                "--params", str(args.params), "--step-us", str(int(args.step_ms * 1000)),
                "--steps", str(steps), "--warmup-steps", str(warmup),
                "--timeout-ms", str(int(args.timeout * 1000))] + extra
        timeout = args.timeout + steps * (step_s + ar_s) * 3
        lines = runner._launch(lambda r: ["env", f"GROUP_RANK={r // per_node}"] + argv, timeout)
        r = overlap.aggregate(lines)
        r.update(name=name, rate=rate, repeat=rep, nodes=world // per_node, ranks_per_node=per_node)
        out.append(r)
        log(f"  {rate} repeat {rep} {name:<12} tau {tau:>3}: {r['steps_per_s']:.2f} steps/s")

    for rep in range(args.repeats):
        one("compute-only", "none", 1, [])
        for tau in args.taus:
            for name, extra in ROWS:
                one(name, "co2", tau, extra)
    with open(args.inner_out, "w") as f:
        json.dump(out, f)
    return 0


def table(results, args):
    lines = []
    for rate in args.rates:
        mine = [r for r in results if r["rate"] == rate]
        if not mine:
            lines.append(f"{rate}: no results")
            continue
        base = {r["repeat"]: r["steps_per_s"] for r in mine if r["name"] == "compute-only"}
        lines.append(f"inter-node link {rate}, {args.nodes} nodes x {args.ranks_per_node} ranks, "
                     f"N = {args.params:,} fp32, step {args.step_ms:g} ms; compute-only "
                     f"{statistics.median(base.values()):.2f} steps/s (median of {len(base)})")
        lines.append(f"    {'row':<14}" + "".join(f"  tau={t:<18}" for t in args.taus))
        for name, _ in ROWS:
            cells = []
            for tau in args.taus:
                ratios = sorted(r["steps_per_s"] / base[r["repeat"]] for r in mine
                                if r["name"] == name and r["tau"] == tau and r["repeat"] in base)
                cells.append(f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})"
                             if ratios else "-")
            lines.append(f"    {name:<14}" + "".join(f"  {c:<22}" for c in cells))
        lines.append("")
    return "\n".join(lines)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100mbit,1gbit")
    ap.add_argument("--taus", default="12,48")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--params", type=int, default=400_000)
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=1.5, help="target length of one run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0, help="per run, seconds")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.taus = [int(t) for t in args.taus.split(",")]
    args.rates = args.rates.split(",")
    for rate in args.rates:
        if rate not in overlap.RATES_BITS:
            ap.error(f"--rates: {rate} is not one of {', '.join(overlap.RATES_BITS)}")
    if args.nodes < 2 or args.ranks_per_node < 1 or args.repeats < 1:
        ap.error("--nodes >= 2, --ranks-per-node >= 1, --repeats >= 1")
    return args


def main(argv):
    args = parse_args(argv)
    if args.inner:
        return inner(args)
    if not os.access(os.path.join(args.build, "bench", "overlap", "overlap"), os.X_OK):
        log("the overlap program is missing: ninja -C build overlap-bench")
        return 2
    if not overlap.netns_available():
        log("needs network namespaces (root): skipped")
        return 77
    started = time.monotonic()
    results = []
    for rate in args.rates:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        try:
            cmd = ["bash", overlap.NETNS, "run", "--ranks", str(args.nodes * args.ranks_per_node),
                   "--nodes", str(args.nodes), "--rate", rate, "--prefix", f"co2h{os.getpid() % 1000}",
                   "--", overlap.PYTHON, os.path.abspath(__file__), "--inner", "--inner-out", path,
                   "--build", args.build, "--params", str(args.params), "--step-ms", str(args.step_ms),
                   "--seconds", str(args.seconds), "--repeats", str(args.repeats),
                   "--timeout", str(args.timeout), "--taus", ",".join(map(str, args.taus))]
            if subprocess.run(cmd).returncode != 0:
                log(f"rate {rate}: failed")
                continue
            with open(path) as f:
                results += json.load(f)
        finally:
            os.unlink(path)
    load = os.getloadavg()
    text = table(results, args)
    header = (f"# sharded / hierarchical co2, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{os.cpu_count()} cores, load average at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
              f"{time.monotonic() - started:.0f} s")
    print(header)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "hierarchy.json"), "w") as f:
        json.dump({"header": header, "command": " ".join(sys.argv), "params": args.params,
                   "step_ms": args.step_ms, "taus": args.taus, "results": results}, f, indent=1)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

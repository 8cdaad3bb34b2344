#!/usr/bin/python3
"""co2's throughput against compute-only per wire format of the outer all-reduce (fp32, bf16,
int8) on a rate-capped link: the smallest tau that keeps >= 0.95 of compute-only, and the ratio
at tau = 12 (docs/benchmarks.md, "Wire formats").

    /usr/bin/python3 bench/overlap/wire_formats.py [--rate 100mbit] [--world 2]
        [--taus 2,3,4,6,8,12,16,24,32] [--formats fp32,bf16,int8] [--step-ms 10]
        [--seconds 1.5] [--target-steps 20] [--out bench/results]

The model is sized as bench/overlap/run.py sizes it (one fp32 all-reduce ~ --target-steps steps
on the link), the step is a timed wait (a GPU step as the host sees it), and each rank runs in its
own network namespace with its link capped by tc tbf (bench/overlap/netns.sh; needs root), co2
over UCX/TCP. Compute-only runs bracket every format's rows; each row is divided by the faster
of the two around it. With --repeats R the whole sweep runs R times and the table shows, per
format and tau, the median of the R ratios (a shared machine's load moves single runs by tens of
percent). Writes OUT/overlap_wire.json.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import run as overlap  # noqa: E402  (the launcher, netns and sizing of bench/overlap/run.py)

PYTHON = "/usr/bin/python3"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def runner_args(args):
    return types.SimpleNamespace(build=args.build, step_ms=args.step_ms, seconds=args.seconds,
                                 timeout=args.timeout, target_steps=args.target_steps,
                                 max_params=args.max_params)


def inner(args):
    """Inside the namespaces: every run; writes the rows to --inner-out."""
    prefix, rate = os.environ["CO2_NETNS_PREFIX"], os.environ["CO2_NETNS_RATE"]
    world = int(os.environ["CO2_NETNS_RANKS"])
    rargs = runner_args(args)
    runner = overlap.Runner(rargs, "netns", world, rate, prefix)
    params = overlap.size_params(rargs, world, rate, "netns")
    rows = []

    def reference():
        r = overlap.aggregate(runner.overlap_run("none", 1, params, "wait", 0))
        log(f"  compute-only {r['steps_per_s']:8.2f} steps/s")
        return r

    for repeat, wire in [(k, w) for k in range(args.repeats) for w in args.formats]:
        before = reference()
        mine = []
        for tau in args.taus:
            r = overlap.aggregate(runner.overlap_run("co2", tau, params, "wait", 0,
                                                     extra=["--wire-format", wire]))
            r.update(wire_format=wire, rate=rate, world=world, repeat=repeat)
            mine.append(r)
            log(f"  {wire} tau={tau:<3} {r['steps_per_s']:8.2f} steps/s  all-reduce "
                f"{r['allreduce_time_ms']:.1f} ms, advised tau {r['advised_tau']}, "
                f"{r.get('wire_bytes_per_round', 0)} B/round")
        after = reference()
        for r in mine:
            r["reference_steps_per_s"] = max(before["steps_per_s"], after["steps_per_s"])
            r["ratio"] = r["steps_per_s"] / r["reference_steps_per_s"]
        rows += mine
    with open(args.inner_out, "w") as f:
        json.dump({"params": params, "rows": rows}, f)
    return 0


def report(args, result, out=sys.stdout):
    rows, params = result["rows"], result["params"]
    print(f"# co2 per wire format, {args.rate} per rank link, W={args.world}, N={params:,} "
          f"parameters, {args.step_ms:g} ms timed-wait steps, median of {args.repeats} sweep(s)",
          file=out)
    print(f"{'format':>6} {'all-reduce ms':>13} {'advised tau':>11} {'smallest tau >= 0.95':>21} "
          f"{'ratio at tau=12':>15}   ratio per tau", file=out)
    summary = {}
    for wire in args.formats:
        runs = [r for r in rows if r["wire_format"] == wire]
        if not runs:
            continue
        mine = []  # per tau: the run with the median ratio
        for tau in sorted({r["tau"] for r in runs}):
            at = sorted((r for r in runs if r["tau"] == tau), key=lambda r: r["ratio"])
            mine.append(at[len(at) // 2])
        ok = [r["tau"] for r in mine if r["ratio"] >= 0.95]
        at12 = next((r["ratio"] for r in mine if r["tau"] == 12), None)
        ar = sorted(r["allreduce_time_ms"] for r in mine)[len(mine) // 2]
        advised = sorted(r["advised_tau"] for r in mine)[len(mine) // 2]
        per_tau = " ".join(f"{r['tau']}:{r['ratio']:.3f}" for r in mine)
        smallest = min(ok) if ok else None
        print(f"{wire:>6} {ar:>13.1f} {advised:>11} {str(smallest or '-'):>21} "
              f"{(f'{at12:.3f}' if at12 is not None else '-'):>15}   {per_tau}", file=out)
        summary[wire] = {"allreduce_ms_median": ar, "smallest_tau_095": smallest, "ratio_tau12": at12}
    return summary


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--taus", default="2,3,4,6,8,12,16,24,32")
    ap.add_argument("--formats", default="fp32,bf16,int8")
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=1.5, help="target length of one run")
    ap.add_argument("--target-steps", type=float, default=20.0,
                    help="size the model so that one fp32 all-reduce takes about this many steps")
    ap.add_argument("--max-params", type=int, default=4_000_000)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--inner-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.taus = [int(t) for t in args.taus.split(",")]
    args.formats = args.formats.split(",")
    if args.inner_out:
        return inner(args)
    if not overlap.netns_available():
        log("wire_formats.py needs network namespaces (root): skipped")
        return 77
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    try:
        started = time.monotonic()
        passthrough = [a for a in argv]
        rc = subprocess.run(["bash", overlap.NETNS, "run", "--ranks", str(args.world), "--rate",
                             args.rate, "--prefix", f"co2w{os.getpid() % 1000}", "--", PYTHON,
                             os.path.abspath(__file__), "--inner-out", path] + passthrough).returncode
        if rc != 0:
            log(f"the namespace run failed with exit {rc}")
            return 1
        with open(path) as f:
            result = json.load(f)
    finally:
        os.unlink(path)
    summary = report(args, result)
    print(f"# {time.monotonic() - started:.0f} s, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overlap_wire.json"), "w") as f:
        json.dump({"command": " ".join([sys.argv[0]] + argv), "rate": args.rate, "world": args.world,
                   "step_ms": args.step_ms, "summary": summary, **result}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

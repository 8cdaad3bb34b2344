#!/usr/bin/python3
"""Throughput under limited bandwidth: co2 against sync (DDP), torch DDP (gloo), localsgd and
diloco, each as a ratio to the compute-only loop measured in the same invocation.

    /usr/bin/python3 bench/overlap/run.py [--transport auto|netns|model|loopback] [--quick]

Transports (where the co2 ranks run):
  netns     one process per rank, each in its own network namespace on a bridge, every link
            capped with tc tbf (bench/overlap/netns.sh); co2 over its multi-process transport
            (UCX over TCP). Needs root and a build with the multi-process transport.
  model     the co2 ranks are threads of one process on the local transport, whose link model
            (CO2_LOCAL_TEST_BANDWIDTH: bytes/s per directed link) stands in for the cap. torch
            DDP still runs as processes in namespaces where the privilege exists.
  loopback  one process per rank on 127.0.0.1, no cap (the smoke test).
  auto      netns when possible, else model.

Primary table: the step is a timed wait (a GPU step as the host sees it). Secondary (--burn):
the step burns CPU for the same time, competing with the progress threads for the 2 cores.
--digits (W = 2 only, like --burn): the step is the digits example's MLP in PyTorch on the CPU
(bench/overlap/digits_rank.py), its width sized per link; --only-digits runs just that table.

Writes OUT/overlap.json (every rank's line) and OUT/overlap_ratio.png.
"""

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PYTHON = "/usr/bin/python3"
NETNS = os.path.join(HERE, "netns.sh")
DDP = os.path.join(HERE, "ddp_gloo.py")
DIGITS = os.path.join(HERE, "digits_rank.py")
# Hidden widths whose step time is calibrated; the digits table picks its model among them.
DIGITS_WIDTHS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)

RATES_BITS = {"10mbit": 10e6, "100mbit": 100e6, "1gbit": 1e9, "none": None}
RATE_LABELS = {"10mbit": "10 Mbit/s", "100mbit": "100 Mbit/s", "1gbit": "1 Gbit/s", "none": "uncapped"}
# Uncapped veth carries about 2.8 Gbit/s of TCP here (iperf3, docs/benchmarks.md); the local
# transport's link model without a cap is a memcpy.
UNCAPPED_TCP_BYTES = 2.5e9 / 8
TCP_EFFICIENCY = 0.94  # payload / line rate through tbf (iperf3: 95.6 of 100 Mbit/s)
ALGOS_TAU = ("localsgd", "diloco", "co2")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def link_bytes_per_s(rate, transport):
    bits = RATES_BITS[rate]
    if bits is None:
        return UNCAPPED_TCP_BYTES if transport != "model" else None
    return bits / 8 * TCP_EFFICIENCY


def ring_seconds(params, world, bytes_per_s):
    """Time of one ring all-reduce of params fp32 if only the link counted."""
    if not bytes_per_s or world < 2:
        return 0.0
    return 2 * (world - 1) / world * 4 * params / bytes_per_s


def size_params(args, world, rate, transport):
    """N such that one all-reduce takes about args.target_steps steps: with tau in {4,12,48}
    that puts all-reduce / (tau steps) near 5, 1.7 and 0.4, both sides of the hiding line."""
    bps = link_bytes_per_s(rate, transport)
    if bps is None:
        return args.max_params
    target = args.target_steps * args.step_ms / 1e3
    n = target * bps / (2 * (world - 1) / world * 4)
    return int(max(1024, min(args.max_params, n)))


def mlp_params(hidden, depth=2):
    """Parameters of the digits MLP 64 -> hidden (x depth) -> 10 (examples/python/digits.py
    has depth 2)."""
    return 64 * hidden + hidden + (depth - 1) * (hidden * hidden + hidden) + 10 * hidden + 10


def size_digits(args, world, rate, transport):
    """(hidden width, all-reduce in steps): the narrowest calibrated MLP whose all-reduce takes
    about args.target_steps of its own steps. Both grow with the width (the step is O(N) too),
    so on fast links no width gets there: then the narrowest within 10 % of the most steps any
    width reaches. Uncapped: the widest (the host CPU, not the link, limits there)."""
    step_ms = args.digits_step_ms
    widths = sorted(step_ms)
    bps = link_bytes_per_s(rate, transport)
    if rate == "none" or bps is None:
        h = widths[-1]
        return h, ring_seconds(mlp_params(h, args.digits_depth), world, bps) * 1e3 / step_ms[h]
    ratio = {h: ring_seconds(mlp_params(h, args.digits_depth), world, bps) * 1e3 / step_ms[h] for h in widths}
    for h in widths:
        if ratio[h] >= args.target_steps:
            return h, ratio[h]
    most = max(ratio.values())
    h = next(h for h in widths if ratio[h] >= 0.9 * most)
    return h, ratio[h]


def plan_steps(algo, tau, step_s, ar_s, seconds):
    """(steps, warmup) so that a run lasts about `seconds` and has >= 3 measured rounds."""
    if algo in ("none",):
        n = max(8, math.ceil(seconds / step_s))
        return n + 1, 1
    if algo in ("sync", "sync-step", "ddp"):
        n = max(4, math.ceil(seconds / (step_s + ar_s)))
        return n + 2, 2
    round_s = max(tau * step_s, ar_s) if algo == "co2" else tau * step_s + ar_s
    rounds = max(3, math.ceil(seconds / round_s))
    return (rounds + 1) * tau, tau


class Runner:
    def __init__(self, args, transport, world, rate, netns_prefix=None):
        self.args = args
        self.transport = transport
        self.world = world
        self.rate = rate
        self.prefix = netns_prefix
        self.port = 29400 + (os.getpid() % 200) * 10
        self.overlap = os.path.join(args.build, "bench", "overlap", "overlap")

    def next_port(self):
        self.port += 1
        return self.port

    def _rank_env(self, rank, port, iface):
        env = dict(os.environ)
        env.update(RANK=str(rank), WORLD_SIZE=str(self.world), LOCAL_RANK="0",
                   LOCAL_WORLD_SIZE="1", MASTER_PORT=str(port))
        env.pop("CO2_LOCAL_TEST_BANDWIDTH", None)
        if self.prefix:
            env["MASTER_ADDR"] = os.environ["CO2_NETNS_ADDR_0"]
            env.update(UCX_TLS="tcp", UCX_NET_DEVICES=iface, GLOO_SOCKET_IFNAME=iface)
        else:
            env.update(MASTER_ADDR="127.0.0.1", UCX_TLS="tcp", UCX_NET_DEVICES="lo",
                       GLOO_SOCKET_IFNAME="lo")
        return env

    def _launch(self, argv_of_rank, timeout, extra_env=None, ports=1):
        """Starts one process per rank (in its namespace when there is one); returns the
        parsed JSON lines, or raises with the ranks' stderr. `ports`: how many consecutive
        ports from MASTER_PORT the ranks use."""
        port = self.next_port()
        self.port += ports - 1
        procs = []
        for r in range(self.world):
            iface = (os.environ.get("CO2_NETNS_IFACE_PATTERN", "eth%d") % r) if self.prefix else "lo"
            cmd = argv_of_rank(r)
            if self.prefix:
                cmd = ["ip", "netns", "exec", f"{self.prefix}r{r}"] + cmd
            env = self._rank_env(r, port, iface)
            env.update(extra_env or {})
            procs.append(subprocess.Popen(cmd, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        deadline = time.monotonic() + timeout
        outputs = []
        failed = None
        for p in procs:
            try:
                out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    if q.poll() is None:
                        q.kill()
                out, err = p.communicate()
                failed = failed or f"timed out after {timeout} s"
            outputs.append((p.returncode, out, err))
        if any(rc == 77 for rc, _, _ in outputs):
            raise Unsupported(next(err for rc, _, err in outputs if rc == 77).strip())
        bad = [(i, rc, err) for i, (rc, _, err) in enumerate(outputs) if rc != 0]
        if failed or bad:
            detail = "; ".join(f"rank {i} exit {rc}: {err.strip()[-400:]}" for i, rc, err in bad)
            raise RuntimeError(f"{failed or 'a rank failed'}: {detail}")
        return [json.loads(line) for _, out, _ in outputs for line in out.splitlines() if line.startswith("{")]

    def overlap_run(self, algo, tau, params, work, burn_iters, extra=()):
        step_s = self.args.step_ms / 1e3
        ar_s = ring_seconds(params, self.world, link_bytes_per_s(self.rate, self.transport))
        steps, warmup = plan_steps(algo, tau, step_s, ar_s, self.args.seconds)
        argv = [self.overlap, "--algo", algo, "--tau", str(tau), "--params", str(params),
                "--step-us", str(int(self.args.step_ms * 1000)), "--work", work,
                "--steps", str(steps), "--warmup-steps", str(warmup),
                "--timeout-ms", str(int(self.args.timeout * 1000))]
        if work == "burn":
            argv += ["--burn-iters", str(burn_iters)]
        argv += list(extra)  # e.g. --wire-format (bench/overlap/wire_formats.py)
        timeout = self.args.timeout + steps * (step_s + ar_s) * 3
        if self.transport == "model" or algo == "none":
            bps = link_bytes_per_s(self.rate, "model")
            argv += ["--mode", "threads", "--world", str(self.world),
                     "--bandwidth", str(int(bps or 0))]
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"overlap {algo} exit {proc.returncode}: {proc.stderr.strip()[-600:]}")
            return [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
        return self._launch(lambda r: argv + ["--mode", "process"], timeout)

    def ddp_run(self, params):
        step_s = self.args.step_ms / 1e3
        ar_s = ring_seconds(params, self.world, link_bytes_per_s(self.rate, "netns"))
        steps, warmup = plan_steps("ddp", 1, step_s, ar_s, self.args.seconds)
        argv = [PYTHON, DDP, "--params", str(params), "--step-us", str(int(self.args.step_ms * 1000)),
                "--steps", str(steps), "--warmup-steps", str(warmup),
                "--timeout-s", str(int(self.args.timeout))]
        return self._launch(lambda r: argv, self.args.timeout + 30 + steps * (step_s + ar_s) * 3)

    def digits_run(self, hidden, plan, step_s, ar_s, want_ddp):
        """The digits table's runs at one rate in one launch (torch takes seconds to start):
        returns the aggregated results, in plan order."""
        spec = ",".join(f"{a}:{t}:{n}:{w}" for a, t, n, w in plan)
        argv = [PYTHON, DIGITS, "--hidden", str(hidden), "--plan", spec,
                "--timeout-s", str(int(self.args.timeout)), "--depth", str(self.args.digits_depth)]
        if self.args.digits_bucket_mb is not None:
            argv += ["--bucket-mb", str(self.args.digits_bucket_mb)]
        env = digits_env(self.args)
        timeout = self.args.timeout + 60 + sum(n * (step_s + ar_s) * 3 for _, _, n, _ in plan)
        if self.transport == "model":
            bps = link_bytes_per_s(self.rate, "model")
            if bps:
                env["CO2_LOCAL_TEST_BANDWIDTH"] = str(int(bps))
            else:
                env.pop("CO2_LOCAL_TEST_BANDWIDTH", None)
            proc = subprocess.run(argv + ["--mode", "threads", "--world", str(self.world)],
                                  env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                raise RuntimeError(f"digits exit {proc.returncode}: "
                                   f"{proc.stderr.strip()[-600:]}")
            lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
        else:  # co2 at MASTER_PORT, gloo at MASTER_PORT + 1
            lines = self._launch(lambda r: argv, timeout, ports=2, extra_env={
                k: env[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")})
        # Every rank prints its runs in plan order: the i-th line of each rank is run i.
        per_rank = {}
        for line in lines:
            per_rank.setdefault(line["rank"], []).append(line)
        if len(per_rank) != self.world or any(len(v) != len(plan) for v in per_rank.values()):
            raise RuntimeError(f"digits: expected {len(plan)} results from each of "
                               f"{self.world} ranks")
        return [aggregate([per_rank[r][i] for r in per_rank]) for i in range(len(plan))]


def digits_env(args):
    """The environment digits_rank.py needs: the co2 package assembled in the build."""
    env = dict(os.environ)
    package = os.path.join(os.path.abspath(args.build), "bindings", "python")
    env["PYTHONPATH"] = package + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def calibrate_digits(args):
    """ms per digits step of one rank alone, per hidden width; None where digits_rank.py cannot
    run (no Python binding in this build)."""
    widths = [w for w in DIGITS_WIDTHS if w <= args.digits_max_hidden] or [args.digits_max_hidden]
    proc = subprocess.run([PYTHON, DIGITS, "--calibrate", ",".join(map(str, widths)),
                           "--depth", str(args.digits_depth)],
                          env=digits_env(args), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        log(f"digits: skipped: digits_rank.py --calibrate exited {proc.returncode}: "
            f"{proc.stderr.strip()[-400:]}")
        return None
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if not lines:
        log(f"digits: skipped: digits_rank.py --calibrate printed no result: {proc.stdout[-400:]}")
        return None
    return {int(h): ms for h, ms in json.loads(lines[0])["step_ms"].items()}


def run_digits_config(args, runner, transport, world, rate, want_ddp):
    """The digits table at one (world, rate)."""
    hidden, ar_steps = size_digits(args, world, rate, transport)
    params = mlp_params(hidden, args.digits_depth)
    step_s = args.digits_step_ms[hidden] / 1e3
    ar_s = ring_seconds(params, world, link_bytes_per_s(rate, transport))
    log(f"W={world} rate={rate} work=digits: hidden {hidden}, N={params} "
        f"(one all-reduce ~ {ar_steps:.1f} steps of {step_s * 1e3:.2f} ms alone) ({transport})")
    if args.ddp and not want_ddp:
        log("  ddp: not in the digits table here (it needs one process per rank: netns or "
            "loopback)")
    # PyTorch steps on 2 shared cores drift by tens of percent within a minute, so compute-only
    # runs bracket every group of rows, and each row is divided by the faster of the two
    # compute-only runs around it (pairing in time, as the other tables do once per rate).
    # The every-step rows side by side, --digits-sync-repeats times (their ratios: the median).
    plan = [("none", 1)] + ([("sync", 1), ("sync-step", 1)] + ([("ddp", 1)] if want_ddp else [])
                            + [("none", 1)]) * args.digits_sync_repeats
    for tau in args.taus:
        plan += [(algo, tau) for algo in ALGOS_TAU] + [("none", 1)]
    plan = [(a, t) + plan_steps(a, t, step_s, ar_s, args.digits_seconds) for a, t in plan]
    try:
        rows = runner.digits_run(hidden, plan, step_s, ar_s, want_ddp)
    except Exception as e:  # the other tables stand without it
        log(f"  digits: FAILED: {e}")
        return []
    before = None
    for i, (r, (algo, tau, _, _)) in enumerate(zip(rows, plan)):
        r.update(transport=transport, rate=rate, world=world)
        if algo == "none":
            before = r
        else:
            after = next(x for x, (a, *_) in zip(rows[i:], plan[i:]) if a == "none")
            r["reference_steps_per_s"] = max(before["steps_per_s"], after["steps_per_s"])
        name = f"{algo} tau={tau}" if algo in ALGOS_TAU else algo
        log(f"  {name:<22} {r['steps_per_s']:8.2f} steps/s"
            + (f"  all-reduce {r['allreduce_time_ms']:.1f} ms, advised tau {r['advised_tau']}"
               if r.get("advised_tau") else ""))
    return rows


class Unsupported(Exception):
    pass


def aggregate(lines):
    """The group's throughput is its slowest rank's, and so are its engine and wake-up times (a
    faster rank's time in the engine is mostly waiting for the slowest); the link figures are
    the largest any rank saw."""
    slowest = min(lines, key=lambda d: d["steps_per_s"])
    out = dict(slowest)
    out["ranks"] = len(lines)
    for key in ("allreduce_time_ms", "step_time_ms", "advised_tau"):
        vals = [d[key] for d in lines if key in d]
        if vals:
            out[key] = max(vals)
    return out


def run_config(args, transport, world, rate, works, burn_iters, want_ddp, prefix):
    """Every algorithm at one (world, rate): a list of aggregated results."""
    runner = Runner(args, transport, world, rate, prefix)
    params = size_params(args, world, rate, transport)
    results = []

    def record(kind, fn):
        try:
            r = aggregate(fn())
        except Unsupported as e:
            log(f"  {kind}: skipped ({e})")
            return None
        except Exception as e:  # one failed run does not lose the table
            log(f"  {kind}: FAILED: {e}")
            return None
        r.update(transport=transport, rate=rate, world=world)
        results.append(r)
        log(f"  {kind:<22} {r['steps_per_s']:8.2f} steps/s"
            + (f"  all-reduce {r['allreduce_time_ms']:.1f} ms, advised tau {r['advised_tau']}"
               if r.get("advised_tau") else ""))
        return r

    for work in works:
        if work == "digits":
            results += run_digits_config(args, runner, transport, world, rate,
                                         args.ddp and transport != "model")
            continue
        log(f"W={world} rate={rate} N={params} work={work} ({transport})")
        record("none", lambda: runner.overlap_run("none", 1, params, work, burn_iters))
        record("sync", lambda: runner.overlap_run("sync", 1, params, work, burn_iters))
        if want_ddp and work == "wait":
            record("ddp (torch, gloo)", lambda: runner.ddp_run(params))
        for tau in args.taus:
            for algo in ALGOS_TAU:
                record(f"{algo} tau={tau}",
                       lambda a=algo, t=tau: runner.overlap_run(a, t, params, work, burn_iters))
        # The machine is shared: compute-only once more at the end, and the faster of the two is
        # the reference (so a ratio is never flattered by a slow reference run).
        record("none (again)", lambda: runner.overlap_run("none", 1, params, work, burn_iters))
    return results


def ratio_of(row, base):
    """Throughput over compute-only: over the compute-only runs that bracket the row where it
    has them (the digits table), else over the rate's reference."""
    return row["steps_per_s"] / row.get("reference_steps_per_s", base["steps_per_s"])


def reference_text(rows, base):
    refs = [r["steps_per_s"] for r in rows if r["algo"] == "none"]
    if any("reference_steps_per_s" in r for r in rows):
        return (f"{min(refs):.2f}-{max(refs):.2f} steps/s over {len(refs)} runs "
                f"(each row over the faster of the two around it)")
    return f"{base['steps_per_s']:.2f} steps/s"


def best_reference(rows):
    """The compute-only reference of a group of rows: the fastest of its runs."""
    refs = [r for r in rows if r["algo"] == "none"]
    return max(refs, key=lambda r: r["steps_per_s"]) if refs else None


def inner_main(args):
    """Runs inside netns.sh: the namespaces exist; writes the results to --inner-out."""
    prefix = os.environ["CO2_NETNS_PREFIX"]
    world = int(os.environ["CO2_NETNS_RANKS"])
    rate = os.environ["CO2_NETNS_RATE"]
    works = args.inner_works.split(",")
    results = []
    if args.inner_co2:
        results += run_config(args, "netns", world, rate, works, args.burn_iters, args.ddp, prefix)
    elif args.ddp:  # DDP only, beside co2 ranks on the link model
        runner = Runner(args, "netns", world, rate, prefix)
        params = size_params(args, world, rate, "model")
        try:
            r = aggregate(runner.ddp_run(params))
            r.update(transport="netns", rate=rate, world=world)
            results.append(r)
            log(f"  ddp (torch, gloo, netns) {r['steps_per_s']:8.2f} steps/s")
        except Exception as e:
            log(f"  ddp: FAILED: {e}")
    with open(args.inner_out, "w") as f:
        json.dump(results, f)
    return 0


def netns_available():
    return subprocess.run(["bash", NETNS, "check"], capture_output=True).returncode == 0


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def multiprocess_transport_built(args):
    """Whether co2_comm_create(AUTO) joins separate processes: two ranks of a tiny run on
    loopback must meet (a build without it answers 77, or its ranks never meet)."""
    overlap = os.path.join(args.build, "bench", "overlap", "overlap")
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   UCX_TLS="tcp", UCX_NET_DEVICES="lo")
        env.pop("CO2_LOCAL_TEST_BANDWIDTH", None)
        procs.append(subprocess.Popen(
            [overlap, "--mode", "process", "--algo", "co2", "--tau", "1", "--params", "16",
             "--step-us", "0", "--steps", "2", "--warmup-steps", "1", "--timeout-ms", "5000"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    codes, errors = [], []
    for p in procs:
        try:
            _, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        codes.append(p.returncode)
        errors.append(err.strip())
    if all(c == 0 for c in codes):
        return True
    if not any(c == 77 for c in codes):
        log("multi-process probe: the ranks did not meet: " + " | ".join(e[-300:] for e in errors if e))
    return False


def in_netns(args, world, rate, inner_args):
    """Runs this script's inner mode inside freshly made namespaces; returns its results."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        path = tmp.name
    try:
        cmd = ["bash", NETNS, "run", "--ranks", str(world), "--rate", rate, "--prefix",
               f"co2b{os.getpid() % 1000}", "--", PYTHON, os.path.abspath(__file__), "--inner",
               "--inner-out", path] + inner_args
        rc = subprocess.run(cmd).returncode
        if rc != 0:
            log(f"netns run W={world} rate={rate} failed with exit {rc}")
            return []
        with open(path) as f:
            return json.load(f)
    finally:
        os.unlink(path)


def common_args(args):
    out = ["--build", args.build, "--step-ms", str(args.step_ms), "--seconds", str(args.seconds),
           "--digits-seconds", str(args.digits_seconds),
           "--target-steps", str(args.target_steps), "--max-params", str(args.max_params),
           "--timeout", str(args.timeout), "--taus", ",".join(map(str, args.taus)),
           "--burn-iters", str(args.burn_iters),
           "--digits-max-hidden", str(args.digits_max_hidden),
           "--digits-depth", str(args.digits_depth),
           "--digits-sync-repeats", str(args.digits_sync_repeats)]
    if args.digits_bucket_mb is not None:
        out += ["--digits-bucket-mb", str(args.digits_bucket_mb)]
    if args.digits_step_ms:
        out += ["--digits-step-ms",
                ",".join(f"{h}:{ms:.6f}" for h, ms in args.digits_step_ms.items())]
    return out + (["--ddp"] if args.ddp else ["--no-ddp"])


def fmt_ratio(r):
    return f"{r:6.3f}" if r is not None else "     -"


TITLES = {
    "wait": "timed wait (a GPU step as the host sees it) -- the primary table",
    "burn": "CPU burn (compute competes with communication for 2 cores)",
    "digits": "the digits MLP (PyTorch on the CPU; compute competes with communication for the "
              "2 cores)",
}


def tables(results, args):
    lines = []
    order = list(TITLES)
    keys = sorted({(r["work"], r["world"]) for r in results}, key=lambda k: (order.index(k[0]), k[1]))
    for work, world in keys:
        lines.append(f"\n### W = {world}, step = {TITLES[work]}\n")
        for rate in RATES_BITS:
            rows = [r for r in results if r["work"] == work and r["world"] == world and r["rate"] == rate]
            base = best_reference(rows)
            if not base:
                continue
            def get(algo, tau=None):
                for r in rows:
                    if r["algo"] == algo and (tau is None or r["tau"] == tau):
                        return r
                return None
            transports = sorted({r["transport"] for r in rows if r["algo"] not in ("none", "ddp")})
            ar_ms = max((r.get("allreduce_time_ms", 0) for r in rows if r["algo"] in ALGOS_TAU), default=0)
            # "One all-reduce takes less than tau steps" counts steps of the model alone (the
            # compute-only step), not the engine's measured steps, which the communication's
            # own CPU time lengthens on these 2 cores.
            step_ms = 1e3 / base["steps_per_s"]
            engine_step_ms = max((r.get("step_time_ms", 0) for r in rows if r["algo"] in ALGOS_TAU), default=0)
            advised = get("co2", args.taus[-1])
            width = f" (hidden {base['hidden']})" if "hidden" in base else ""
            if base.get("depth", 2) != 2:
                width = f" (hidden {base['hidden']} x {base['depth']} layers)"
            lines.append(f"rate {rate}, N = {base['params']:,} fp32 ({base['params'] * 4 / 1e6:.1f} MB){width}, "
                         f"co2 over {', '.join(transports) or '-'}; compute-only {reference_text(rows, base)}")
            if ar_ms:
                lines.append(f"measured: one all-reduce {ar_ms:.1f} ms = {ar_ms / step_ms:.1f} compute-only steps of "
                             f"{step_ms:.2f} ms (the engine timed steps of {engine_step_ms:.2f} ms: advised tau "
                             f"{advised['advised_tau'] if advised else '-'})")
            if advised and advised.get("boundaries"):
                per_round = advised["engine_ms"] / advised["boundaries"]
                tau_max = args.taus[-1]
                lines.append(f"co2 at tau={tau_max}: {per_round:.1f} ms inside the engine per round on the slowest rank "
                             f"(host boundary work + waits) = {per_round / (tau_max * 1e3 / base['steps_per_s']):.1%} "
                             f"of the round's compute")
            if work == "wait" and base.get("late_ms") is not None:
                # On 2 shared cores the communication's CPU delays the timed waits' wake-ups.
                late = {t: get("co2", t) for t in args.taus}
                cells = ", ".join(f"tau={t} {r['late_ms'] / r['steps']:.2f}" for t, r in late.items()
                                  if r and r.get("late_ms") is not None)
                if cells:
                    lines.append(f"timed waits woke late by (ms per step): compute-only "
                                 f"{base['late_ms'] / base['steps']:.2f}; co2 {cells}")
            lines.append("")
            lines.append("    algorithm         " + "".join(f"  tau={t:<4}" for t in args.taus) + "   (steps/s over compute-only)")
            for algo in ("sync", "sync-step", "ddp"):
                runs = [r for r in rows if r["algo"] == algo]
                if runs:
                    name = {"sync": "sync (co2)", "sync-step": "sync, avg in step"}.get(
                        algo, f"DDP (gloo {runs[0]['transport']})")
                    ratios = sorted(ratio_of(r, base) for r in runs)
                    note = "(every step)" if len(runs) == 1 else (
                        f"(every step; median of {len(runs)}: {ratios[0]:.3f}-{ratios[-1]:.3f})")
                    lines.append(f"    {name:<20}{fmt_ratio(ratios[len(ratios) // 2])}   {note}")
            for algo in ALGOS_TAU:
                cells = []
                for t in args.taus:
                    r = get(algo, t)
                    if not r:
                        cells.append("     -   ")
                        continue
                    ratio = ratio_of(r, base)
                    mark = " "
                    if algo == "co2" and ar_ms and ar_ms < t * step_ms:
                        mark = "*" if ratio >= 0.95 else "!"
                    cells.append(f"{fmt_ratio(ratio)}{mark}  ")
                lines.append(f"    {algo:<20}" + "".join(cells))
            lines.append("")
    lines.append("* co2 where one all-reduce takes less than tau steps and the target (>= 0.95) holds; "
                 "! where it does not. The target is the timed-wait table's; in the CPU-bound tables "
                 "(burn, digits) the communication's own CPU time competes with the step for the 2 cores.")
    return "\n".join(lines)


def plot(results, path, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [rate for rate in RATES_BITS if any(r["rate"] == rate for r in results)]
    xs = list(range(len(rates)))
    fig, axes = plt.subplots(1, len(args.taus), figsize=(4.2 * len(args.taus), 3.8), sharey=True)
    if len(args.taus) == 1:
        axes = [axes]
    styles = {"sync": ("tab:red", "s"), "ddp": ("tab:purple", "v"), "localsgd": ("tab:orange", "^"),
              "diloco": ("tab:green", "D"), "co2": ("tab:blue", "o")}
    worlds = sorted({r["world"] for r in results})
    top = 0.0
    for r in results:
        base = best_reference([b for b in results if b["work"] == r["work"] and b["world"] == r["world"]
                               and b["rate"] == r["rate"]])
        if base and r["work"] == "wait":
            top = max(top, r["steps_per_s"] / base["steps_per_s"])
    for ax, tau in zip(axes, args.taus):
        for world in worlds:
            ls = "-" if world == worlds[0] else "--"
            for algo, (color, marker) in styles.items():
                ys = []
                for rate in rates:
                    rows = [r for r in results if r["work"] == "wait" and r["world"] == world and r["rate"] == rate]
                    base = best_reference(rows)
                    r = next((r for r in rows if r["algo"] == algo and (algo in ("sync", "ddp") or r["tau"] == tau)), None)
                    ys.append(r["steps_per_s"] / base["steps_per_s"] if r and base else float("nan"))
                if all(math.isnan(y) for y in ys):
                    continue
                ax.plot(xs, ys, ls, color=color, marker=marker, label=f"{algo} W={world}")
        ax.axhline(0.95, color="gray", lw=0.8, ls=":")
        ax.set_xticks(xs)
        ax.set_xticklabels([RATE_LABELS[rate] for rate in rates])
        ax.set_title(f"tau = {tau}")
        ax.set_ylim(0, max(1.1, top + 0.05))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("throughput / compute-only")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=len(styles) * len(worlds) // 2 or 1)
    fig.suptitle(f"Timed-wait step ({args.step_ms:g} ms); N sized per link so one all-reduce is about "
                 f"{args.target_steps:g} steps (uncapped: N = {args.max_params:,})", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transport", choices=("auto", "netns", "model", "loopback"), default="auto")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one configuration (smoke test)")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--rates", default="100mbit,1gbit,none")
    ap.add_argument("--taus", default="4,12,48")
    ap.add_argument("--step-ms", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=0.6, help="target length of one run")
    ap.add_argument("--target-steps", type=float, default=20.0,
                    help="size N so that one all-reduce takes about this many steps")
    ap.add_argument("--max-params", type=int, default=4_000_000,
                    help="the cap for uncapped links (where the host CPU, not the link, limits)")
    ap.add_argument("--burn", action="store_true", help="also the CPU-burn table (W = 2)")
    ap.add_argument("--burn-iters", type=int, default=0)
    ap.add_argument("--digits", action="store_true",
                    help="also the digits-MLP table (W = 2; needs the co2 Python binding)")
    ap.add_argument("--only-digits", action="store_true", help="only the digits-MLP table")
    ap.add_argument("--digits-seconds", type=float, default=1.5,
                    help="target length of one digits run (its steps jitter more than a timed wait)")
    ap.add_argument("--digits-max-hidden", type=int, default=512,
                    help="the widest MLP the digits table sizes to (keeps its runs short)")
    ap.add_argument("--digits-depth", type=int, default=2,
                    help="hidden layers of the digits MLP (2: the example's; deeper models give "
                         "sync several gradient buckets to overlap with backward)")
    ap.add_argument("--digits-bucket-mb", type=float, default=None,
                    help="sync's gradient bucket size in MiB (default: co2.torch's, 25)")
    ap.add_argument("--digits-sync-repeats", type=int, default=1,
                    help="runs of the every-step rows (sync, sync-step, DDP) side by side; the "
                         "table gives each one's median ratio")
    ap.add_argument("--digits-step-ms", help=argparse.SUPPRESS)  # the calibration, for --inner
    ap.add_argument("--ddp", dest="ddp", action="store_true", default=True)
    ap.add_argument("--no-ddp", dest="ddp", action="store_false")
    ap.add_argument("--timeout", type=float, default=60.0, help="per run, seconds")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--tables-from", metavar="OVERLAP_JSON",
                    help="print the tables (and write the plot to --out) of an earlier run's overlap.json "
                         "instead of measuring")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner-out", help=argparse.SUPPRESS)
    ap.add_argument("--inner-works", default="wait", help=argparse.SUPPRESS)
    ap.add_argument("--inner-co2", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.taus = [int(t) for t in str(args.taus).split(",")]
    args.worlds = [int(w) for w in str(args.worlds).split(",")]
    args.rates = str(args.rates).split(",")
    args.digits = args.digits or args.only_digits
    if args.digits_max_hidden < 1:
        ap.error("--digits-max-hidden must be >= 1")
    if args.digits_sync_repeats < 1:
        ap.error("--digits-sync-repeats must be >= 1")
    if args.digits_depth < 1 or (args.digits_bucket_mb is not None and args.digits_bucket_mb <= 0):
        ap.error("--digits-depth must be >= 1 and --digits-bucket-mb > 0")
    args.digits_step_ms = ({int(h): float(ms) for h, ms in
                            (kv.split(":") for kv in args.digits_step_ms.split(","))}
                           if args.digits_step_ms else None)
    for rate in args.rates:
        if rate not in RATES_BITS:
            ap.error(f"--rates: {rate} is not one of {', '.join(RATES_BITS)}")
    if args.quick:
        args.worlds, args.rates, args.taus = [2], ["none"], [2]
        args.step_ms, args.seconds, args.max_params, args.target_steps = 2.0, 0.05, 4096, 2
        args.digits_seconds = 0.05
        args.digits_max_hidden = min(args.digits_max_hidden, 32)
        args.timeout = min(args.timeout, 30.0)
    return args


def main(argv):
    args = parse_args(argv)
    if args.inner:
        return inner_main(args)
    if args.tables_from:
        try:
            with open(args.tables_from) as f:
                earlier = json.load(f)
            missing = {"taus", "step_ms", "results", "date", "transport"} - set(earlier)
            if missing:
                raise KeyError(", ".join(sorted(missing)))
            args.taus, args.step_ms = earlier["taus"], earlier["step_ms"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            log(f"--tables-from {args.tables_from}: not an overlap.json this program wrote ({e})")
            return 2
        print(f"# overlap benchmark, {earlier['date']}, co2 ranks: {earlier['transport']} "
              f"(tables from {args.tables_from})")
        print(tables(earlier["results"], args))
        if not args.no_plot:
            plot(earlier["results"], os.path.join(args.out, "overlap_ratio.png"), args)
        return 0
    overlap = os.path.join(args.build, "bench", "overlap", "overlap")
    if not os.access(overlap, os.X_OK):
        log(f"{overlap} is missing: build first (meson setup build && ninja -C build)")
        return 2
    # Namespaces serve the co2 ranks (netns) and torch DDP beside the link model; the smoke
    # test (--quick) and loopback never create any.
    have_netns = not args.quick and args.transport != "loopback" and netns_available()
    have_mp = multiprocess_transport_built(args) if args.transport != "model" else False
    transport = args.transport
    if transport == "auto":
        transport = "netns" if have_netns and have_mp else "model"
    if transport == "netns" and not (have_netns and have_mp):
        log("--transport netns needs root (namespaces, tc) and a build with the multi-process "
            f"transport: namespaces {'ok' if have_netns else 'not permitted'}, transport "
            f"{'built' if have_mp else 'not built'}")
        return 77
    if transport == "loopback" and not have_mp:
        log("--transport loopback needs a build with the multi-process transport: skipped")
        return 77
    if args.burn and not args.burn_iters:
        # The cores are shared: the largest of three calibrations is the least disturbed one.
        args.burn_iters = max(
            int(subprocess.run([overlap, "--calibrate-burn", str(int(args.step_ms * 1000))],
                               capture_output=True, text=True, check=True).stdout)
            for _ in range(3))
        log(f"burn: {args.burn_iters} iterations take {args.step_ms} ms on an idle core")
    if args.digits:
        args.digits_step_ms = calibrate_digits(args)
        if args.digits_step_ms:
            log("digits: ms per step alone: "
                + ", ".join(f"hidden {h}: {ms:.2f}" for h, ms in args.digits_step_ms.items()))
            if transport == "model":
                log("digits: co2 ranks are threads of one process here (the link model); they "
                    "share its interpreter lock, and DDP is left out")
        args.digits = bool(args.digits_step_ms)
        if args.only_digits and not args.digits:
            return 77
    log(f"co2 ranks: {transport}; torch DDP: "
        + ("in namespaces" if args.ddp and have_netns else "on loopback (uncapped)" if args.ddp else "off"))
    started = time.monotonic()
    results = []
    for world in args.worlds:
        first = world == args.worlds[0]
        works = ([] if args.only_digits else ["wait"] + (["burn"] if args.burn and first else [])) \
            + (["digits"] if args.digits and first else [])
        if not works:
            continue
        for rate in args.rates:
            if transport == "netns":
                results += in_netns(args, world, rate,
                                    common_args(args) + ["--inner-co2", "--inner-works", ",".join(works)])
                continue
            results += run_config(args, transport, world, rate, works, args.burn_iters,
                                  args.ddp and not have_netns and transport == "loopback", None)
            if args.ddp and transport == "model" and "wait" in works:
                if have_netns:
                    results += in_netns(args, world, rate, common_args(args))
                elif rate == "none":
                    log("  ddp: no namespaces here, so only the uncapped row runs (loopback)")
                    results += run_config_ddp_loopback(args, world, rate)
    text = tables(results, args)
    print(f"# overlap benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.uname().nodename}, {os.cpu_count()} cores; co2 ranks: {transport}; "
          f"{time.monotonic() - started:.0f} s")
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "overlap.json"), "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "transport": transport,
                   "step_ms": args.step_ms, "taus": args.taus, "results": results}, f, indent=1)
    if not args.no_plot and any(r["work"] == "wait" for r in results):
        plot(results, os.path.join(args.out, "overlap_ratio.png"), args)
        log(f"wrote {os.path.join(args.out, 'overlap_ratio.png')}")
    worlds = args.worlds[:1] if args.only_digits else args.worlds
    ok = all(any(r["algo"] == "none" for r in results if r["world"] == w) for w in worlds)
    return 0 if ok and results else 1


def run_config_ddp_loopback(args, world, rate):
    runner = Runner(args, "loopback", world, rate, None)
    params = size_params(args, world, rate, "model")
    try:
        r = aggregate(runner.ddp_run(params))
    except Exception as e:
        log(f"  ddp: FAILED: {e}")
        return []
    r.update(transport="loopback", rate=rate, world=world)
    return [r]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

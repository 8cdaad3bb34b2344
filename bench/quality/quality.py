#!/usr/bin/python3
"""Quality at equal steps, and time to quality on a slow link, for the byte-level language model
of examples/python/lm (docs/quality.md).

    quality.py [--quick] [--seeds 3] [--steps 480] [--out DIR]
        Every configuration (torch DDP over gloo; co2 sync; localsgd, diloco, co2 with penalty
        none/constant 2/gap x clip none/norm, co2 + eager, co2 + eager applying its average on
        arrival, each at tau 12 and 48) trains the
        same model from the same initial weights on the same data for the same number of
        steps, W ranks on loopback. Prints final validation loss mean +- std over seeds, the
        ratio to DDP's, training wall time; writes DIR/quality.json, DIR/quality.png.
    quality.py --links 100mbit,1gbit [--seeds 1] [--out DIR] [--overlap-json overlap.json]
        The same runs with each rank in its own network namespace, its link capped by tc tbf
        (bench/overlap/netns.sh; needs root). Prints, per link, the training wall time each
        configuration needs to reach torch DDP's final validation loss (the target) and its ratio
        to DDP's; writes DIR/quality_links.json, DIR/quality_links.png (loss against wall time).
        --overlap-json adds the composite figure: steps to the target measured here x the step
        time of the timed-wait table of bench/overlap (its throughput over compute-only).

Launching: one launch per seed (and link) of W processes; each rank runs every configuration in
sequence (torch's import and the corpus load are paid once), co2 meeting through its store at
MASTER_PORT and gloo at MASTER_PORT + 1, through bench/overlap/run.py's launcher (loopback or
the namespaces). Each rank uses one torch thread. Wall time is rank 0's training time; the
evaluations (every rank evaluates the same held-out windows) are taken out of it.

    quality.py --wall --links 100mbit --size medium --batch 1 [--steps-factor 2] [--seeds 3]
        Time to DDP's final loss where the link dominates DDP's step (docs/quality.md): DDP
        against co2's defaults at tau 12 and at the tau the advisor picks from a probe run (fp32,
        int8), co2 training --steps-factor x DDP's steps; each seed against its own DDP run.
        Writes DIR/quality_wall.json and .png; --runs-from re-renders it.

    quality.py --nodes 2 --world 4 [--seeds 3] [--taus 12,48]
        Hierarchical co2 (issue 16): per tau, flat co2 over the W ranks against hierarchical co2
        (hierarchy="nodes", the gradients averaged inside each node of W/K ranks every step by
        co2), both with the engine's defaults otherwise, at equal steps. Each rank gets
        GROUP_RANK = rank // (W/K), as co2run --nnodes K sets it. Writes DIR/quality_hierarchy.json.

    quality.py --delays [--taus 12,48] [--seeds 3] [--merge-from DIR/quality_delays.json]
        Quality against the delay of the average (docs/quality.md, "Quality against the delay
        (apply on arrival)"): per tau, co2 delayed and eager at the boundary, eager and delayed
        with apply_step k = 1, tau/4, tau/2 (the average applied k steps after its boundary),
        eager with apply_step "arrival"; the loss over DDP's of the same seed against k / tau.
        Writes DIR/quality_delays.json after every seed; --merge-from adds an earlier run's
        (another tau's) and skips what it measured.

The eager outer policy is the engine key `eager`; in a build whose Python binding lacks it the
eager rows are reported as unavailable.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
LM = os.path.join(ROOT, "examples", "python", "lm")
sys.path.insert(0, os.path.join(ROOT, "bench", "overlap"))
sys.path.insert(0, LM)

import run as overlap  # noqa: E402  (bench/overlap/run.py: launcher, netns, environment)

PYTHON = "/usr/bin/python3"
DILOCO = {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}
PENALTIES = {"none": {"penalty": "none"}, "constant2": {"penalty": "constant",
                                                        "penalty_constant": 2.0},
             "gap": {"penalty": "gap"}}


# Candidates for the C API's defaults (issue 13: "defaults that train"), compared with --tune on
# seeds that the reported table does not use. Each is (outer lr, outer momentum, nesterov).
TUNE = [(1.0, 0.0, False), (0.8, 0.0, False), (1.2, 0.0, False), (0.8, 0.5, False),
        (0.7, 0.5, True)]


def tuning_configurations(tau):
    configs = [("ddp", "ddp", {}), (f"diloco t{tau} a1/b0", "diloco",
                                    {"tau": tau, "outer_lr": 1.0, "outer_momentum": 0.0}),
               (f"co2 t{tau} a1/b0", "co2", {"tau": tau, "outer_lr": 1.0, "outer_momentum": 0.0,
                                                "eager": False})]
    for alpha, beta, nesterov in TUNE:
        configs.append((f"co2+eager t{tau} a{alpha:g}/b{beta:g}" + ("/nesterov" if nesterov else ""),
                        "co2", {"tau": tau, "eager": True, "outer_lr": alpha,
                                "outer_momentum": beta, "nesterov": nesterov}))
    return configs


def wire_configurations(tau):
    """The compressed outer all-reduce (docs/benchmarks.md, "Wire formats"): co2+eager at `tau`
    with each wire format, with and without error feedback; fp32 is the reference."""
    configs = [(f"co2+eager t{tau} fp32", "co2", {"tau": tau, "eager": True})]
    for wire in ("bf16", "int8", "fp4"):
        for feedback in (True, False):
            configs.append((f"co2+eager t{tau} {wire}" + ("" if feedback else " no-ef"), "co2",
                            {"tau": tau, "eager": True, "wire_format": wire,
                             "error_feedback": feedback}))
    return configs


def hierarchy_configurations(taus):
    """Flat co2 against hierarchical co2 at each tau (--nodes), the engine's defaults otherwise
    (the eager policy on host tensors, hierarchical co2 included since it shards the offsets); the
    delayed rows (eager=False) compare the delayed update of both."""
    configs = []
    for tau in taus:
        configs += [(f"co2 t{tau} flat", "co2", {"tau": tau}),
                    (f"co2 t{tau} flat delayed", "co2", {"tau": tau, "eager": False}),
                    (f"co2 t{tau} hier", "co2", {"tau": tau, "hierarchy": "nodes"}),
                    (f"co2 t{tau} hier delayed", "co2", {"tau": tau, "hierarchy": "nodes", "eager": False})]
    return configs


# --wall: the probe run that measures the tau advisor's figures before a "tau": "advised" run.
PROBE_STEPS = 36
PROBE_TAU = 12


def wall_configurations(factor):
    """Time to DDP's final loss where the link dominates DDP's step (--wall): DDP against co2's
    defaults (eager at the boundary) at tau 12 and at the tau the advisor picks from a probe run,
    fp32 and int8 on the wire. co2 trains `factor` x DDP's steps (its schedule over its own
    steps): the question is when it reaches DDP's loss, not where it ends."""
    more = {"train_steps_factor": factor}
    return [("ddp", "ddp", {}),
            ("co2 t12", "co2", {"tau": 12, **more}),
            ("co2 advised", "co2", {"tau": "advised", **more}),
            ("co2 advised int8", "co2", {"tau": "advised", "wire_format": "int8", **more})]


def configurations(taus, quick=False):
    """[(name, algorithm, engine config)] in run order."""
    configs = [("ddp", "ddp", {}), ("sync", "sync", {})]
    for tau in taus:
        configs += [(f"localsgd t{tau}", "localsgd", {"tau": tau}),
                    (f"diloco t{tau}", "diloco", {"tau": tau, **DILOCO})]
        for penalty, pconfig in PENALTIES.items():
            for clip in ("none", "norm"):
                if quick and (penalty != "none" or clip != "none"):
                    continue
                configs.append((f"co2 t{tau} {penalty}/{clip}", "co2",
                                {"tau": tau, **pconfig, "clip": clip, "eager": False}))
        configs.append((f"co2+eager t{tau}", "co2", {"tau": tau, "eager": True}))
        configs.append((f"co2+arrival t{tau}", "co2", arrival(tau)))
    return configs


def arrival(tau):
    """co2 + eager applying each average at the step the ranks agree on once it arrived, over
    the real transport (the launch's: loopback, or the shaped link of --links)."""
    return {"tau": tau, "eager": True, "apply_step": "arrival"}


def delay_steps(tau):
    """The apply steps k of --delays: 1 step, tau/4 and tau/2 after the boundary."""
    return sorted({1, max(1, tau // 4), max(1, tau // 2)})


def delay_name(tau, k, eager):
    return f"co2{'+eager' if eager else ''} t{tau} k{k}"


def delay_configurations(taus):
    """Quality against the delay of the average (--delays; docs/quality.md, "Quality against
    the delay (apply on arrival)"). apply_step=k applies a boundary's average k steps after it:
    what "arrival" gives on a link whose all-reduce takes about k - 1 steps; k = tau is the
    boundary. Per tau: delayed and eager at the boundary, eager with apply_step k for each
    delay_steps(tau), the same without eager, and eager with apply_step "arrival" on loopback."""
    configs = [("ddp", "ddp", {})]
    for tau in taus:
        configs += [(f"co2 t{tau} delayed", "co2", {"tau": tau, "eager": False}),
                    (f"co2+eager t{tau}", "co2", {"tau": tau, "eager": True})]
        for eager in (True, False):
            configs += [(delay_name(tau, k, eager), "co2",
                         {"tau": tau, "eager": eager, "apply_step": k}) for k in delay_steps(tau)]
        configs.append((f"co2+arrival t{tau}", "co2", arrival(tau)))
    return configs


# --- one rank ---------------------------------------------------------------------------------

def rank_main(args):
    """One rank of one launch: every configuration of the plan for one seed; rank 0 prints one
    JSON line per configuration."""
    import torch
    torch.set_num_threads(1)
    import co2
    import co2.engine
    import train as lm
    rank, world = co2.rank_and_world()
    plan = json.loads(args.plan)
    size = lm.SIZES[args.size]
    if args.batch:
        size = lm.Size(**{**size.__dict__, "batch": args.batch})
    data = lm.Data(size)
    comm = co2.Communicator.from_env()
    gloo = False
    for name, algorithm, config in plan:
        config = dict(config)
        steps = round(args.steps * config.pop("train_steps_factor", 1))
        missing = [k for k in config if k not in co2.engine._CONFIG_KEYS]
        if missing:
            result = {"name": name, "unavailable": f"this co2 build has no engine key "
                                                   f"{', '.join(missing)}"}
        else:
            if algorithm == "ddp" and not gloo:
                lm.init_gloo(rank, world)
                gloo = True
            probe = None
            if config.get("tau") == "advised":
                # What a user does before a long job: a short run whose statistics carry the
                # advisor's tau (agreed, the same on every rank); not part of the timed run.
                probe = lm.train(algorithm, data, args.seed, PROBE_STEPS, comm=comm, rank=rank,
                                 world=world, eval_every=PROBE_STEPS,
                                 **{**config, "tau": PROBE_TAU})
                config["tau"] = max(1, probe["advised_tau"] or PROBE_TAU)
            result = lm.train(algorithm, data, args.seed, steps, comm=comm, rank=rank,
                              world=world, eval_every=args.eval_every, **config)
            result["name"] = name
            if probe:
                result["probe"] = {"steps": PROBE_STEPS, "tau": PROBE_TAU,
                                   "wall_s": probe["wall_s"], "advised_tau": config["tau"]}
        if rank == 0:
            print(json.dumps(result), flush=True)
    comm.close()
    if gloo:
        import torch.distributed as dist
        dist.destroy_process_group()
    return 0


# --- launching --------------------------------------------------------------------------------

def launch_seed(args, seed, configs, prefix=None, rate="none"):
    runner = overlap.Runner(types.SimpleNamespace(build=args.build),
                            "netns" if prefix else "loopback", args.world, rate, prefix)
    if args.port:
        runner.port = args.port - 1   # its next launch takes args.port and args.port + 1
    argv = [PYTHON, os.path.abspath(__file__), "--rank", "--seed", str(seed),
            "--steps", str(args.steps), "--size", args.size, "--eval-every", str(args.eval_every),
            "--plan", json.dumps(configs)] + (["--batch", str(args.batch)] if args.batch else [])
    env = overlap.digits_env(args)
    # --nodes: the node index per rank, as co2run --nnodes sets it (co2's split_nodes reads it).
    per_node = args.world // args.nodes
    of_rank = (lambda r: ["env", f"GROUP_RANK={r // per_node}"] + argv) if args.nodes > 1 else (lambda r: argv)
    lines = runner._launch(of_rank, args.timeout, ports=2, extra_env={
        k: env[k] for k in ("PYTHONPATH", "OMP_NUM_THREADS")})
    for line in lines:
        line["seed"] = seed
        line["rate"] = rate
    return lines


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_all(args, configs, prefix=None, rate="none", earlier=(), after_seed=None):
    """Every configuration for every seed, but those `earlier` runs (--merge-from) measured
    already; `after_seed(runs so far)` after each launch, so that an interrupted run keeps what
    it measured."""
    runs = list(earlier)
    for seed in args.seed_list:
        done = {r["name"] for r in runs if r["seed"] == seed and r["rate"] == rate}
        todo = [c for c in configs if c[0] not in done]
        if not todo:
            continue
        started = time.monotonic()
        lines = launch_seed(args, seed, todo, prefix, rate)
        for r in lines:
            log(f"  {rate} seed {seed} {r['name']:<26} " + (
                f"unavailable: {r['unavailable']}" if "unavailable" in r else
                f"validation {r['final_loss']:.4f}  {r['wall_s']:.1f} s"))
        log(f"  seed {seed}: {time.monotonic() - started:.0f} s")
        runs += lines
        if after_seed:
            after_seed(runs)
    return runs


# --- tables -----------------------------------------------------------------------------------

def summarize(runs, names, base_name="ddp"):
    table = {}
    for name in names:
        mine = [r for r in runs if r["name"] == name]
        done = [r for r in mine if "unavailable" not in r]
        if not done:
            table[name] = {"unavailable": mine[0]["unavailable"] if mine else "not run"}
            continue
        losses = [r["final_loss"] for r in done]
        table[name] = {"runs": len(done), "loss_mean": statistics.mean(losses),
                       "loss_std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
                       "wall_mean_s": statistics.mean(r["wall_s"] for r in done)}
    base = table.get(base_name, {}).get("loss_mean")
    for row in table.values():
        if base and "loss_mean" in row:
            row["ratio_to_ddp"] = row["loss_mean"] / base  # to base_name's
    return table


def print_table(table, out=sys.stdout, base_label="DDP"):
    print(f"{'configuration':<26} {'runs':>4} {'validation loss':>18} {'/ ' + base_label:>7} {'wall s':>8}",
          file=out)
    for name, row in table.items():
        if "unavailable" in row:
            print(f"{name:<26}  unavailable ({row['unavailable']})", file=out)
            continue
        ratio = f"{row['ratio_to_ddp']:.4f}" if "ratio_to_ddp" in row else "-"
        print(f"{name:<26} {row['runs']:>4} {row['loss_mean']:>9.4f} ± {row['loss_std']:<6.4f} "
              f"{ratio:>7} {row['wall_mean_s']:>8.1f}", file=out)


def paired_ratios(runs, name, base="ddp"):
    """Per seed: the configuration's final loss over the base's of the same seed."""
    base_loss = {r["seed"]: r["final_loss"] for r in runs
                 if r["name"] == base and "unavailable" not in r}
    return [r["final_loss"] / base_loss[r["seed"]] for r in runs
            if r["name"] == name and "unavailable" not in r and r["seed"] in base_loss]


def delay_table(runs, taus):
    """--delays, per tau: final loss over DDP's of the same seed (mean, std over seeds) against
    the delay from a boundary to the application of its average. Columns: apply_step k for each
    delay_steps(tau), then tau (the boundary, where eager + k is the eager row and k without
    eager the delayed one); the arrival row: what "arrival" gave on loopback."""
    table = {}
    for tau in taus:
        ks = delay_steps(tau)
        delayed, eager = f"co2 t{tau} delayed", f"co2+eager t{tau}"
        rows = {"delayed": [None] * len(ks) + [delayed], "eager": [None] * len(ks) + [eager],
                "eager + apply_step k": [delay_name(tau, k, True) for k in ks] + [eager],
                "apply_step k, no eager": [delay_name(tau, k, False) for k in ks] + [delayed]}
        cells = {}
        for row, names in rows.items():
            cells[row] = []
            for name in names:
                ratios = paired_ratios(runs, name) if name else []
                cells[row].append({"config": name, "runs": len(ratios),
                                   "ratio_mean": statistics.mean(ratios),
                                   "ratio_std": statistics.stdev(ratios) if len(ratios) > 1
                                   else 0.0} if ratios else None)
        mine = [r for r in runs if r["name"] == f"co2+arrival t{tau}" and "unavailable" not in r]
        ratios = paired_ratios(runs, f"co2+arrival t{tau}")
        measured = {"runs": len(ratios),
                    "ratio_mean": statistics.mean(ratios) if ratios else None,
                    "ratio_std": statistics.stdev(ratios) if len(ratios) > 1 else 0.0,
                    "arrival_updates": [r.get("arrival_updates") for r in mine],
                    "rounds": [r.get("rounds") for r in mine],
                    "last_apply_step": [r.get("last_apply_step") for r in mine]}
        table[tau] = {"apply_steps": ks, "rows": cells, "arrival": measured}
    return table


def print_delay_table(table, out=sys.stdout):
    for tau, entry in table.items():
        labels = [("1 step" if k == 1 else f"tau/{tau // k} (k={k})" if tau % k == 0
                   else f"k={k}") for k in entry["apply_steps"]] + ["tau (boundary)"]
        print(f"\ntau {tau}: final validation loss / DDP's of the same seed, mean ± std over "
              f"seeds, against the delay from a boundary to the application of its average",
              file=out)
        print(f"{'policy':<24}" + "".join(f"{label:>19}" for label in labels), file=out)
        for row, cells in entry["rows"].items():
            text = [f"{c['ratio_mean']:.4f} ± {c['ratio_std']:.4f}" if c else "-" for c in cells]
            print(f"{row:<24}" + "".join(f"{t:>19}" for t in text), file=out)
        got = entry["arrival"]
        if got["runs"]:
            print(f"eager + arrival (loopback): {got['ratio_mean']:.4f} ± {got['ratio_std']:.4f}; "
                  f"averages applied between boundaries per seed {got['arrival_updates']} of "
                  f"{got['rounds']} rounds, the last at step {got['last_apply_step']}", file=out)


def reach(curve, target, key):
    """The first `key` (step or seconds) at which the validation loss is <= target, linearly
    interpolated between evaluations; None if never."""
    xs, ys = curve[key], curve["loss"]
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y) if y0 != y else x
    return None


def time_to_target(runs, names, target):
    """Per configuration: mean seconds and steps to reach the target over the seeds that
    reached it (and how many did), and the ratio to DDP's seconds per seed (both reaching it).
    `target`: one loss, or {seed: loss} (each seed against its own DDP run)."""
    target_of = (lambda r: target[r["seed"]]) if isinstance(target, dict) else (lambda r: target)
    rows = {}
    ddp_seconds = {r["seed"]: reach(r["curve"], target_of(r), "seconds")
                   for r in runs if r["name"] == "ddp" and "unavailable" not in r}
    for name in names:
        done = [r for r in runs if r["name"] == name and "unavailable" not in r]
        hits = [(reach(r["curve"], target_of(r), "seconds"), reach(r["curve"], target_of(r), "step"),
                 r["seed"]) for r in done]
        hits = [h for h in hits if h[0] is not None]
        ratios = [h[0] / ddp_seconds[h[2]] for h in hits if ddp_seconds.get(h[2])]
        taus = sorted({r["probe"]["advised_tau"] for r in done if "probe" in r})
        rows[name] = {"runs": len(done), "reached": len(hits),
                      "final_loss": statistics.mean(r["final_loss"] for r in done) if done else None,
                      "wall_s": statistics.mean(r["wall_s"] for r in done) if done else None,
                      "total_steps": done[0]["steps"] if done else None,
                      "seconds": statistics.mean(h[0] for h in hits) if hits else None,
                      "steps": statistics.mean(h[1] for h in hits) if hits else None,
                      "seed_ratios": ratios, "advised_taus": taus}
    base = rows.get("ddp", {}).get("seconds")
    for row in rows.values():
        row["ratio_to_ddp"] = row["seconds"] / base if base and row["seconds"] else None
    return rows


def print_time_table(rows, title, out=sys.stdout):
    print(title, file=out)
    print(f"{'configuration':<26} {'reached':>8} {'steps':>7} {'seconds':>8} {'/ DDP':>7}"
          f" {'per seed':>15}   {'final loss':>10} {'wall s':>7}  (all steps)", file=out)
    for name, row in rows.items():
        if not row["runs"]:
            print(f"{name:<26}  unavailable", file=out)
            continue
        steps = f"{row['steps']:.0f}" if row["steps"] is not None else "-"
        secs = f"{row['seconds']:.1f}" if row["seconds"] is not None else "-"
        ratio = f"{row['ratio_to_ddp']:.3f}" if row["ratio_to_ddp"] is not None else "-"
        ratios = row.get("seed_ratios") or []
        spread = (f"{statistics.mean(ratios):.3f} ± {statistics.stdev(ratios):.3f}"
                  if len(ratios) > 1 else "-")
        taus = f"  tau {','.join(map(str, row['advised_taus']))}" if row.get("advised_taus") else ""
        print(f"{name:<26} {row['reached']:>3}/{row['runs']:<4} {steps:>7} {secs:>8} {ratio:>7}"
              f" {spread:>15}   {row['final_loss']:>10.4f} {row['wall_s']:>7.1f}  "
              f"({row['total_steps']}){taus}", file=out)


def overlap_ratio(overlap_rows, world, rate, algorithm, tau):
    """Throughput over compute-only in bench/overlap's timed-wait table (None if absent)."""
    rows = [r for r in overlap_rows if r.get("work") == "wait" and r["world"] == world
            and r["rate"] == rate]
    base = overlap.best_reference(rows)
    algo = {"ddp": "ddp", "sync": "sync"}.get(algorithm, algorithm)
    row = next((r for r in rows if r["algo"] == algo
                and (algo in ("ddp", "sync") or r["tau"] == tau)), None)
    return row["steps_per_s"] / base["steps_per_s"] if row and base else None


def composite(steps_rows, configs, overlap_rows, world, rate):
    """Steps to the target (measured) x step time on the shaped link (bench/overlap's
    timed-wait throughput), in compute-only steps, and its ratio to DDP's."""
    out = {}
    for name, algorithm, config in configs:
        steps = steps_rows.get(name, {}).get("steps")
        ratio = overlap_ratio(overlap_rows, world, rate, algorithm, config.get("tau"))
        out[name] = {"steps": steps, "throughput_ratio": ratio,
                     "compute_steps": steps / ratio if steps and ratio else None}
    base = out.get("ddp", {}).get("compute_steps")
    for row in out.values():
        row["ratio_to_ddp"] = row["compute_steps"] / base if base and row["compute_steps"] else None
    return out


def plot(runs, names, path, xkeys, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({r["rate"] for r in runs})
    panels = [(g, k) for g in groups for k in xkeys]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    cmap = plt.get_cmap("tab20")
    for ax, (rate, key) in zip(axes[0], panels):
        for i, name in enumerate(names):
            mine = [r for r in runs if r["name"] == name and r["rate"] == rate
                    and "unavailable" not in r]
            if not mine:
                continue
            # The mean curve over seeds (every seed evaluates at the same steps).
            n = min(len(r["curve"]["loss"]) for r in mine)
            xs = [statistics.mean(r["curve"][key][j] for r in mine) for j in range(n)]
            ys = [statistics.mean(r["curve"]["loss"][j] for r in mine) for j in range(n)]
            style = "-" if "t48" not in name else "--"
            ax.plot(xs[1:], ys[1:], style, color=cmap(i % 20), label=name, lw=1.2)
        ax.set_xlabel({"step": "step", "seconds": "training wall time (s)"}[key])
        ax.set_ylabel("validation loss (nats/byte)")
        ax.set_title(f"{title}, link {rate}" if rate != "none" else title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- modes ------------------------------------------------------------------------------------

def inner_main(args, configs):
    """Inside netns.sh: one rate's runs with every rank in its namespace."""
    prefix, rate = os.environ["CO2_NETNS_PREFIX"], os.environ["CO2_NETNS_RATE"]
    runs = run_all(args, configs, prefix, rate)
    with open(args.inner_out, "w") as f:
        json.dump(runs, f)
    return 0


def links_main(args, configs, names):
    if subprocess.run(["bash", overlap.NETNS, "check"]).returncode != 0:
        log("--links needs network namespaces (root): skipped")
        return 77
    runs = []
    for rate in args.links:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            path = tmp.name
        try:
            log(f"link {rate}: {args.world} ranks in namespaces")
            cmd = ["bash", overlap.NETNS, "run", "--ranks", str(args.world), "--rate", rate,
                   "--prefix", f"co2q{os.getpid() % 1000}", "--", PYTHON,
                   os.path.abspath(__file__), "--inner", "--inner-out", path] + args.passthrough
            if subprocess.run(cmd).returncode != 0:
                log(f"link {rate}: failed")
                continue
            with open(path) as f:
                runs += json.load(f)
        finally:
            os.unlink(path)
    return links_report(args, configs, names, runs)


def links_report(args, configs, names, runs):
    """The time-to-target tables of --links runs (also re-rendered from a saved
    quality_links.json with --runs-from, e.g. with another --target-ratio)."""
    overlap_rows = []
    if args.overlap_json:
        with open(args.overlap_json) as f:
            overlap_rows = json.load(f)["results"]
    report = {"command": " ".join(sys.argv), "steps": args.steps, "size": args.size,
              "batch": args.batch, "world": args.world, "seeds": args.seed_list,
              "load_average_end": os.getloadavg(), "links": {}, "runs": runs}
    for rate in args.links:
        mine = [r for r in runs if r["rate"] == rate]
        ddp = summarize(mine, ["ddp"]).get("ddp", {})
        if "loss_mean" not in ddp:
            continue
        if args.wall and not args.target:
            # "When do I reach DDP's final loss?": each seed against its own DDP run (DDP then
            # reaches it at its last step), not against the mean over seeds.
            target = {r["seed"]: args.target_ratio * r["final_loss"]
                      for r in mine if r["name"] == "ddp" and "unavailable" not in r}
            how = "each seed's DDP final" + ("" if args.target_ratio == 1.0 else f" x {args.target_ratio:g}")
            shown = ", ".join(f"{target[seed]:.4f}" for seed in sorted(target))
        else:
            target = args.target or args.target_ratio * ddp["loss_mean"]
            how = ("stated" if args.target else "DDP final, mean" if args.target_ratio == 1.0
                   else f"{args.target_ratio:g} x DDP final, mean")
            shown = f"{target:.4f}"
        rows = time_to_target(mine, names, target)
        print_time_table(rows, f"\nlink {rate}: time to validation loss {shown} ({how})")
        entry = {"target": target, "time_to_target": rows}
        if overlap_rows:
            comp = composite(rows, configs, overlap_rows, args.world, rate)
            entry["composite"] = comp
            print(f"composite (steps to target here / bench/overlap timed-wait throughput "
                  f"ratio at {rate}, W={args.world}):")
            for name, row in comp.items():
                if row["compute_steps"] is not None:
                    print(f"  {name:<26} {row['steps']:7.0f} steps / {row['throughput_ratio']:.3f}"
                          f" = {row['compute_steps']:8.0f} compute-only steps, "
                          f"{row['ratio_to_ddp']:.3f} of DDP")
        report["links"][rate] = entry
    os.makedirs(args.out, exist_ok=True)
    stem = "quality_wall" if args.wall else "quality_links"
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(report, f, indent=1)
    if runs and not args.no_plot:
        plot(runs, names, os.path.join(args.out, stem + ".png"), ["seconds"],
             f"{args.size} LM, W={args.world}")
    return 0 if report["links"] else 1


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: tiny model, 24 steps, 1 seed, tau 4, a subset")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=480)
    ap.add_argument("--taus", default="12,48")
    ap.add_argument("--size", default="small")
    ap.add_argument("--batch", type=int, default=0, help="sequences per rank and step")
    ap.add_argument("--eval-every", type=int, default=40)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tune", action="store_true",
                    help="compare the candidates for the C defaults (TUNE) at the first tau; "
                         "use seeds the reported table does not (--first-seed 100)")
    ap.add_argument("--wire-formats", action="store_true",
                    help="co2+eager at the first of --taus with each wire format (fp32, bf16, "
                         "int8), with and without error feedback, against fp32")
    ap.add_argument("--delays", action="store_true",
                    help="quality against the delay of the average: delayed and eager at the "
                         "boundary, eager and delayed with apply_step k (1, tau/4, tau/2), "
                         "eager with apply_step 'arrival', at each of --taus")
    ap.add_argument("--wall", action="store_true",
                    help="with --links: time to DDP's final loss, DDP against co2's defaults at "
                         "tau 12 and at the advisor's tau (fp32, int8), co2 running "
                         "--steps-factor x DDP's steps")
    ap.add_argument("--steps-factor", type=float, default=2.0,
                    help="--wall: co2's steps over DDP's")
    ap.add_argument("--merge-from", help="an earlier run's JSON of the same mode: its runs join "
                                         "this one's, and what it measured is not run again")
    ap.add_argument("--nodes", type=int, default=1,
                    help="K >= 2: flat against hierarchical co2 with the W ranks in K nodes")
    ap.add_argument("--only", help="comma-separated configuration names (as in the table)")
    ap.add_argument("--links", help="e.g. 100mbit,1gbit: the time-to-quality mode (root)")
    ap.add_argument("--target", type=float, help="target validation loss (default: DDP's final)")
    ap.add_argument("--target-ratio", type=float, default=1.0,
                    help="without --target: the target is this times DDP's final loss")
    ap.add_argument("--runs-from", help="re-render the time-to-target tables of an earlier "
                                        "--links run's quality_links.json (no training)")
    ap.add_argument("--overlap-json", help="bench/overlap's overlap.json for the composite figure")
    ap.add_argument("--port", type=int, default=0,
                    help="co2's store port (gloo takes the next); default: by process id")
    ap.add_argument("--timeout", type=float, default=7200.0, help="per launch, seconds")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--plan", help=argparse.SUPPRESS)
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inner-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    # What the inner (namespace) invocation needs to repeat this run.
    args.passthrough = [a for a in argv if a not in ("--inner",)]
    if args.quick:
        args.seeds, args.steps, args.size, args.eval_every = 1, 24, "tiny", 8
        args.taus = "4"
        args.timeout = min(args.timeout, 300.0)
    args.taus = [int(t) for t in args.taus.split(",")]
    args.seed_list = list(range(args.first_seed, args.first_seed + args.seeds))
    args.links = args.links.split(",") if args.links else None
    for rate in args.links or ():
        if rate not in overlap.RATES_BITS:
            ap.error(f"--links: {rate} is not one of {', '.join(overlap.RATES_BITS)}")
    if args.nodes < 1 or args.world % args.nodes != 0:
        ap.error("--nodes must be >= 1 and divide --world")
    if args.wall and not (args.links or args.runs_from):
        ap.error("--wall needs --links (or --runs-from)")
    if args.steps_factor <= 0:
        ap.error("--steps-factor must be > 0")
    if args.steps < 1 or args.seeds < 1 or args.eval_every < 1:
        ap.error("--steps, --seeds and --eval-every must be >= 1")
    return args


def main(argv):
    args = parse_args(argv)
    if args.rank:
        return rank_main(args)
    configs = (wall_configurations(args.steps_factor) if args.wall
               else tuning_configurations(args.taus[0]) if args.tune
               else wire_configurations(args.taus[0]) if args.wire_formats
               else hierarchy_configurations(args.taus) if args.nodes > 1
               else delay_configurations(args.taus) if args.delays
               else configurations(args.taus, args.quick))
    if args.only:
        wanted = set(args.only.split(","))
        configs = [c for c in configs if c[0] in wanted or c[0] == "ddp"]
    names = [c[0] for c in configs]
    if args.inner:
        return inner_main(args, configs)
    if not os.path.isdir(os.path.join(args.build, "bindings", "python", "co2")):
        log(f"{args.build}/bindings/python/co2 is missing: build the Python binding first")
        return 77
    if args.runs_from:
        with open(args.runs_from) as f:
            saved = json.load(f)
        args.links = list(saved["links"]) or sorted({r["rate"] for r in saved["runs"]})
        present = {r["name"] for r in saved["runs"]}
        configs = [c for c in configs if c[0] in present]
        return links_report(args, configs, [c[0] for c in configs], saved["runs"])
    if args.links:
        return links_main(args, configs, names)
    earlier = []
    if args.merge_from:
        with open(args.merge_from) as f:
            saved = json.load(f)
        if (saved["steps"], saved["size"], saved["world"]) != (args.steps, args.size, args.world):
            log(f"--merge-from {args.merge_from}: {saved['steps']} steps, {saved['size']}, "
                f"W={saved['world']}, not this run's")
            return 2
        earlier = saved["runs"]
    if args.delays:
        # The rows of every tau measured, this run's and the merged ones, in table order.
        taus = sorted(set(args.taus) | {r["engine_config"]["tau"] for r in earlier
                                        if "tau" in r.get("engine_config", {})})
        measured = {c[0] for c in configs} | {r["name"] for r in earlier}
        names = [c[0] for c in delay_configurations(taus) if c[0] in measured]
    stem = ("quality_tune" if args.tune else "quality_wire" if args.wire_formats
            else "quality_hierarchy" if args.nodes > 1 else "quality_delays" if args.delays
            else "quality")
    started, load_before = time.monotonic(), os.getloadavg()

    def report(runs, partial):
        """The tables of `runs`: printed at the end, written (JSON) after every seed."""
        base = names[0] if args.wire_formats else "ddp"
        table = summarize(runs, names, base)
        if args.nodes > 1:
            # Each row against the first (flat) row of its tau.
            table = {}
            for tau in args.taus:
                mine = [n for n in names if n.startswith(f"co2 t{tau} ")]
                if mine:
                    table.update(summarize(runs, mine, mine[0]))
        delays = delay_table(runs, taus) if args.delays else None
        load = {"start": load_before, "end": os.getloadavg()}
        if not partial:
            import model
            size = model.SIZES[args.size]
            print(f"# LM quality, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
                  f"{args.size} ({size.parameters():,} parameters, batch "
                  f"{args.batch or size.batch} x {size.context} bytes per rank), W={args.world}, "
                  f"{args.steps} steps, seeds {sorted({r['seed'] for r in runs})}; "
                  f"{time.monotonic() - started:.0f} s")
            # Other jobs on the machine slow the runs, not their quality (equal steps).
            print("# load average (1, 5, 15 min): start " +
                  ", ".join(f"{x:.2f}" for x in load["start"]) + "; end " +
                  ", ".join(f"{x:.2f}" for x in load["end"]))
            print_table(table, base_label="fp32" if args.wire_formats
                        else "flat" if args.nodes > 1 else "DDP")
            if delays:
                print_delay_table(delays)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, stem + ".json"), "w") as f:
            json.dump({"command": " ".join(sys.argv), "steps": args.steps, "size": args.size,
                       "world": args.world, "nodes": args.nodes,
                       "seeds": sorted({r["seed"] for r in runs}), "partial": partial,
                       "load_average": load, "summary": table,
                       **({"delays": {str(t): d for t, d in delays.items()}} if delays else {}),
                       "runs": runs}, f, indent=1)

    runs = run_all(args, configs, earlier=earlier, after_seed=lambda runs: report(runs, True))
    report(runs, False)
    if not args.no_plot:
        plot(runs, names, os.path.join(args.out, stem + ".png"), ["step", "seconds"],
             f"{args.size} LM, W={args.world}, {args.steps} steps")
    return 0 if all("unavailable" in r or math.isfinite(r["final_loss"]) for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

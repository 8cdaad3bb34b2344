#!/usr/bin/python3
"""A model of one data-parallel training step at scale, for DDP and CO2.

    /usr/bin/python3 bench/scale/scale.py [--measured bench/results/overlap.json] [--out bench/results]

Parts of the model:
  compute    T_c per GPU per step: 6 * P * tokens / (peak * MFU), the same at every GPU count
             (the assumption a plain alpha-beta model makes: per-GPU efficiency does not change).
  all-reduce alpha-beta. Flat ring over G ranks: 2 (G-1) alpha + 2 (G-1)/G * S / B.
             Hierarchical (what NCCL does with 8 GPUs per node): reduce-scatter inside the node
             over NVLink, one ring per local rank across the n nodes on a 1/8 shard (the 8 shards
             share the node's NIC), all-gather inside the node:
             2 (7/8) S / B_nvlink + 2 (n-1) alpha + 2 (n-1)/n * S / (eta * B_nic).
             eta (payload / line rate) is calibrated from the measured all-reduces.
  overlap    DDP: buckets are all-reduced while backward runs (2/3 of T_c), so
               T_step = T_c/3 + max(2 T_c/3, T_ar) + T_bucket (the last bucket cannot overlap).
             CO2 at tau: the round's all-reduce runs behind the next tau steps, so
               T_round = max(tau T_c, T_ar) + T_pass, per step T_round / tau, where T_pass is the
               fused outer update (memory-bound on the GPU).
             The measured overlap efficiency (co2 where the all-reduce is shorter than tau steps,
             timed-wait table) scales the hidden part.
  hierarchical CO2 (co2 across nodes, gradients averaged every step inside a node of L GPUs):
             per step the intra-node gradient all-reduce 2 (L-1)/L * S / B_nvlink, bucketed and
             overlapped with backward like DDP; per round local rank j all-reduces its N/L shard
             across the n nodes (the L shards share the node's NIC, so the NIC carries
             2 (n-1)/n * S per round, as in NCCL's hierarchical all-reduce), then the next anchor is
             all-gathered inside the node in fp32: (L-1)/L * 4N / B_nvlink; both behind tau steps.
  memory     per GPU: the inner state (bf16 parameters and gradients, fp32 Adam moments; ZeRO-1
             shards the moments over ranks whose gradients are averaged every step) and co2's fp32
             outer state: replicated 3 copies, sharded 1 + 3/W (flat) or 1 + 3/L (hierarchical).
Throughput = tokens * G / T_step; the scalability ratio (the paper's definition) is
throughput(128) / (8 * throughput(16)).

A plain alpha-beta model cannot exceed 1: per-GPU compute is constant and communication never
gets cheaper with more GPUs. The report explains what can (docs/benchmarks.md).

With --measured, the model is first checked against the small-scale measurements: the same
overlap rules with the measured step and all-reduce times predict each measured throughput
ratio.
"""

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# The paper's Table 3 (Sun et al., ICLR 2024): scalability ratio of TransNormer-LLM 7B on
# 80 Gbit/s TCP, 16 -> 128 GPUs.
PAPER_TCP80 = {"DDP (AdamW)": 0.82, "CO2 tau=12": 0.86, "CO2 tau=48": 1.06}


class Cluster:
    def __init__(self, name, nic_gbit, alpha_s, eta):
        self.name = name
        self.nic_bytes = nic_gbit * 1e9 / 8
        self.alpha = alpha_s
        self.eta = eta


def allreduce_seconds(size_bytes, gpus, per_node, cluster, nvlink_bytes, hierarchical=True):
    if gpus <= 1:
        return 0.0
    nodes = max(1, gpus // per_node)
    if not hierarchical:
        # A flat ring: every byte crosses a NIC 2 (G-1)/G times, and the 8 ranks of a node share it.
        share = cluster.eta * cluster.nic_bytes / min(per_node, gpus)
        return 2 * (gpus - 1) * cluster.alpha + 2 * (gpus - 1) / gpus * size_bytes / share
    local = min(per_node, gpus)
    intra = 2 * (local - 1) / local * size_bytes / nvlink_bytes if local > 1 else 0.0
    if nodes == 1:
        return intra
    inter = 2 * (nodes - 1) * cluster.alpha + 2 * (nodes - 1) / nodes * size_bytes / (cluster.eta * cluster.nic_bytes)
    return intra + inter


def step_seconds(algo, tau, t_c, t_ar, t_pass, t_bucket, overlap_eff):
    """Seconds per step of one algorithm from compute, all-reduce and pass times."""
    if algo == "ddp":
        backward = 2 * t_c / 3
        exposed = max(0.0, t_ar - backward * overlap_eff)
        return t_c + exposed + (t_bucket if t_ar > 0 else 0.0)
    if algo == "co2":
        window = tau * t_c * overlap_eff
        return (tau * t_c + max(0.0, t_ar - window) + t_pass) / tau
    if algo in ("localsgd", "diloco"):
        return (tau * t_c + t_ar + t_pass) / tau
    if algo == "sync":  # blocking gradient average, no bucketing (co2's sync here)
        return t_c + t_ar
    raise ValueError(algo)


def calibrate(measured, default_eta):
    """From the overlap benchmark: link efficiency and overlap efficiency, and a check of the
    overlap rules at small scale. Returns (eta, overlap_eff, validation rows)."""
    rows = [r for r in measured["results"] if r.get("work") == "wait"]
    etas = []
    for r in rows:
        if r["algo"] in ("sync", "localsgd", "diloco") and r["rate"] != "none" and r.get("allreduce_time_ms"):
            bits = {"100mbit": 100e6, "1gbit": 1e9}[r["rate"]]
            elements = r["params"]
            bound = 2 * (r["world"] - 1) / r["world"] * 4 * elements / (bits / 8)
            etas.append(bound / (r["allreduce_time_ms"] / 1e3))
    eta = sorted(etas)[len(etas) // 2] if etas else default_eta
    hidden = []
    validation = []
    for r in rows:
        if r["algo"] in ("none", "ddp"):
            continue
        refs = [b for b in rows if b["algo"] == "none" and b["world"] == r["world"] and b["rate"] == r["rate"]]
        base = max(refs, key=lambda b: b["steps_per_s"]) if refs else None
        if not base or not r.get("step_time_ms"):
            continue
        s = r["step_time_ms"] / 1e3
        ar = r["allreduce_time_ms"] / 1e3
        tau = r["tau"]
        s_base = 1.0 / base["steps_per_s"]
        predicted = s_base / step_seconds(r["algo"], tau, s_base, ar, 0.0, 0.0, 1.0)
        measured_ratio = r["steps_per_s"] / base["steps_per_s"]
        validation.append((r["world"], r["rate"], r["algo"], tau, ar / s, predicted, measured_ratio))
        # Hiding is judged where the link limits (capped rates), as on a GPU cluster; uncapped,
        # the all-reduce is host CPU work competing with everything else on 2 cores.
        if r["algo"] == "co2" and r["rate"] != "none" and ar < 0.8 * tau * s:
            hidden.append(measured_ratio)
    overlap_eff = min(1.0, sorted(hidden)[len(hidden) // 2]) if hidden else 1.0
    return eta, overlap_eff, validation


def hierarchical_seconds(size_bytes, anchor_bytes, gpus, per_node, cluster, nvlink_bytes):
    """Hierarchical CO2's communication: (intra-node gradient all-reduce per step, inter-node
    all-reduce per round, intra-node all-gather of the anchor per round)."""
    local = min(per_node, gpus)
    nodes = max(1, gpus // per_node)
    grad = 2 * (local - 1) / local * size_bytes / nvlink_bytes if local > 1 else 0.0
    # Local rank j all-reduces shard j (S / L) across the nodes; the L rings share the node's NIC,
    # so the NIC moves L * 2 (n-1)/n * S/L per round.
    inter = 0.0
    if nodes > 1:
        inter = 2 * (nodes - 1) * cluster.alpha + 2 * (nodes - 1) / nodes * size_bytes / (cluster.eta * cluster.nic_bytes)
    gather = (local - 1) / local * anchor_bytes / nvlink_bytes if local > 1 else 0.0
    return grad, inter, gather


# (label, algorithm, tau): the rows of the prediction and of the sensitivity sweep.
ALGOS = [("DDP (AdamW)", "ddp", 1), ("CO2 tau=12", "co2", 12), ("CO2 tau=48", "co2", 48),
         ("CO2 hier tau=12", "co2_hier", 12), ("CO2 hier tau=48", "co2_hier", 48)]
BLOCKING = [("blocking tau=12", "localsgd", 12), ("blocking tau=48", "localsgd", 48)]


def algo_step(args, algo, tau, gpus, t_c, cluster, overlap_eff):
    """(seconds per step, seconds of the communication that step or round waits for or hides)."""
    size = args.params * args.wire_bytes
    nvlink = args.nvlink_gbs * 1e9
    # The fused outer update on the GPU reads and writes p, anchor, momentum, comm buffer (fp32);
    # charged to every CO2 row (the sharded boundary pass touches only p and B: 16 bytes).
    t_pass = args.params * 32 / (args.hbm_gbs * 1e9)
    if algo == "co2_hier":
        grad, inter, gather = hierarchical_seconds(size, 4 * args.params, gpus, args.gpus_per_node, cluster, nvlink)
        local = min(args.gpus_per_node, gpus)
        bucket = 2 * (local - 1) / local * args.bucket_mb * 1e6 / nvlink if local > 1 else 0.0
        inner = step_seconds("ddp", 1, t_c, grad, 0.0, bucket, overlap_eff)
        return step_seconds("co2", tau, inner, inter + gather, t_pass, 0.0, overlap_eff), inter + gather
    t_ar = allreduce_seconds(size, gpus, args.gpus_per_node, cluster, nvlink)
    bucket = allreduce_seconds(args.bucket_mb * 1e6, gpus, args.gpus_per_node, cluster, nvlink)
    return step_seconds(algo, tau, t_c, t_ar, t_pass, bucket, overlap_eff), t_ar


def compute_seconds(args):
    return 6 * args.params * args.tokens / (args.peak_tflops * 1e12 * args.mfu)


def predict(args, eta_tcp, overlap_eff):
    clusters = [Cluster("80 Gbit/s TCP", 80, args.alpha_tcp, eta_tcp),
                Cluster("800 Gbit/s RDMA", 800, args.alpha_rdma, args.eta_rdma)]
    t_c = compute_seconds(args)
    gpu_counts = [8, 16, 32, 64, 128, 256]
    out = {"t_c": t_c, "t_pass": args.params * 32 / (args.hbm_gbs * 1e9), "clusters": {}}
    for c in clusters:
        per = {}
        for label, algo, tau in ALGOS:
            series = []
            for g in gpu_counts:
                t, comm = algo_step(args, algo, tau, g, t_c, c, overlap_eff)
                series.append({"gpus": g, "t_ar": comm, "t_step": t, "throughput": args.tokens * g / t})
            th = {s["gpus"]: s["throughput"] for s in series}
            per[label] = {"series": series, "scalability": th[128] / (8 * th[16])}
        out["clusters"][c.name] = per
    return out


def sweep_compute(args, eta_tcp, overlap_eff):
    """Scalability on 80 Gbit/s TCP as T_c varies (the quantity the paper does not state)."""
    return [(t_c, scalability_tcp(args, eta_tcp, overlap_eff, t_c)) for t_c in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)]


def scalability_tcp(args, eta, overlap_eff, t_c):
    """{label: throughput(128) / (8 throughput(16))} on 80 Gbit/s TCP, for ALGOS and BLOCKING."""
    c = Cluster("tcp", 80, args.alpha_tcp, eta)
    vals = {}
    for label, algo, tau in ALGOS + BLOCKING:
        th = {g: g / algo_step(args, algo, tau, g, t_c, c, overlap_eff)[0] for g in (16, 128)}
        vals[label] = th[128] / (8 * th[16])
    return vals


def match_ddp(args, eta, overlap_eff, target):
    """The T_c at which the model's DDP scalability equals `target` (bisection; DDP's ratio
    grows with T_c), with every ratio there. None if out of range."""
    lo, hi = 0.01, 100.0
    ddp = lambda t: scalability_tcp(args, eta, overlap_eff, t)["DDP (AdamW)"]
    if not (ddp(lo) <= target <= ddp(hi)):
        return None
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if ddp(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi, scalability_tcp(args, eta, overlap_eff, hi)


GIB = float(1 << 30)


def memory_rows(args, gpus):
    """Per-GPU memory at `gpus` GPUs: (label, inner bytes, outer copies, outer bytes).
    Inner state: bf16 parameters and gradients (4 B per parameter) and fp32 Adam moments (8 B).
    ZeRO-1 shards the moments over ranks whose gradients are averaged every step: all G for DDP,
    the node's L for hierarchical CO2, none for flat CO2 (each rank's moments are its own).
    Outer state, fp32, in model copies: anchor + momentum + comm buffer replicated; sharded over
    k ranks N + 3 N/k (the anchor, momentum and step shards; docs/algorithm.md)."""
    p = args.params
    local = min(args.gpus_per_node, gpus)

    def inner(shards):
        return 4 * p + 8 * p / shards

    rows = [("DDP", inner(1), 0.0),
            ("DDP, ZeRO-1 over G", inner(gpus), 0.0),
            ("flat CO2, replicated", inner(1), 3.0),
            ("flat CO2, sharded over G", inner(1), 1 + 3 / gpus),
            ("hier CO2, replicated, ZeRO-1 over L", inner(local), 3.0),
            ("hier CO2, sharded over L, ZeRO-1 over L", inner(local), 1 + 3 / local)]
    return [(label, b, copies, copies * 4 * p) for label, b, copies in rows]


def memory_table(args, out=sys.stdout):
    gpus = (16, 128)
    cap = args.gpu_memory_gib
    print(f"\n## memory per GPU: {args.params / 1e9:.0f}B parameters, {cap:.0f} GiB GPUs, "
          f"{args.gpus_per_node} GPUs per node (GiB)\n", file=out)
    print("    inner: bf16 parameters + bf16 gradients + fp32 Adam moments = 12 B per parameter, the moments"
          "\n    ZeRO-1 sharded where the ranks' gradients are equal every step; outer: co2's fp32 state"
          "\n    (anchor, momentum, comm buffer; sharded: N + 3N/k). Activations, fp32 master weights, a"
          "\n    compressed wire's residual (+1 copy) and framework buffers are not counted.\n", file=out)
    cols = f"{'inner':>7} {'outer':>7} {'total':>7} {'left':>6}"
    groups = "  |  ".join(f" {g} GPUs ".center(30, "-") for g in gpus)
    print(f"    {'':<40} {'outer copies':>13}  {groups}", file=out)
    print(f"    {'configuration':<40} {'@' + str(gpus[0]) + ' / @' + str(gpus[1]):>13}  {cols}  |  {cols}", file=out)
    result = {}
    by_g = {g: memory_rows(args, g) for g in gpus}
    for i, (label, _, _, _) in enumerate(by_g[gpus[0]]):
        cells = []
        copies = []
        for g in gpus:
            _, inner_b, c, outer_b = by_g[g][i]
            total = (inner_b + outer_b) / GIB
            cells.append(f"{inner_b / GIB:7.1f} {outer_b / GIB:7.1f} {total:7.1f} {cap - total:6.1f}")
            copies.append(c)
            result.setdefault(label, {})[g] = {"inner_gib": inner_b / GIB, "outer_copies": c,
                                               "outer_gib": outer_b / GIB, "total_gib": total,
                                               "left_gib": cap - total}
        print(f"    {label:<40} {copies[0]:5.2f} / {copies[1]:5.2f}  " + "  |  ".join(cells), file=out)
    return result


# Kale et al., "Eager Updates For Overlapped Communication and Computation in DiLoCo" (arXiv
# 2502.12996), Table 5: bandwidth between workers for 95 % compute utilization, 1B model.
KALE_TABLE5_1B_GBIT = {"DDP": 222.0, "streaming DiLoCo, eager overlap, FP4": 0.2}

WIRE_BYTES = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 128.0}


def wire_efficiency(path, rate_bits=1e9):
    """Per format: payload / line rate of the engine's outer all-reduce on the capped link
    (bench/allreduce/wire_formats.sh's table, W = 2, its largest size): the measured time against
    2 (W-1)/W * bytes in the format / rate. Encoding and decoding time is part of it."""
    eta = {}
    if not path or not os.path.exists(path):
        return eta
    capped = False
    best = {}
    for line in open(path):
        if line.startswith("=="):
            capped = "capped" in line
            continue
        f = line.split()
        if not capped or len(f) < 8 or not f[0].isdigit() or f[2] not in WIRE_BYTES:
            continue
        world, fp32_bytes, wire, ms = int(f[0]), int(f[1]), f[2], float(f[3])
        if world != 2:
            continue
        ideal = 2 * (world - 1) / world * fp32_bytes / 4 * WIRE_BYTES[wire] / (rate_bits / 8)
        if wire not in best or fp32_bytes > best[wire][0]:
            best[wire] = (fp32_bytes, ideal / (ms / 1e3))
    return {w: e for w, (_, e) in best.items()}


def bandwidth_for_utilization(step_of_bandwidth, t_c, target=0.95):
    """The smallest per-worker link (bit/s) at which t_c / step >= target (bisection on a log
    scale); None if not reachable below 10 Tbit/s."""
    lo, hi = 1e3, 1e13
    if t_c / step_of_bandwidth(hi) < target:
        return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if t_c / step_of_bandwidth(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


def bandwidth_table(args, overlap_eff, eta_by_wire, out=sys.stdout):
    """Per-worker bandwidth for 95 % compute utilization: DDP (bf16 gradients, bucketed, overlapped
    with backward) and co2 (outer all-reduce behind tau steps) with each wire format, for 1B and
    7B models; `args.workers` workers on a ring, each behind one link."""
    n = args.workers
    print(f"\n## bandwidth for 95 % compute utilization ({n} workers on a ring, one link each, "
          f"alpha {args.alpha_tcp * 1e6:.0f} us; overlap efficiency {overlap_eff:.3f})\n", file=out)
    print("    link efficiency per format (measured, engine's outer all-reduce, 1 Gbit/s): " +
          ", ".join(f"{w} {eta_by_wire.get(w, args.eta_default):.3f}" for w in WIRE_BYTES) +
          ("" if eta_by_wire else " (defaults: no measurement found)"), file=out)
    rows = [("DDP (bf16 gradients)", "ddp", 1, 2.0, "fp32")]
    for tau in (12, 48):
        rows += [(f"co2 tau={tau} {w}", "co2", tau, b, w) for w, b in WIRE_BYTES.items()]
    models = (1e9, 7e9)
    result = {}
    header = "    configuration              " + "  ".join(f"{p / 1e9:.0f}B Gbit/s".rjust(12) for p in models)
    print(header + "   Kale et al. Table 5 (1B)", file=out)
    for label, algo, tau, wire_bytes, wire in rows:
        eta = eta_by_wire.get(wire, args.eta_default) if algo == "co2" else args.eta_default
        cells = []
        for params in models:
            t_c = 6 * params * args.tokens / (args.peak_tflops * 1e12 * args.mfu)
            t_pass = params * 32 / (args.hbm_gbs * 1e9) if algo == "co2" else 0.0
            size = params * wire_bytes

            def step(bits, algo=algo, tau=tau, size=size, t_c=t_c, t_pass=t_pass, eta=eta):
                bytes_per_s = eta * bits / 8
                t_ar = 2 * (n - 1) * args.alpha_tcp + 2 * (n - 1) / n * size / bytes_per_s
                bucket = 2 * (n - 1) / n * args.bucket_mb * 1e6 / bytes_per_s
                return step_seconds(algo, tau, t_c, t_ar, t_pass, bucket, overlap_eff)
            need = bandwidth_for_utilization(step, t_c)
            cells.append(need)
            result.setdefault(label, {})[f"{params / 1e9:.0f}B"] = need
        kale = {"ddp": KALE_TABLE5_1B_GBIT["DDP"]}.get(algo)
        text = "  ".join((f"{c / 1e9:12.3f}" if c else f"{'unreachable':>12}") for c in cells)
        print(f"    {label:<26} {text}   {kale if kale else ''}", file=out)
    print(f"    (Kale et al., eager-overlapped FP4 streaming DiLoCo, 1B: "
          f"{KALE_TABLE5_1B_GBIT['streaming DiLoCo, eager overlap, FP4']} Gbit/s)", file=out)
    return result


def plot(pred, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    colors = {"DDP (AdamW)": "tab:red", "CO2 tau=12": "tab:cyan", "CO2 tau=48": "tab:blue",
              "CO2 hier tau=12": "tab:olive", "CO2 hier tau=48": "tab:green"}
    for ax, (cname, per) in zip(axes, pred["clusters"].items()):
        for label, d in per.items():
            s = d["series"]
            base = next(x for x in s if x["gpus"] == 16)["throughput"] / 16
            xs = [x["gpus"] for x in s]
            ys = [x["throughput"] / (x["gpus"] * base) for x in s]
            style = "--s" if "hier" in label else "-o"
            ax.plot(xs, ys, style, color=colors[label], ms=4, label=f"{label} (128/16: {d['scalability']:.2f})")
        if "TCP" in cname:
            for label, v in PAPER_TCP80.items():
                ax.plot([128], [v], marker="*", ms=12, color=colors[label], ls="none")
            ax.plot([], [], marker="*", ls="none", color="gray", label="paper, Table 3 (7B)")
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xticks([8, 16, 32, 64, 128, 256])
        ax.set_xticklabels(["8", "16", "32", "64", "128", "256"])
        ax.set_xlabel("GPUs (8 per node)")
        ax.set_title(f"TransNormer-LLM 7B, {cname}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    axes[0].set_ylabel("per-GPU throughput / per-GPU at 16")
    fig.suptitle(f"alpha-beta model, T_c = {pred['t_c']:.2f} s per step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", default=os.path.join(ROOT, "bench", "results", "overlap.json"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--params", type=float, default=7e9, help="model parameters (TransNormer-LLM 7B)")
    ap.add_argument("--wire-bytes", type=float, default=2.0,
                    help="bytes per element on the wire (bf16 gradients / deltas)")
    ap.add_argument("--tokens", type=float, default=8192, help="tokens per GPU per step")
    ap.add_argument("--peak-tflops", type=float, default=312.0, help="A100 bf16 dense")
    ap.add_argument("--mfu", type=float, default=0.40)
    ap.add_argument("--hbm-gbs", type=float, default=1500.0, help="GPU memory bandwidth for the outer pass")
    ap.add_argument("--nvlink-gbs", type=float, default=230.0, help="intra-node all-reduce bus bandwidth")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--alpha-tcp", type=float, default=30e-6)
    ap.add_argument("--alpha-rdma", type=float, default=5e-6)
    ap.add_argument("--eta-tcp", type=float, default=0.0, help="0: calibrate from --measured, else 0.9")
    ap.add_argument("--eta-rdma", type=float, default=0.9)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket (its default)")
    ap.add_argument("--gpu-memory-gib", type=float, default=80.0, help="memory per GPU (A100 80GB)")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--bandwidth-table", action="store_true",
                    help="only the bandwidth needed for 95 %% compute utilization per wire format")
    ap.add_argument("--allreduce-wire", default=os.path.join(ROOT, "bench", "results", "allreduce_wire.txt"),
                    help="bench/allreduce/wire_formats.sh output (link efficiency per format)")
    ap.add_argument("--overlap-wire", default=os.path.join(ROOT, "bench", "results", "overlap_wire.json"),
                    help="bench/overlap/wire_formats.py output (overlap efficiency)")
    ap.add_argument("--workers", type=int, default=2, help="workers on the ring (bandwidth table)")
    ap.add_argument("--eta-default", type=float, default=0.9)
    ap.add_argument("--link-bound", action="store_true",
                    help="every format at fp32's measured link efficiency: what compression buys "
                         "where encoding is not the bottleneck (it is on the 2 shared cores here)")
    args = ap.parse_args(argv)
    if args.bandwidth_table:
        eta_by_wire = wire_efficiency(args.allreduce_wire)
        if args.link_bound and "fp32" in eta_by_wire:
            eta_by_wire = {w: eta_by_wire["fp32"] for w in WIRE_BYTES}
        if "fp32" in eta_by_wire:
            args.eta_default = eta_by_wire["fp32"]  # DDP's link efficiency too
        overlap_eff = 1.0
        if os.path.exists(args.overlap_wire):
            with open(args.overlap_wire) as f:
                rows = json.load(f)["rows"]
            # Where the all-reduce fits in tau steps with margin, as calibrate() judges hiding.
            hidden = sorted(r["ratio"] for r in rows
                            if r["allreduce_time_ms"] < 0.8 * r["tau"] * r["step_time_ms"])
            if hidden:
                overlap_eff = min(1.0, hidden[len(hidden) // 2])
        print(f"# bandwidth table; link efficiency from {args.allreduce_wire}, overlap efficiency "
              f"from {args.overlap_wire}; T_c = 6 P x {args.tokens:.0f} tokens / "
              f"({args.peak_tflops:.0f} TFLOP/s x MFU {args.mfu})")
        bandwidth_table(args, overlap_eff, eta_by_wire)
        return 0

    eta, overlap_eff, validation = 0.9, 1.0, []
    source = "defaults (no measurements found)"
    if os.path.exists(args.measured):
        with open(args.measured) as f:
            measured = json.load(f)
        eta, overlap_eff, validation = calibrate(measured, 0.9)
        source = f"{args.measured} ({measured.get('date', '?')}, co2 ranks: {measured.get('transport', '?')})"
    if args.eta_tcp > 0:
        eta = args.eta_tcp
    print(f"# scale model; calibration from {source}")
    print(f"link efficiency eta (payload / line rate of measured all-reduces): {eta:.3f}")
    print(f"overlap efficiency (co2 / compute-only where the all-reduce fits in tau steps): {overlap_eff:.3f}")
    if validation:
        print("\n## the overlap rules against the measurements (timed-wait step)\n")
        print("    W  rate     algorithm  tau  all-reduce/step  model   measured")
        for w, rate, algo, tau, ar_steps, pred, meas in sorted(validation, key=lambda v: (v[0], v[1], v[2], v[3])):
            print(f"    {w}  {rate:<8} {algo:<10} {tau:>3}  {ar_steps:15.1f}  {pred:6.3f}  {meas:8.3f}")

    pred = predict(args, eta, overlap_eff)
    print(f"\n## prediction: TransNormer-LLM 7B, {args.gpus_per_node} GPUs per node, hierarchical all-reduce\n")
    print(f"T_c = 6 P tokens / (peak MFU) = {pred['t_c']:.3f} s per step ({args.tokens:.0f} tokens per GPU, "
          f"{args.peak_tflops:.0f} TFLOP/s at MFU {args.mfu}); outer pass {pred['t_pass'] * 1e3:.0f} ms; "
          f"wire {args.wire_bytes:.0f} B per element ({args.params * args.wire_bytes / 1e9:.0f} GB per all-reduce)")
    print("CO2: every GPU an outer participant (the all-reduce as NCCL's hierarchical one); CO2 hier: "
          "co2 across nodes, gradients averaged every step inside the node")
    memory = {g: {label: (inner + outer) / GIB for label, inner, _, outer in memory_rows(args, g)} for g in (16, 128)}
    # The memory column: the sharded configuration of each row (DDP with ZeRO-1).
    mem_label = {"ddp": "DDP, ZeRO-1 over G", "co2": "flat CO2, sharded over G",
                 "co2_hier": "hier CO2, sharded over L, ZeRO-1 over L"}
    for cname, per in pred["clusters"].items():
        print(f"\n{cname}:")
        ar16 = per["DDP (AdamW)"]["series"][1]["t_ar"]
        ar128 = per["DDP (AdamW)"]["series"][4]["t_ar"]
        h16 = per["CO2 hier tau=12"]["series"][1]["t_ar"]
        h128 = per["CO2 hier tau=12"]["series"][4]["t_ar"]
        print(f"  one all-reduce: {ar16:.2f} s at 16 GPUs, {ar128:.2f} s at 128; hierarchical round "
              f"(inter-node shards + intra-node all-gather): {h16:.2f} s at 16, {h128:.2f} s at 128")
        print("  algorithm        step@16 s  step@128 s  scalability  paper (Table 3)  GiB/GPU@16  @128 (sharded)")
        for label, algo, _ in ALGOS:
            d = per[label]
            s16 = d["series"][1]["t_step"]
            s128 = d["series"][4]["t_step"]
            paper = PAPER_TCP80.get(label) if "TCP" in cname else None
            m = mem_label[algo]
            print(f"  {label:<15} {s16:9.3f}  {s128:10.3f}  {d['scalability']:11.3f}  "
                  f"{paper if paper is not None else '-':>15}  {memory[16][m]:10.1f}  {memory[128][m]:5.1f}")
    print("\n## sensitivity: scalability on 80 Gbit/s TCP against the per-step compute T_c\n")
    print("    (blocking outer step: the outer all-reduce not overlapped, as in localsgd/diloco and in")
    print("    the released CO2 code's default mode, DESIGN.md section 7)\n")
    labels = [label for label, _, _ in ALGOS + BLOCKING]
    short = {"DDP (AdamW)": "DDP", "CO2 tau=12": "CO2 12", "CO2 tau=48": "CO2 48", "CO2 hier tau=12": "hier 12",
             "CO2 hier tau=48": "hier 48", "blocking tau=12": "block 12", "blocking tau=48": "block 48"}
    print("    T_c s  " + "".join(f"{short[l]:>9}" for l in labels))
    sweep = sweep_compute(args, eta, overlap_eff)
    for t_c, vals in sweep:
        print(f"    {t_c:5.2f}  " + "".join(f"{vals[l]:9.3f}" for l in labels))
    print("    paper  " + "".join(f"{PAPER_TCP80[l]:9.2f}" if l in PAPER_TCP80 else f"{'':9}" for l in labels))
    t_match = match_ddp(args, eta, overlap_eff, PAPER_TCP80["DDP (AdamW)"])
    if t_match:
        t, v = t_match
        print(f"\nThe model's DDP reaches the paper's 0.82 at T_c = {t:.2f} s; there it predicts "
              f"CO2 tau=12 {v['CO2 tau=12']:.3f} (paper 0.86) and CO2 tau=48 {v['CO2 tau=48']:.3f} (paper 1.06); "
              f"hierarchical CO2 {v['CO2 hier tau=12']:.3f} and {v['CO2 hier tau=48']:.3f}; with a blocking "
              f"outer step {v['blocking tau=12']:.3f} and {v['blocking tau=48']:.3f}.")
    mem = memory_table(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump({"eta_tcp": eta, "overlap_eff": overlap_eff, "prediction": pred,
                   "sensitivity": [{"t_c": t, **v} for t, v in sweep],
                   "ddp_matched": {"t_c": t_match[0], **t_match[1]} if t_match else None,
                   "memory_gib": mem}, f, indent=1)
    if not args.no_plot:
        path = os.path.join(args.out, "scale.png")
        plot(pred, path)
        print(f"\nwrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

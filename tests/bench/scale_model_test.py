#!/usr/bin/python3
"""bench/scale/scale.py: the memory accounting and the hierarchical schedule hold the invariants
docs/benchmarks.md states (sharded outer state 1 + 3/k copies; hierarchical round = inter-node
shards + intra-node fp32 all-gather; a hidden round cannot beat compute), and the program runs
end to end with and without measurements, writing scale.json.
    scale_model_test.py SOURCE_ROOT"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

src = sys.argv[1]
sys.path.insert(0, os.path.join(src, "bench", "scale"))
import scale  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel)


args = argparse.Namespace(
    params=7e9, wire_bytes=2.0, tokens=8192, peak_tflops=312.0, mfu=0.4, hbm_gbs=1500.0, nvlink_gbs=230.0,
    gpus_per_node=8, alpha_tcp=30e-6, alpha_rdma=5e-6, eta_rdma=0.9, bucket_mb=25.0, gpu_memory_gib=80.0)

# Memory: outer copies 3 replicated, 1 + 3/G flat sharded, 1 + 3/L hierarchical; inner 12 B per
# parameter unsharded, 4 + 8/k with ZeRO-1 over k.
for g in (16, 128):
    rows = {label: (inner, copies, outer) for label, inner, copies, outer in scale.memory_rows(args, g)}
    check(close(rows["flat CO2, replicated"][1], 3.0), f"replicated copies at {g}")
    check(close(rows["flat CO2, sharded over G"][1], 1 + 3 / g), f"flat sharded copies at {g}")
    check(close(rows["hier CO2, sharded over L, ZeRO-1 over L"][1], 1 + 3 / 8), f"hier sharded copies at {g}")
    check(close(rows["DDP"][0], 12 * 7e9), f"unsharded inner state at {g}")
    check(close(rows["DDP, ZeRO-1 over G"][0], 4 * 7e9 + 8 * 7e9 / g), f"ZeRO-1 inner state at {g}")
    check(close(rows["hier CO2, sharded over L, ZeRO-1 over L"][2], (1 + 3 / 8) * 4 * 7e9), f"hier outer bytes at {g}")

# Hierarchical schedule: one node has no inter-node term; at n nodes the NIC carries
# 2 (n-1)/n S per round; the all-gather moves (L-1)/L of the fp32 anchor over NVLink.
c = scale.Cluster("tcp", 80, 30e-6, 0.8)
nv = 230e9
grad, inter, gather = scale.hierarchical_seconds(14e9, 28e9, 8, 8, c, nv)
check(inter == 0.0, "one node: no inter-node all-reduce")
check(close(grad, 2 * 7 / 8 * 14e9 / nv), "intra-node gradient all-reduce")
check(close(gather, 7 / 8 * 28e9 / nv), "intra-node all-gather of the fp32 anchor")
_, inter, _ = scale.hierarchical_seconds(14e9, 28e9, 128, 8, c, nv)
check(close(inter, 2 * 15 * 30e-6 + 2 * 15 / 16 * 14e9 / (0.8 * 10e9)), "inter-node shards share the NIC")

# Scalability: hidden communication reaches 1 at most; a blocking round is below the hidden one.
for t_c in (0.25, 3.0):
    v = scale.scalability_tcp(args, 0.8, 1.0, t_c)
    for label, x in v.items():
        check(x <= 1.0 + 1e-12, f"{label} at T_c {t_c}: {x} > 1")
    check(v["blocking tau=12"] < v["CO2 tau=12"], f"blocking below overlapped at T_c {t_c}")
    check(v["CO2 hier tau=12"] <= v["CO2 hier tau=48"] + 1e-12, f"hier tau 48 no worse than 12 at T_c {t_c}")

# End to end: defaults (no measurement) and a measured file, both write scale.json with the rows.
with tempfile.TemporaryDirectory() as out:
    for measured in (os.path.join(out, "absent.json"), os.path.join(src, "bench", "results", "overlap.json")):
        if not os.path.exists(measured) and "absent" not in measured:
            continue
        r = subprocess.run([sys.executable, os.path.join(src, "bench", "scale", "scale.py"), "--measured", measured,
                            "--out", out, "--no-plot"], capture_output=True, text=True, timeout=120)
        check(r.returncode == 0, f"scale.py exit {r.returncode} with {measured}: {r.stderr[-500:]}")
        check("CO2 hier tau=48" in r.stdout and "memory per GPU" in r.stdout, f"rows missing with {measured}")
        with open(os.path.join(out, "scale.json")) as f:
            result = json.load(f)
        check("hier CO2, sharded over L, ZeRO-1 over L" in result["memory_gib"], "memory in scale.json")
        check("CO2 hier tau=12" in result["prediction"]["clusters"]["80 Gbit/s TCP"], "hier rows in scale.json")

print("ok" if not failures else f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)

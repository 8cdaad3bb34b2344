#!/usr/bin/python3
"""Plots digits.py's results: training loss against steps and against wall time, one line per
algorithm and seed (python3-matplotlib, no display needed).

    /usr/bin/python3 examples/python/plot.py results/digits.json [--out results/digits.png]
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the headless backend

COLORS = {"ddp": "black", "sync": "tab:blue", "localsgd": "tab:green", "diloco": "tab:orange",
          "co2": "tab:red"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    with open(args.results) as f:
        results = json.load(f)
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(12, 4.5))
    labelled = set()
    for run in results["runs"]:
        name, curve = run["algorithm"], run["curve"]
        label = None if name in labelled else name
        labelled.add(name)
        style = dict(color=COLORS.get(name), alpha=0.8, linewidth=1.2, label=label)
        by_step.plot(curve["steps"], curve["loss"], **style)
        by_time.plot(curve["seconds"], curve["loss"], **style)
    for axis, xlabel in ((by_step, "optimizer steps per rank"), (by_time, "wall time (s)")):
        axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel("training loss (rank 0, mean per epoch)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    world = results["runs"][0]["world_size"] if results["runs"] else "?"
    fig.suptitle(f"digits MLP, {world} ranks: every seed of every algorithm")
    fig.tight_layout()
    out = args.out or os.path.splitext(args.results)[0] + ".png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()

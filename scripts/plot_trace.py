#!/usr/bin/python3
"""Draws the overlap of one co2 run from its CO2_TRACE files (docs/observability.md) as a PNG:
per rank, one row for the training thread (steps, boundaries, waits, passes) and one for the
communicator's progress thread (collectives: the round's all-reduce on the bulk lane, small
ones on the control lane), on one time axis. A wait on the training row under an all-reduce on
the progress row is communication that was not hidden.

    /usr/bin/python3 scripts/plot_trace.py run/trace.json -o overlap.png
    /usr/bin/python3 scripts/plot_trace.py run/trace.rank0.json run/trace.rank1.json \\
        --window 1000:1500 -o zoom.png

Each argument is a trace file, or the CO2_TRACE value of the run (then every rank's file:
"run/trace.json" stands for run/trace.rank*.json). --window START:END draws only that span, in
ms from the earliest event. Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import glob
import json
import os
import sys

TRAINING, BULK, CONTROL = 1, 2, 3
COLORS = {"step": "#4c72b0", "boundary": "#b0b0b0", "wait": "#d62728", "pass": "#8172b2",
          "bulk": "#55a868", "control": "#dd8452"}


def rank_files(argument):
    """The files one argument names: itself, or the per-rank files of a CO2_TRACE value."""
    if os.path.isfile(argument):
        return [argument]
    head, name = os.path.split(argument)
    stem, dot, extension = name.rpartition(".")
    pattern = f"{stem}.rank*.{extension}" if dot and stem else f"{name}.rank*"
    found = sorted(glob.glob(os.path.join(head, pattern)))
    if not found:
        sys.exit(f"plot_trace: no trace file {argument} nor {os.path.join(head, pattern)}")
    return found


def load(paths):
    """{rank: [event, ...]} of the complete ("X") events of every file."""
    ranks = {}
    for path in paths:
        with open(path) as f:
            trace = json.load(f)
        for event in trace["traceEvents"]:
            if event.get("ph") == "X":
                ranks.setdefault(int(event["pid"]), []).append(event)
    if not ranks:
        sys.exit("plot_trace: the traces hold no events (was the run finalized?)")
    return ranks


def category(event):
    name = event["name"]
    if event["tid"] == TRAINING:
        if name == "step":
            return "step"
        if name.startswith("wait"):
            return "wait"
        if name.endswith("pass"):
            return "pass"
        return "boundary"
    if name.endswith("pass"):
        return "pass"
    return "control" if event["tid"] == CONTROL else "bulk"


def hidden_share(events):
    """1 - waited / outer-average time: what the statistics call hidden_fraction, for the round
    all-reduces kept in the trace; None without any."""
    collective = sum(e["dur"] for e in events if e["name"] == "outer-average")
    waited = sum(e["dur"] for e in events if e["name"] == "wait outer-average")
    return None if collective <= 0 else max(0.0, min(1.0, 1.0 - waited / collective))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="trace files or the CO2_TRACE value")
    parser.add_argument("-o", "--output", default="overlap.png", help="the PNG to write")
    parser.add_argument("--window", help="START:END in ms from the earliest event")
    args = parser.parse_args()

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    paths = [p for argument in args.traces for p in rank_files(argument)]
    ranks = load(paths)
    origin = min(e["ts"] for events in ranks.values() for e in events)
    lo, hi = -float("inf"), float("inf")
    if args.window:
        try:
            lo, hi = (float(v) for v in args.window.split(":"))
        except ValueError:
            sys.exit(f"plot_trace: --window takes START:END in ms, not {args.window!r}")

    rows = []  # (label, {category: [(start_ms, width_ms)]})
    for rank in sorted(ranks):
        training, progress = {}, {}
        for e in ranks[rank]:
            start = (e["ts"] - origin) / 1000.0
            width = e["dur"] / 1000.0
            if start + width < lo or start > hi:
                continue
            lane = training if e["tid"] == TRAINING else progress
            lane.setdefault(category(e), []).append((start, max(width, 1e-3)))
        share = hidden_share(ranks[rank])
        hidden = f" (hidden {100 * share:.0f}%)" if share is not None else ""
        rows.append((f"rank {rank} training{hidden}", training))
        rows.append((f"rank {rank} progress", progress))

    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.7 * len(rows)))
    # Drawn back to front: boundaries under their waits and passes; control-lane collectives
    # as thin bars at the bottom of the progress row.
    order = ["boundary", "step", "bulk", "pass", "wait", "control"]
    for index, (_, lanes) in enumerate(rows):
        y = len(rows) - 1 - index
        for name in order:
            spans = lanes.get(name)
            if not spans:
                continue
            if name == "control":
                ax.broken_barh(spans, (y - 0.4, 0.25), facecolors=COLORS[name])
            elif name in ("wait", "pass"):
                ax.broken_barh(spans, (y - 0.25, 0.5), facecolors=COLORS[name])
            else:
                ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=COLORS[name], edgecolor="white",
                               linewidth=0.3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([label for label, _ in reversed(rows)])
    ax.set_xlabel("time (ms)")
    if args.window:
        ax.set_xlim(lo, hi)
    ax.set_title("co2 overlap: training thread vs collectives per rank")
    legend = [("step (caller's compute)", "step"), ("boundary", "boundary"), ("wait", "wait"),
              ("pass", "pass"), ("collective, bulk lane", "bulk"), ("collective, control lane", "control")]
    ax.legend(handles=[Patch(color=COLORS[c], label=label) for label, c in legend],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 0.3 / len(rows)), ncol=6, fontsize="small")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_trace: {len(paths)} trace file(s), {len(ranks)} rank(s) -> {args.output}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""What a join costs: a process joins a running elastic group (issue 26, "join and heal").

W members over UCX/TCP on loopback train STATE_MIB of fp32 parameters with a fixed step time (the
sleep stands in for compute); once they run, the driver starts one more process launched like a
rank (as co2run --max-restarts does), which finds the group's door open and asks to join. Printed
per case (the median over the repeats, with the range):
- admitted: from the joiner's start to its co2_comm_create returning (process start, its
  parameters built, UCX, the request seen at the members' next agreement, the synchronize and
  the new transport);
- state received: its co2_engine_commit, timed from the call to its return (the counts gathered,
  the layout checked and the buffers allocated, the anchor broadcast from the donor: the outer
  momentum too where beta > 0, but the automatic beta is 0 at W <= 16, the parameters set to
  it and the anchors checked), and the rate of that commit in GB/s of anchor. The joiner builds
  its parameters before it asks to join, as a framework builds its model first (before
  2026-12-07 bench/elastic/elastic_rank.cpp filled them after it was admitted, and this column
  counted that fill from the admission on);
- the members' stall: how much longer than a plain step the step that admitted it took.

    /usr/bin/python3 bench/elastic/join.py [--build build] [--world 2] [--states 64,512] [--shard]

On links capped at 1 Gbit/s (bench/overlap/netns.sh, one namespace per process, W + 1 of them):

    bash bench/overlap/netns.sh run --ranks 3 --rate 1gbit -- /usr/bin/python3 bench/elastic/join.py
"""
import argparse
import os
import signal
import statistics
import time

from leave import Rank, free_port


def launch(args, rank, port, state_mib, slot=None):
    """Rank `rank` of the launch; `slot`: the namespace it runs in under netns.sh (the joiner's
    is the one after the members')."""
    slot = rank if slot is None else slot
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.world), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(args.world), MASTER_PORT=str(port), CO2_AUTH_TOKEN="bench",
               UCX_TLS="tcp", CO2_LOG_LEVEL="error")
    command = [args.worker, str(state_mib), str(args.tau), str(args.step_ms), str(args.timeout_ms), str(10 ** 9),
               str(int(args.shard))]
    prefix = os.environ.get("CO2_NETNS_PREFIX")
    if prefix:  # bench/overlap/netns.sh: one namespace per process, its link capped
        env.update(MASTER_ADDR=os.environ["CO2_NETNS_ADDR_0"],
                   UCX_NET_DEVICES=os.environ.get("CO2_NETNS_IFACE_PATTERN", "eth%d") % slot)
        command = ["ip", "netns", "exec", f"{prefix}r{slot}"] + command
    else:
        env.update(MASTER_ADDR="127.0.0.1", UCX_NET_DEVICES="lo")
    return Rank(command, env)


def timestamp(rank, word):
    return next((t, w) for t, w in rank.lines if w and w[0] == word)


def run_case(args, state_mib):
    port = free_port()
    members = [launch(args, r, port, state_mib) for r in range(args.world)]
    joiner = None
    try:
        deadline = time.monotonic() + 300
        while min(m.steps() for m in members) < args.join_step:
            if time.monotonic() > deadline or any(m.proc.poll() is not None for m in members):
                raise RuntimeError("the group did not reach the join step: " + " | ".join(
                    m.proc.stderr.read() if m.proc.poll() is not None else "" for m in members))
            time.sleep(0.005)
        started = time.time_ns()
        joiner = launch(args, args.world - 1, port, state_mib, slot=args.world)
        while sum(1 for _, w in joiner.lines if w and w[0] == "t") < 3:
            if time.monotonic() > deadline or joiner.proc.poll() is not None:
                raise RuntimeError(f"the joiner did not train: {joiner.proc.stderr.read() if joiner.proc.poll() is not None else 'timed out'}")
            time.sleep(0.005)
        created_ns = int(timestamp(joiner, "created")[1][1])
        committing_ns = int(timestamp(joiner, "committing")[1][1])
        committed = timestamp(joiner, "committed")[1]
        committed_ns, state_bytes = int(committed[1]), int(committed[5])
        stalls = []
        for m in members:
            steps = [(int(w[1]), w) for _, w in m.lines if w and w[0] == "t"]
            at = next(i for i, (_, w) in enumerate(steps) if len(w) > 4 and w[4] == "changed")
            plain = statistics.median(b[0] - a[0] for a, b in zip(steps[at - 8:at - 1], steps[at - 7:at]))
            stalls.append((steps[at][0] - steps[at - 1][0] - plain) / 1e6)
        receive_s = (committed_ns - committing_ns) / 1e9
        sent_bytes = state_mib * 2 ** 20
        return {"admitted_ms": (created_ns - started) / 1e6, "receive_ms": receive_s * 1e3,
                "rate_gbs": sent_bytes / receive_s / 1e9, "stall_ms": max(stalls), "state_bytes": state_bytes}
    finally:
        for r in members + ([joiner] if joiner else []):
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGKILL)
                r.proc.wait()


def link_bytes_per_s():
    """The capped link's rate under netns.sh (tc syntax: 100mbit, 1gbit), else None."""
    rate = os.environ.get("CO2_NETNS_RATE", "none") if os.environ.get("CO2_NETNS_PREFIX") else "none"
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale / 8
    return None


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--states", default="64,512", help="MiB of fp32 parameters, comma-separated")
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=100)
    parser.add_argument("--join-step", type=int, default=12)
    parser.add_argument("--timeout-ms", type=int, default=30000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard", action="store_true",
                        help="outer state sharded over the ranks: every shard's holder sends it, all at once")
    args = parser.parse_args()
    args.worker = os.path.join(args.build, "bench", "elastic_rank")
    where = (f"links capped at {os.environ['CO2_NETNS_RATE']} (netns)" if os.environ.get("CO2_NETNS_PREFIX")
            else "loopback")
    print(f"# elastic join, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: W = {args.world} members + 1 "
          f"joiner over UCX/TCP, {where}{', outer state sharded' if args.shard else ''}, tau {args.tau}, "
          f"step {args.step_ms:g} ms, {args.repeats} repeats "
          f"(median, range); load average {os.getloadavg()[0]:.2f}")
    link = link_bytes_per_s()
    print("| parameters | outer state held | joiner admitted after | state received in | rate | "
          + ("of the link | " if link else "") + "members' stall |")
    print("|---|---|---|---|---|---|" + ("---|" if link else ""))
    for state_mib in (float(s) for s in args.states.split(",")):
        cases = [run_case(args, state_mib) for _ in range(args.repeats)]
        print(f"| {state_mib:g} MiB | {cases[0]['state_bytes'] / 2**20:.0f} MiB "
              f"| {spread([c['admitted_ms'] for c in cases], '{:.0f}')} ms "
              f"| {spread([c['receive_ms'] for c in cases], '{:.0f}')} ms "
              f"| {spread([c['rate_gbs'] for c in cases], '{:.2f}')} GB/s "
              + (f"| {spread([c['rate_gbs'] * 1e9 / link for c in cases], '{:.2f}')} " if link else "") +
              f"| {spread([c['stall_ms'] for c in cases], '{:.0f}')} ms |", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

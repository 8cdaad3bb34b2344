#!/usr/bin/env python3
"""How long an elastic group's survivors lose to a rank that dies, stalls or leaves (issue 26).

W processes over UCX/TCP on loopback train STATE_MIB of parameters with a fixed step time (the
sleep stands in for compute); once they run, the driver SIGKILLs (or SIGSTOPs) one rank, or sends
it SIGUSR1 (it calls co2_engine_leave), and notes the wall time. Each survivor reports when the
engine call that met the change returned CO2_MEMBERSHIP_CHANGED and when its first step after it
returned. Printed per case (the max over survivors): the time to MEMBERSHIP_CHANGED, to the first
step after, the stall of the step that returned the change (its time less the step time), the
round time before the fault, the target (timeout + one round) and the steps lost (the last step
before the change against the step the group resumed at).

    /usr/bin/python3 bench/elastic/leave.py [--build build] [--world 4] [--state-mib 16] [--shard]
        [--logs DIR] [--timeouts 2000,5000] [--cases stop-2,kill-2]

--logs DIR runs the ranks at CO2_LOG_LEVEL=info and writes each case's rank logs to DIR, every
line prefixed by when the driver read it, in ms since the fault: when each survivor met the
failure and when the coordinator decided.
"""
import argparse
import os
import signal
import socket
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Rank:
    def __init__(self, command, env):
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.lines = []
        self.log = []  # (time_ns, line) of stderr: drained so that info logs never fill the pipe
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time_ns(), line.split()))

    def _read_log(self):
        for line in self.proc.stderr:
            self.log.append((time.time_ns(), line.rstrip("\n")))

    def errors(self):
        return "\n".join(line for _, line in self.log)

    def steps(self):
        done = [int(w[3]) for _, w in self.lines if w and w[0] == "t"]
        return done[-1] if done else 0


def run_case(args, fault, victim, timeout_ms):
    port = free_port()
    ranks = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   CO2_AUTH_TOKEN="bench", UCX_TLS="tcp", UCX_NET_DEVICES="lo",
                   CO2_LOG_LEVEL="info" if args.logs else "error")
        ranks.append(Rank([args.worker, str(args.state_mib), str(args.tau), str(args.step_ms),
                           str(timeout_ms), str(args.steps), str(int(args.shard))], env))
    try:
        deadline = time.monotonic() + 120
        while min(r.steps() for r in ranks) < args.fault_step:
            if time.monotonic() > deadline or any(r.proc.poll() is not None for r in ranks):
                raise RuntimeError("the group did not reach the fault step: " +
                                   " | ".join(r.errors() if r.proc.poll() is not None else "" for r in ranks))
            time.sleep(0.005)
        before = [t for t, w in ranks[0].lines if w and w[0] == "t"]
        step_ns = (before[-1] - before[len(before) // 2]) / max(1, len(before) - 1 - len(before) // 2)
        fault_at = time.time_ns()
        ranks[victim].proc.send_signal({"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "leave": signal.SIGUSR1}[fault])
        survivors = [r for i, r in enumerate(ranks) if i != victim]
        for r in survivors:
            r.proc.wait(timeout=timeout_ms / 1000 * 3 + 120)
            r.reader.join(timeout=10)
        changed, first_after, resumed, last_before, stall = [], [], [], [], []
        for r in survivors:
            if r.proc.returncode != 0:
                raise RuntimeError(f"a survivor failed ({r.proc.returncode}): {r.errors()}")
            words = [w for _, w in r.lines if w and w[0] == "t"]
            at = next(i for i, w in enumerate(words) if len(w) > 4 and w[4] == "changed")
            changed.append((int(words[at][1]) - fault_at) / 1e6)
            first_after.append((int(words[at + 1][1]) - fault_at) / 1e6)
            resumed.append(int(words[at][3]))
            stall.append((int(words[at][1]) - int(words[at - 1][1])) / 1e6 - args.step_ms)
            last_before.append(max(int(w[3]) for w in words[:at] if int(w[1]) < fault_at))
        if fault == "leave" and ranks[victim].proc.wait(timeout=30) != 0:
            raise RuntimeError(f"the leaving rank failed: {ranks[victim].errors()}")
        return {"fault": fault, "victim": victim, "timeout_ms": timeout_ms, "changed_ms": max(changed),
                "stall_ms": max(stall),
                "first_step_ms": max(first_after), "round_ms": step_ns * args.tau / 1e6,
                "last_before": min(last_before), "resumed": resumed[0]}
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
                r.proc.kill()
                r.proc.wait()
        if args.logs and "fault_at" in locals():
            time.sleep(0.2)  # the log readers take the last lines of the closed pipes
            os.makedirs(args.logs, exist_ok=True)
            for i, r in enumerate(ranks):
                with open(os.path.join(args.logs, f"{fault}-{victim}-{timeout_ms}-rank{i}.txt"), "w") as out:
                    out.writelines(f"{(t - fault_at) / 1e6:9.0f} {line}\n" for t, line in r.log)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--state-mib", type=float, default=16)
    parser.add_argument("--tau", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=50)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--fault-step", type=int, default=30)
    parser.add_argument("--timeouts", default="2000,5000")
    parser.add_argument("--shard", action="store_true", help="outer state sharded over the ranks")
    parser.add_argument("--logs", help="write each case's rank logs (CO2_LOG_LEVEL=info) here")
    parser.add_argument("--cases", help="only these cases, e.g. stop-2,kill-2 (default: all five per timeout)")
    args = parser.parse_args()
    args.worker = os.path.join(args.build, "bench", "elastic_rank")
    cases = [(fault, victim, int(t)) for t in args.timeouts.split(",")
             for fault, victim in (("kill", 2), ("kill", 0), ("stop", 2), ("stop", 0), ("leave", 2))
             if not args.cases or f"{fault}-{victim}" in args.cases.split(",")]
    if not cases:
        parser.error(f"--cases {args.cases!r} names none of kill-2, kill-0, stop-2, stop-0, leave-2")
    print(f"# elastic leave, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: W = {args.world} over "
          f"UCX/TCP loopback, {args.state_mib:g} MiB of fp32 parameters"
          f"{', outer state sharded' if args.shard else ''}, tau {args.tau}, step "
          f"{args.step_ms:g} ms; load average {os.getloadavg()[0]:.2f}")
    print("| fault | rank | timeout | MEMBERSHIP_CHANGED after | first step after | stall of that step | round | "
          "timeout + round | last step before → resumed at |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fault, victim, timeout_ms in cases:
        c = run_case(args, fault, victim, timeout_ms)
        name = {"kill": "SIGKILL", "stop": "SIGSTOP", "leave": "co2_engine_leave"}[fault]
        print(f"| {name} | {victim}{' (coordinator)' if victim == 0 else ''} "
              f"| {timeout_ms} ms | {c['changed_ms']:.0f} ms | {c['first_step_ms']:.0f} ms | {c['stall_ms']:.0f} ms "
              f"| {c['round_ms']:.0f} ms "
              f"| {timeout_ms + c['round_ms']:.0f} ms | {c['last_before']} → {c['resumed']} |", flush=True)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

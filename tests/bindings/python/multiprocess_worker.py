"""One rank of test_multiprocess.py, launched as a real process with the launcher's environment
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, as co2run and torchrun set them).

    multiprocess_worker.py train ALGORITHM OUT_DIR [APPLY_STEP]
    multiprocess_worker.py checkpoint ALGORITHM PHASE OUT_DIR    (PHASE: full, first, second)
    multiprocess_worker.py rank0_saves OUT_DIR     (the DDP habit: only rank 0 calls state_dict)
    multiprocess_worker.py uneven join|nojoin OUT_DIR     (the last rank is 5 batches short)
    multiprocess_worker.py portable LAYOUT PHASE OUT_DIR     (LAYOUT: sharded, nodes, one_node;
        PHASE: save, plain, finalized, resumed; see test_multiprocess.py)
    multiprocess_worker.py apply_step VALUE OUT_DIR     (VALUE: arrival, or a step k)
    multiprocess_worker.py arrival_finalize OUT_DIR
    multiprocess_worker.py elastic STEPS OUT_DIR     (CO2_ELASTIC_MIN_RANKS from co2run --elastic;
        the rank ELASTIC_DIE_RANK kills itself at step ELASTIC_DIE_AT, the rank ELASTIC_LEAVE_RANK
        calls trainer.leave() at step ELASTIC_LEAVE_AT and stops at co2.LeftError; ELASTIC_UNTIL_SIZE: train on
        until the group has that size)
"""
import json
import os
import sys
import time

import numpy as np
import torch

import co2
import co2.torch
import digits
from test_torch import tiny_model, train_steps

TOTAL_STEPS, CUT = 17, 7          # tau 3: step 7 is mid-round
# A misused collective fails within this instead of the default 300 s.
MISUSE_TIMEOUT_MS = 20000


def train(algorithm, out, apply_step=None):
    comm = co2.Communicator.from_env()
    # apply_step: at tau 6, where a step k = 2 falls inside the round (digits' co2 tau is 2)
    config = {} if apply_step is None else \
        {"tau": 6, "apply_step": apply_step if apply_step == "arrival" else int(apply_step)}
    result = digits.train_co2(algorithm, comm, digits.load_digits(), seed=0, **config)
    np.save(os.path.join(out, f"params{comm.rank}.npy"), result.pop("parameters"))
    if comm.rank == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({k: result[k] for k in ("accuracy", "wall_s", "world_size", "steps")}, f)
    comm.close()


def checkpoint(algorithm, phase, out):
    comm = co2.Communicator.from_env()
    rank = comm.rank
    config = {} if algorithm == "sync" else {"tau": 3}
    model = tiny_model(42 if phase == "second" else 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = co2.torch.distribute(model, optimizer, algorithm=algorithm, comm=comm, **config)
    path = os.path.join(out, f"rank{rank}.pt")
    if phase == "first":
        train_steps(model, optimizer, rank, 0, CUT)
        torch.save({"co2": trainer.state_dict(), "next_step": CUT}, path)
    else:
        first = 0
        if phase == "second":
            state = torch.load(path)
            trainer.load_state_dict(state["co2"])
            first = state["next_step"]
        train_steps(model, optimizer, rank, first, TOTAL_STEPS)
        trainer.finalize()
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        np.save(os.path.join(out, f"{phase}{rank}.npy"), flat)
    trainer.close()
    comm.close()


def rank0_saves(out):
    """Writes what each rank's co2.torch raised into error{rank}.txt."""
    comm = co2.Communicator.from_env(timeout_ms=MISUSE_TIMEOUT_MS)
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
    message = ""
    try:
        train_steps(model, optimizer, comm.rank, 0, 2)
        if comm.rank == 0:
            torch.save(trainer.state_dict(), os.path.join(out, "rank0.pt"))
        train_steps(model, optimizer, comm.rank, 2, 8)
        trainer.finalize()
    except co2.Error as exc:
        message = str(exc)
    with open(os.path.join(out, f"error{comm.rank}.txt"), "w") as f:
        f.write(message)
    trainer.close(_warn=False)
    comm.close()


def uneven(mode, out):
    """The last rank has 5 batches fewer. Writes params{rank}.npy and steps (join) or what
    co2.torch raised (nojoin) into result{rank}.json."""
    comm = co2.Communicator.from_env(timeout_ms=MISUSE_TIMEOUT_MS)
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
    batches = 12 - (5 if comm.rank == comm.world_size - 1 else 0)
    result = {}
    try:
        if mode == "join":
            with trainer.join():
                train_steps(model, optimizer, comm.rank, 0, batches)
        else:
            train_steps(model, optimizer, comm.rank, 0, batches)
        trainer.finalize()
        result["steps"] = trainer.stats()["steps"]
        flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
        np.save(os.path.join(out, f"params{comm.rank}.npy"), flat)
    except (co2.Error, co2.torch.UnequalStepsError) as exc:
        result["error"] = str(exc)
    with open(os.path.join(out, f"result{comm.rank}.json"), "w") as f:
        json.dump(result, f)
    trainer.close(_warn=False)
    comm.close()


# shard_outer_state, or hierarchy "nodes" (the nodes from GROUP_RANK, as co2run sets it).
PORTABLE_LAYOUTS = {"sharded": {"shard_outer_state": True},
                    "nodes": {"hierarchy": "nodes"}, "one_node": {"hierarchy": "nodes"}}


def portable(layout, phase, out):
    """tau 3, 13 steps, the cut at step 7 (mid-round, an average in flight). save: rank 0 alone
    evaluates with consensus_weights(), every rank reads engine.consensus("anchor") and calls
    save_portable(); plain: no evaluation, no save; finalized: finalize() at the cut;
    resumed: a fresh model from the portable file. Writes {phase}{rank}.npy (the parameters at
    the end), cut{rank}.npy (finalized: what finalize() gave at the cut), anchor{rank}.npy and,
    rank 0, seen.npy (save: the anchor read, and what consensus_weights() showed)."""
    comm = co2.Communicator.from_env(timeout_ms=MISUSE_TIMEOUT_MS)
    rank = comm.rank
    model = tiny_model(7 if phase == "resumed" else 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3,
                                   **PORTABLE_LAYOUTS[layout])
    path = os.path.join(out, "portable.pt")

    def flat():
        return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()
    if phase == "resumed":
        trainer.load_portable(path)
    else:
        train_steps(model, optimizer, rank, 0, CUT)
    if phase == "save":
        if rank == 0:
            with trainer.consensus_weights():
                np.save(os.path.join(out, "seen.npy"), flat())
        anchor = trainer.engine.consensus("anchor")
        np.save(os.path.join(out, f"anchor{rank}.npy"), anchor[:flat().size])
        trainer.save_portable(path)
    elif phase == "finalized":
        trainer.finalize()
        np.save(os.path.join(out, f"cut{rank}.npy"), flat())
    train_steps(model, optimizer, rank, CUT, TOTAL_STEPS)
    trainer.finalize()
    np.save(os.path.join(out, f"{phase}{rank}.npy"), flat())
    trainer.close()
    comm.close()


# tau 6: the anchor read 27 steps in, after four averages, the last one's round 3 steps in;
# finalize() at the boundary of step 48 (arrival_finalize: mid-round). "arrival" applies at the
# boundary until the ranks agreed on measured step and all-reduce times (a few rounds).
APPLY_TAU, APPLY_READ, APPLY_STEPS = 6, 45, 48
# Each step lasts at least this: a loopback all-reduce of the tiny model arrives within a few
# steps, so "arrival" applies averages between boundaries (a busy machine may delay some).
APPLY_STEP_S = 0.005


def apply_step(value, out):
    """co2, eager, apply_step "arrival" or k. Writes anchor{rank}.npy (the anchor 3 steps into
    the eighth round), stats{rank}.json (the engine's statistics then) and params{rank}.npy (the
    parameters after finalize())."""
    comm = co2.Communicator.from_env(timeout_ms=MISUSE_TIMEOUT_MS)
    rank = comm.rank
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=APPLY_TAU, eager=True,
                                   apply_step=value if value == "arrival" else int(value))
    for step in range(APPLY_STEPS):
        if step == APPLY_READ:
            np.save(os.path.join(out, f"anchor{rank}.npy"), trainer.engine.consensus("anchor"))
            with open(os.path.join(out, f"stats{rank}.json"), "w") as f:
                json.dump(trainer.stats(), f)
        started = time.perf_counter()
        train_steps(model, optimizer, rank, step, step + 1)
        time.sleep(max(0.0, APPLY_STEP_S - (time.perf_counter() - started)))
    trainer.finalize()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    np.save(os.path.join(out, f"params{rank}.npy"), flat)
    trainer.close()
    comm.close()


def arrival_finalize(out):
    """apply_step "arrival", tau 6: finalize() one step after the boundary at step 24, rank 0
    having seen that boundary's average arrive at that step and rank 1 not (rank 0 reaches the
    boundary 0.3 s late, and takes the next step 0.3 s after it; a 16 MB parameter that trains
    nothing makes the all-reduce last longer than rank 1's next step). Writes result{rank}.json:
    the error, or params (after finalize())."""
    comm = co2.Communicator.from_env(timeout_ms=MISUSE_TIMEOUT_MS)
    rank = comm.rank
    model = tiny_model(0)
    model.register_parameter("ballast", torch.nn.Parameter(torch.zeros(4_000_000)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=APPLY_TAU, eager=True,
                                   apply_step="arrival")
    result = {}
    try:
        for step in range(4 * APPLY_TAU + 1):
            if rank == 0 and step >= 4 * APPLY_TAU - 1:
                time.sleep(0.3)
            train_steps(model, optimizer, rank, step, step + 1)
        trainer.finalize()
        result["params"] = torch.cat([p.detach().flatten() for name, p in
                                      model.named_parameters() if name != "ballast"]).tolist()
    except co2.Error as exc:
        result["error"] = str(exc)
    with open(os.path.join(out, f"result{rank}.json"), "w") as f:
        json.dump(result, f)
    trainer.close(_warn=False)
    comm.close()


def optimizer_buffers(optimizer):
    """The SGD momentum buffers, flattened, in parameter order."""
    state = optimizer.state_dict()["state"]
    return np.concatenate([state[i]["momentum_buffer"].flatten().numpy() for i in sorted(state)])


def elastic(steps, out):
    """A co2.torch loop that survives a lost rank: it catches co2.MembershipChangedError, re-reads
    its rank and world size and trains on to the agreed step count (and, with ELASTIC_UNTIL_SIZE,
    until the group has that size again: a restarted rank joined). A process that joined a running
    group is named "joiner<rank>"; it saves the optimizer state it received, and rank 0 the one it
    had when the joiner was admitted."""
    comm = co2.Communicator.from_env()
    first_rank = comm.rank
    model = tiny_model(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    trainer = co2.torch.distribute(model, optimizer, comm=comm, tau=3)
    joined = trainer.engine.stats()["steps"] > 0
    name = f"joiner{comm.rank}" if joined else str(first_rank)
    if joined:
        np.save(os.path.join(out, "welcome_received.npy"), optimizer_buffers(optimizer))
    die_at = int(os.environ["ELASTIC_DIE_AT"]) if os.environ.get("ELASTIC_DIE_RANK") == name else -1
    leave_at = int(os.environ["ELASTIC_LEAVE_AT"]) if os.environ.get("ELASTIC_LEAVE_RANK") == name else -1
    until_size = int(os.environ.get("ELASTIC_UNTIL_SIZE", "0"))
    changes = 0
    left = False
    while True:
        done = trainer.engine.stats()["steps"]
        if done == die_at:
            os.kill(os.getpid(), 9)
        if done == leave_at:
            trainer.leave()
        try:
            if done < int(steps) or comm.world_size < until_size:
                train_steps(model, optimizer, comm.rank, done, done + 1)
                continue
            trainer.finalize()
            break
        except co2.MembershipChangedError:
            changes += 1
            if comm.rank == 0 and comm.world_size == until_size:
                np.save(os.path.join(out, "welcome_sent.npy"), optimizer_buffers(optimizer))
            if changes == 1:
                np.save(os.path.join(out, f"changed{name}.npy"),
                        torch.cat([p.detach().flatten() for p in model.parameters()]).numpy())
        except co2.LeftError:
            left = True  # trainer.leave() was granted: the module holds the group's model
            break
    flat = torch.cat([p.detach().flatten() for p in model.parameters()]).numpy()
    np.save(os.path.join(out, f"elastic{name}.npy"), flat)
    with open(os.path.join(out, f"elastic{name}.json"), "w") as f:
        record = {"rank": comm.rank, "world_size": comm.world_size, "changes": changes,
                  "steps": trainer.engine.stats()["steps"]}
        if left:
            record["left"] = True
        json.dump(record, f)
    trainer.close()
    comm.close()


def main(argv):
    torch.set_num_threads(1)
    if argv[0] == "train":
        train(*argv[1:])
    elif argv[0] == "uneven":
        uneven(argv[1], argv[2])
    elif argv[0] == "rank0_saves":
        rank0_saves(argv[1])
    elif argv[0] == "portable":
        portable(argv[1], argv[2], argv[3])
    elif argv[0] == "apply_step":
        apply_step(argv[1], argv[2])
    elif argv[0] == "arrival_finalize":
        arrival_finalize(argv[1])
    elif argv[0] == "elastic":
        elastic(argv[1], argv[2])
    elif argv[0] == "checkpoint":
        checkpoint(argv[1], argv[2], argv[3])
    else:
        raise SystemExit(f"unknown mode {argv[0]!r}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""co2.torch with real processes on loopback: one rank per process, launched the way co2run and
torchrun launch them (RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT), transport AUTO (UCX over
TCP on lo). Needs the multi-process transport in libco2 (the UCX transport and the TCP store
wired into co2_comm_create); skipped, with that reason, in a build without it."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from ports import free_port  # tests/ports.py (conftest.py puts tests/ on the path)

import co2
import co2.torch
import torch
from test_torch import ACCURACY_THRESHOLD, tiny_model

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "multiprocess_worker.py")
# A run that takes longer than this has hung; the processes are killed and the test fails.
PROCESS_TIMEOUT_S = 300


def multiprocess_unavailable():
    """A reason to skip, or None. A build without UCX refuses the transport as unsupported; a
    build with it asks for the launcher's environment, which this test process does not have."""
    try:
        with co2.Communicator(0, 1, transport="ucx"):
            return None
    except co2.UnsupportedError as exc:
        return f"this libco2 has no multi-process transport: {exc.detail}"
    except co2.InvalidArgumentError:
        return None


pytestmark = pytest.mark.skipif(multiprocess_unavailable() is not None,
                                reason=str(multiprocess_unavailable()))


def launch_env(rank=None, world=None, port=None):
    env = dict(os.environ)
    env.update({"MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1",
                "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo"})
    if port is not None:
        env["MASTER_PORT"] = str(port)
    if rank is not None:
        env.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(world)})
    return env


def wait_all(processes, what):
    outputs = []
    try:
        for p in processes:
            out, _ = p.communicate(timeout=PROCESS_TIMEOUT_S)
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in processes:
            p.kill()
        pytest.fail(f"{what}: a rank did not finish within {PROCESS_TIMEOUT_S} s")
    for rank, (p, out) in enumerate(zip(processes, outputs)):
        assert p.returncode == 0, f"{what}: rank {rank} exited with {p.returncode}:\n{out}"
    return outputs


def run_world(world, args, what):
    """One process per rank with the launcher's environment (what co2run does)."""
    port = free_port()
    processes = [subprocess.Popen([sys.executable, WORKER, *args], env=launch_env(r, world, port),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world)]
    wait_all(processes, what)


def run_torchrun(world, args, what):
    """The same under torchrun: its agent holds MASTER_PORT, the group id goes through its
    store (co2.Communicator.from_env)."""
    torchrun = shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun is not installed (python3-torch)")
    # --redirects 1 --tee 1: Debian 12's torchrun (torch 1.13 on Python 3.11) fails in its
    # defaults ("0" parses to None because 3.11 no longer iterates IntFlag's zero member).
    p = subprocess.Popen([torchrun, "--redirects", "1", "--tee", "1",
                          "--nnodes", "1", "--nproc_per_node", str(world),
                          "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                          WORKER, *args], env=launch_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    wait_all([p], what)


def check_training(out, world):
    with open(os.path.join(out, "result.json")) as f:
        result = json.load(f)
    assert result["world_size"] == world
    params = [np.load(os.path.join(out, f"params{r}.npy")) for r in range(world)]
    for p in params[1:]:
        np.testing.assert_array_equal(p, params[0])       # one model on every rank
    assert result["accuracy"] >= ACCURACY_THRESHOLD, result


@pytest.mark.parametrize("algorithm", ["sync", "co2"])
def test_digits_converges_with_4_processes(algorithm, tmp_path):
    run_world(4, ["train", algorithm, str(tmp_path)], f"digits {algorithm}")
    check_training(str(tmp_path), 4)


@pytest.mark.parametrize("apply_step", ["arrival", "2"])
def test_digits_converges_with_apply_step(apply_step, tmp_path):
    """co2 applying its averages between boundaries (tau 6) trains as well."""
    run_world(2, ["train", "co2", str(tmp_path), apply_step], f"digits apply_step={apply_step}")
    check_training(str(tmp_path), 2)


def test_digits_under_torchrun(tmp_path):
    run_torchrun(2, ["train", "co2", str(tmp_path)], "digits co2 under torchrun")
    check_training(str(tmp_path), 2)


@pytest.mark.parametrize("algorithm", ["co2", "sync"])
def test_checkpoint_restart_of_the_processes(algorithm, tmp_path):
    """Save mid-round, end the processes, start new ones from other weights, load, continue:
    the same parameters as a run without the break (per-rank optimizer state and the data
    position are in the checkpoint)."""
    world = 3
    run_world(world, ["checkpoint", algorithm, "full", str(tmp_path)], "uninterrupted")
    run_world(world, ["checkpoint", algorithm, "first", str(tmp_path)], "before the restart")
    run_world(world, ["checkpoint", algorithm, "second", str(tmp_path)], "after the restart")
    for rank in range(world):
        want = np.load(tmp_path / f"full{rank}.npy")
        got = np.load(tmp_path / f"second{rank}.npy")
        np.testing.assert_array_equal(got, want, err_msg=f"rank {rank}")


def test_state_dict_on_rank_0_only_says_it_is_collective(tmp_path):
    """The DDP habit `if rank == 0: torch.save(trainer.state_dict())`: every rank fails with
    the reason instead of a bare CollectiveMismatchError or a timeout."""
    world = 2
    run_world(world, ["rank0_saves", str(tmp_path)], "state_dict on rank 0 only")
    for rank in range(world):
        message = (tmp_path / f"error{rank}.txt").read_text()
        assert "state_dict() is collective: call it on every rank" in message, \
            f"rank {rank}: {message!r}"


def test_uneven_batches_with_and_without_join(tmp_path):
    """One process 5 batches short: inside trainer.join() both finish with one model; without
    it both fail with the cause instead of a bare mismatch or a hang."""
    world = 2
    (tmp_path / "join").mkdir()
    (tmp_path / "nojoin").mkdir()
    run_world(world, ["uneven", "join", str(tmp_path / "join")], "uneven batches, join")
    results = [json.loads((tmp_path / "join" / f"result{r}.json").read_text())
               for r in range(world)]
    assert all("error" not in r for r in results), results
    assert results[0]["steps"] == results[1]["steps"] >= 12
    np.testing.assert_array_equal(np.load(tmp_path / "join" / "params0.npy"),
                                  np.load(tmp_path / "join" / "params1.npy"))
    run_world(world, ["uneven", "nojoin", str(tmp_path / "nojoin")], "uneven batches")
    for rank in range(world):
        error = json.loads((tmp_path / "nojoin" / f"result{rank}.json").read_text()).get("error")
        assert error and "unequal step counts" in error and "trainer.join()" in error, \
            f"rank {rank}: {error!r}"


SPLIT_NODES_RANK = """
import os
import numpy as np
import co2
rank, node, local = (int(os.environ[v]) for v in ("RANK", "GROUP_RANK", "LOCAL_RANK"))
with co2.Communicator.from_env(timeout_ms=60000) as world:
    intra, inter = world.split_nodes()
    with intra, inter:
        assert (intra.rank, intra.world_size, inter.rank, inter.world_size) == (local, 2, node, 2)
        assert intra.allreduce(np.array([rank], np.int64))[0] == (1 if node == 0 else 5)
        assert inter.allreduce(np.array([rank], np.int64))[0] == (2 if local == 0 else 4)
print("split_nodes ok")
"""


def test_split_nodes_under_co2run_simulated_nodes():
    """co2run --nnodes 2 --nproc-per-node 2: the nodes come from co2run's GROUP_RANK."""
    co2run = os.environ.get("CO2RUN")
    if not co2run:
        pytest.skip("CO2RUN (the co2run of this build) is not set: run through meson test")
    p = subprocess.Popen([co2run, "--nnodes", "2", "--nproc-per-node", "2", sys.executable, "-c",
                          SPLIT_NODES_RANK], env=launch_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=PROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        p.kill()
        pytest.fail(f"co2run did not finish within {PROCESS_TIMEOUT_S} s")
    assert p.returncode == 0, out
    assert out.count("split_nodes ok") == 4, out


# (world, ranks per node) of each layout; the nodes come from GROUP_RANK, as co2run sets it.
PORTABLE_WORLDS = {"sharded": (2, 2), "nodes": (4, 2), "one_node": (2, 2)}


def run_portable(layout, phase, out):
    world, per_node = PORTABLE_WORLDS[layout]
    port = free_port()
    processes = []
    for r in range(world):
        env = launch_env(r, world, port)
        env.update({"GROUP_RANK": str(r // per_node), "LOCAL_RANK": str(r % per_node),
                    "LOCAL_WORLD_SIZE": str(per_node)})
        processes.append(subprocess.Popen([sys.executable, WORKER, "portable", layout, phase, out],
                                          env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    return wait_all(processes, f"{layout}: {phase}")


@pytest.mark.parametrize("layout", ["sharded", "nodes"])
def test_portable_checkpoint_and_consensus_under_sharding_and_hierarchy(layout, tmp_path):
    """Issue 23 (5, 14, 15), shard_outer_state=True and hierarchy="nodes" (2 nodes x 2): rank 0
    alone evaluates with consensus_weights() mid-round and every rank calls save_portable()
    (before: COLLECTIVE_MISMATCH at the next round, or a hang); the run goes on exactly as one
    that did neither; the portable model is the one finalize() gives at that step, and a run
    resumed from it continues as one that finalized there (before: the engine state of the
    middle of a round under the model of its end). test_torch_habits.py checks the replicated
    engine's portable model, which lagged by the average in flight."""
    out = str(tmp_path)
    for phase in ("save", "plain", "finalized", "resumed"):
        run_portable(layout, phase, out)
    world = PORTABLE_WORLDS[layout][0]

    def result(name):
        return np.load(os.path.join(out, name))
    for r in range(world):
        np.testing.assert_array_equal(result(f"anchor{r}.npy"), result("seen.npy"),
                                      err_msg=f"rank {r}'s anchor differs from what rank 0 saw")
        np.testing.assert_array_equal(result(f"save{r}.npy"), result(f"plain{r}.npy"),
                                      err_msg=f"rank {r}: evaluating and saving changed the run")
        np.testing.assert_array_equal(result(f"resumed{r}.npy"), result(f"finalized{r}.npy"),
                                      err_msg=f"rank {r}: the resumed run differs")
    saved = co2.torch.load_portable(os.path.join(out, "portable.pt"))
    plain = tiny_model(7)
    plain.load_state_dict(saved["model"])
    portable = torch.cat([p.detach().flatten() for p in plain.parameters()]).numpy()
    np.testing.assert_array_equal(portable, result("cut0.npy"),
                                  err_msg="the portable model is not what finalize() gives")


def test_hierarchy_over_one_node_saves_and_says_it_runs_as_sync(tmp_path):
    """hierarchy="nodes" with both ranks on one node: save_portable() on every rank completes
    (before: a hang until the communicator's timeout), and the engine says that one node makes
    the run sync."""
    outputs = run_portable("one_node", "save", str(tmp_path))
    for rank, output in enumerate(outputs):
        assert "one node" in output and "sync" in output, f"rank {rank}: {output}"


@pytest.mark.parametrize("value", ["arrival", "2"])
def test_apply_step_applies_averages_between_boundaries_with_one_anchor(value, tmp_path):
    """apply_step="arrival" (the step from the ranks' agreed timings over the real transport)
    and apply_step=2 at tau 6: averages are applied between boundaries, and the anchors are
    bitwise equal on every rank mid-round and the models after finalize() (at a boundary;
    mid-round: test_finalize_mid_round_under_arrival)."""
    world = 2
    run_world(world, ["apply_step", value, str(tmp_path)], f"apply_step={value}")
    stats = [json.loads((tmp_path / f"stats{r}.json").read_text()) for r in range(world)]
    anchors = [np.load(tmp_path / f"anchor{r}.npy") for r in range(world)]
    params = [np.load(tmp_path / f"params{r}.npy") for r in range(world)]
    for r in range(world):
        assert stats[r]["rounds"] == 7 and stats[r]["arrival_updates"] > 0, stats[r]
        if value == "arrival":
            assert 1 <= stats[r]["last_apply_step"] < 6, stats[r]
        else:
            # boundaries at steps 6, 12, ..., 42; each average applied 2 steps later
            assert stats[r]["arrival_updates"] == 7 and stats[r]["last_apply_step"] == 2, \
                stats[r]
        assert stats[r]["arrival_updates"] == stats[0]["arrival_updates"]
        assert stats[r]["last_apply_step"] == stats[0]["last_apply_step"]
        np.testing.assert_array_equal(anchors[r], anchors[0], err_msg=f"rank {r}'s anchor")
        np.testing.assert_array_equal(params[r], params[0], err_msg=f"rank {r}'s model")
        assert np.all(np.isfinite(params[r]))
    assert not np.array_equal(params[0], tiny_model_flat(0)), "nothing was trained"


def tiny_model_flat(seed):
    return torch.cat([p.detach().flatten() for p in tiny_model(seed).parameters()]).numpy()


def test_finalize_mid_round_under_arrival(tmp_path):
    """apply_step="arrival": finalize() one step after a boundary whose average has arrived on
    one rank and not on the other: both finish with one model. (An exchange of the ranks' arrival
    steps, as the engine first had, met co2.torch's own control collective before finalize() in
    different orders: CollectiveMismatchError. The step now comes from the agreed timings and
    issues no collective.)"""
    world = 2
    run_world(world, ["arrival_finalize", str(tmp_path)], "finalize mid-round under arrival")
    results = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(world)]
    assert all("error" not in r for r in results), [r.get("error") for r in results]
    assert results[0]["params"] == results[1]["params"]


def test_a_lost_rank_under_co2run_elastic(tmp_path):
    """co2run --elastic 2 with 3 co2.torch processes; rank 1 dies mid-run (SIGKILL). The other two
    catch co2.MembershipChangedError once, go on as ranks 0 and 1 of 2, reach the planned step
    count and end with the same parameters; co2run exits 0."""
    co2run = os.environ.get("CO2RUN")
    if not co2run:
        pytest.skip("CO2RUN is not set (meson sets it)")
    env = launch_env()
    env.update(ELASTIC_DIE_RANK="1", ELASTIC_DIE_AT="10", CO2_TIMEOUT_MS="5000")
    run = subprocess.run([co2run, "--nproc-per-node", "3", "--elastic", "2", sys.executable, WORKER,
                          "elastic", "30", str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=PROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    assert not (tmp_path / "elastic1.json").exists()
    results = {r: json.loads((tmp_path / f"elastic{r}.json").read_text()) for r in (0, 2)}
    assert results[0] == {"rank": 0, "world_size": 2, "changes": 1, "steps": 30}, results
    assert results[2] == {"rank": 1, "world_size": 2, "changes": 1, "steps": 30}, results
    np.testing.assert_array_equal(np.load(tmp_path / "elastic0.npy"), np.load(tmp_path / "elastic2.npy"))


def test_a_rank_that_calls_leave_is_let_go_and_the_others_train_on(tmp_path):
    """co2run --elastic 2 with 3 co2.torch processes; rank 1 calls trainer.leave() at step 10 and
    trains on until its step raises co2.LeftError. Its module then holds the model the others
    hold right after their step raised co2.MembershipChangedError (bitwise); the two train on as 2
    to the same end; co2run exits 0."""
    co2run = os.environ.get("CO2RUN")
    if not co2run:
        pytest.skip("CO2RUN is not set (meson sets it)")
    env = launch_env()
    env.update(ELASTIC_LEAVE_RANK="1", ELASTIC_LEAVE_AT="10", CO2_TIMEOUT_MS="5000")
    run = subprocess.run([co2run, "--nproc-per-node", "3", "--elastic", "2",
                          sys.executable, WORKER, "elastic", "30", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {name: json.loads((tmp_path / f"elastic{name}.json").read_text()) for name in ("0", "1", "2")}
    assert results["1"].get("left") and results["1"]["world_size"] == 3, results
    assert "left" not in results["0"] and "left" not in results["2"], results
    assert 10 < results["1"]["steps"] <= 10 + 2 * 3, results
    members = ("0", "2")
    assert [results[m]["world_size"] for m in members] == [2, 2], results
    assert [results[m]["changes"] for m in members] == [1, 1], results
    left_with = np.load(tmp_path / "elastic1.npy")
    for m in members:
        np.testing.assert_array_equal(np.load(tmp_path / f"changed{m}.npy"), left_with)
    np.testing.assert_array_equal(np.load(tmp_path / "elastic0.npy"), np.load(tmp_path / "elastic2.npy"))


def test_a_restarted_rank_joins_with_rank_0s_optimizer_state(tmp_path):
    """co2run --elastic 2 --max-restarts 1 with 3 co2.torch processes; rank 1 dies at step 10 and
    co2run starts it again: it joins the running group of 2 as rank 2. Its optimizer (SGD with
    momentum) receives rank 0's momentum buffers, bitwise; everyone trains on as 3 to the same
    step count and ends with the same parameters; co2run exits 0."""
    co2run = os.environ.get("CO2RUN")
    if not co2run:
        pytest.skip("CO2RUN is not set (meson sets it)")
    env = launch_env()
    env.update(ELASTIC_DIE_RANK="1", ELASTIC_DIE_AT="10", ELASTIC_UNTIL_SIZE="3", CO2_TIMEOUT_MS="5000")
    run = subprocess.run([co2run, "--nproc-per-node", "3", "--elastic", "2", "--max-restarts", "1",
                          sys.executable, WORKER, "elastic", "30", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {name: json.loads((tmp_path / f"elastic{name}.json").read_text()) for name in ("0", "2", "joiner2")}
    assert {r["world_size"] for r in results.values()} == {3}, results
    assert sorted(r["rank"] for r in results.values()) == [0, 1, 2], results
    assert results["joiner2"]["rank"] == 2, results
    assert len({r["steps"] for r in results.values()}) == 1 and results["0"]["steps"] >= 30, results
    assert results["0"]["changes"] == results["2"]["changes"] == 2 and results["joiner2"]["changes"] == 0, results
    sent, received = np.load(tmp_path / "welcome_sent.npy"), np.load(tmp_path / "welcome_received.npy")
    assert np.any(sent != 0), "rank 0's momentum buffers were still zero: nothing to compare"
    np.testing.assert_array_equal(received, sent)
    final = {name: np.load(tmp_path / f"elastic{name}.npy") for name in results}
    np.testing.assert_array_equal(final["0"], final["2"])
    np.testing.assert_array_equal(final["0"], final["joiner2"])

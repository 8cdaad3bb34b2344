"""Hierarchical co2 from PyTorch (examples/python/hierarchical/train.py) as real processes:
co2run --nnodes 2 --nproc-per-node 2, the intra-node average by co2 or by torch DDP on a node
group; and nobody averaging inside the node fails loudly on every rank, naming the cause."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "..", "examples", "python", "hierarchical", "train.py")
# A co2run job that takes longer than this has hung; co2run and its ranks are killed.
PROCESS_TIMEOUT_S = 240


def run(intra, *extra):
    return subprocess.run(
        [os.environ["CO2RUN"], "--nnodes", "2", "--nproc-per-node", "2", sys.executable, "-u", EXAMPLE,
         "--intra", intra, *extra],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)


@pytest.mark.parametrize("intra", ["co2", "ddp"])
def test_two_nodes_of_two_train_one_model(intra):
    done = run(intra, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "outer updates" in line]
    assert len(lines) == 4, done.stdout
    assert all("20 outer updates" in line for line in lines), done.stdout


def test_ranks_of_a_node_that_do_not_average_fail_naming_the_cause():
    done = run("none")
    assert done.returncode != 0, done.stdout
    assert "averaged inside the node" in done.stdout + done.stderr, done.stdout + done.stderr

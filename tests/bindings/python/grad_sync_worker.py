"""One rank of test_grad_sync.py's multi-process test, started by co2run: runs the checks of
grad_sync_checks.py named on the command line over the launcher's communicator (UCX)."""
import sys

import torch

import co2
import grad_sync_checks


def main(names):
    torch.set_num_threads(1)
    with co2.Communicator.from_env() as comm:
        for name in names:
            grad_sync_checks.CHECKS[name](comm)
            print(f"rank {comm.rank}: {name} ok", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

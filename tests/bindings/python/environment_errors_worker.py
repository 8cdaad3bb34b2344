"""One rank of test_environment_errors.py: forms co2.Communicator() from the launcher's
environment, all-reduces a one, and prints one JSON line: {"rank", "sum"} on success, {"error":
the co2 exception class, "message"} on failure (exit status 1)."""
import json
import sys

import numpy as np

import co2

try:
    with co2.Communicator() as comm:
        total = comm.allreduce(np.ones(1, np.float32))
        print(json.dumps({"rank": comm.rank, "sum": float(total[0])}), flush=True)
except co2.Error as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    sys.exit(1)

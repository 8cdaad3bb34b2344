"""co2: communication-efficient data-parallel training (CO2, sync, localsgd, diloco).

    import co2
    with co2.Communicator() as comm, co2.Engine(comm, algorithm="co2", tau=12) as engine:
        engine.register("w", w)            # a float32 numpy array or torch tensor
        engine.commit()                    # every rank starts from rank 0's w
        for batch in data:
            ...                            # your optimizer step on w
            engine.step()                  # every tau-th call: the outer update
        engine.finalize()

PyTorch: co2.torch.distribute(model, optimizer, ...). Every failing call raises a co2.Error
subclass carrying the library's message. See bindings/python/README.md.

The package is typed (py.typed; capi.pyi for the generated co2.capi): EngineOptions types the
engine keywords of Engine() and co2.torch.distribute(), EngineStats what Engine.stats() returns.
"""
try:
    import numpy  # noqa: F401 - the SWIG module needs it before anything else
except ImportError as missing:
    import sys
    raise ImportError(f"co2 needs numpy, which {sys.executable} cannot import ({missing}): "
                      f"run the Python co2 was built for (Debian's /usr/bin/python3), or install "
                      f"numpy for this one (apt-get install python3-numpy)") from missing

from . import capi
from ._errors import (Error, InvalidArgumentError, InvalidStateError, UnsupportedError,
                      InvalidConfigError, UnknownEnumError, DuplicateTensorError,
                      OutOfMemoryError, NonFiniteError, LayoutMismatchError,
                      AnchorMismatchError, CheckpointCorruptError, CheckpointMismatchError,
                      CallbackError, TimeoutError, MembershipChangedError, LeftError, PeerError,
                      PeerLostError, PeerTimeoutError,
                      CollectiveMismatchError, AbortedError, TransportError, RendezvousError,
                      InternalError)
from .communicator import Communicator, Request, unique_id, comm_defaults
from .engine import Engine, EngineOptions, EngineStats, engine_defaults
from ._launch import rank_and_world

__version__ = "{}.{}.{}".format(*capi.get_version())

__all__ = ["Communicator", "Engine", "Request", "unique_id", "comm_defaults", "engine_defaults",
           "EngineOptions", "EngineStats",
           "rank_and_world", "Error", "InvalidArgumentError", "InvalidStateError",
           "UnsupportedError", "InvalidConfigError", "UnknownEnumError", "DuplicateTensorError",
           "OutOfMemoryError", "NonFiniteError", "LayoutMismatchError", "AnchorMismatchError",
           "CheckpointCorruptError", "CheckpointMismatchError", "CallbackError", "TimeoutError",
           "MembershipChangedError", "LeftError", "PeerError", "PeerLostError", "PeerTimeoutError",
           "CollectiveMismatchError",
           "AbortedError", "TransportError", "RendezvousError", "InternalError"]

"""Exceptions: one class per co2 status, installed as the SWIG module's error factory.

Every failing C call raises an instance of the class for its status, carrying the status, the C
function that failed and co2_last_error_message() (the library's own explanation). Classes also
derive from the matching builtin (ValueError, TimeoutError, ...) so ordinary handlers work.
"""
from __future__ import annotations

import builtins
from typing import Optional

from . import capi


class Error(RuntimeError):
    """A co2 call failed. `status` is the co2_status_t, `function` the C function, `detail` the
    library's message (co2_last_error_message()), `status_string` what the status means."""

    status: Optional[int] = None

    def __init__(self, message: str, status: Optional[int] = None, function: Optional[str] = None,
                 status_string: Optional[str] = None, detail: Optional[str] = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.function = function
        self.status_string = status_string
        self.detail = detail


class InvalidArgumentError(Error, ValueError):
    status = capi.CO2_ERR_INVALID_ARGUMENT


class InvalidStateError(Error):
    status = capi.CO2_ERR_INVALID_STATE


class UnsupportedError(Error, NotImplementedError):
    status = capi.CO2_ERR_UNSUPPORTED


class InvalidConfigError(Error, ValueError):
    status = capi.CO2_ERR_INVALID_CONFIG


class UnknownEnumError(Error, ValueError):
    status = capi.CO2_ERR_UNKNOWN_ENUM


class DuplicateTensorError(Error, ValueError):
    status = capi.CO2_ERR_DUPLICATE_TENSOR


class OutOfMemoryError(Error, MemoryError):
    status = capi.CO2_ERR_OUT_OF_MEMORY


class NonFiniteError(Error, ArithmeticError):
    """NaN/Inf in a delta or an average: nothing was applied; training may continue."""
    status = capi.CO2_ERR_NONFINITE


class LayoutMismatchError(Error):
    status = capi.CO2_ERR_LAYOUT_MISMATCH


class AnchorMismatchError(Error):
    status = capi.CO2_ERR_ANCHOR_MISMATCH


class CheckpointCorruptError(Error, ValueError):
    status = capi.CO2_ERR_CHECKPOINT_CORRUPT


class CheckpointMismatchError(Error, ValueError):
    status = capi.CO2_ERR_CHECKPOINT_MISMATCH


class CallbackError(Error):
    status = capi.CO2_ERR_CALLBACK


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 - also the builtin
    """A wait with a caller-given timeout expired; the operation is still pending."""
    status = capi.CO2_ERR_TIMEOUT


class MembershipChangedError(Error):
    """An elastic group (elastic_min_ranks >= 1) lost a rank and re-formed without it: the call
    did not complete; every survivor's parameters are the agreed anchor. Re-read rank and
    world_size, re-shard the data and keep training (docs/capi.md, "Elastic membership")."""
    status = capi.CO2_MEMBERSHIP_CHANGED


class LeftError(Error):
    """This rank left its elastic group as it asked (Engine.leave()): its parameters are the
    group's anchor after its last round; the engine takes no more steps (docs/capi.md, "Leaving")."""
    status = capi.CO2_LEFT


class PeerError(Error, ConnectionError):
    """Statuses 100-199: the communicator is unusable; destroy it and its engines."""


class PeerLostError(PeerError):
    status = capi.CO2_ERR_PEER_LOST


class PeerTimeoutError(PeerError):
    status = capi.CO2_ERR_PEER_TIMEOUT


class CollectiveMismatchError(PeerError):
    status = capi.CO2_ERR_COLLECTIVE_MISMATCH


class AbortedError(PeerError):
    status = capi.CO2_ERR_ABORTED


class TransportError(PeerError):
    status = capi.CO2_ERR_TRANSPORT


class RendezvousError(PeerError):
    status = capi.CO2_ERR_RENDEZVOUS


class InternalError(PeerError):
    """A bug in co2: please report it with the message."""
    status = capi.CO2_ERR_INTERNAL


_BY_STATUS: dict[Optional[int], type[Error]] = {cls.status: cls for cls in (
    InvalidArgumentError, InvalidStateError, UnsupportedError, InvalidConfigError,
    UnknownEnumError, DuplicateTensorError, OutOfMemoryError, NonFiniteError,
    LayoutMismatchError, AnchorMismatchError, CheckpointCorruptError, CheckpointMismatchError,
    CallbackError, TimeoutError, MembershipChangedError, LeftError, PeerLostError, PeerTimeoutError,
    CollectiveMismatchError, AbortedError, TransportError, RendezvousError, InternalError)}


def _make_error(status: int, function: str, status_string: str, detail: str) -> Error:
    cls: type[Error]
    if status in _BY_STATUS:
        cls = _BY_STATUS[status]
    elif 100 <= status <= 199:
        cls = PeerError
    else:
        cls = Error
    message = f"{function}: {detail}" if detail else f"{function}: {status_string}"
    message += f" [status {status}: {status_string}]"
    return cls(message, status, function, status_string, detail)


capi._set_error_factory(_make_error)

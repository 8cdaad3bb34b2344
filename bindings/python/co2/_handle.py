"""What every handle-owning class shares: close() on leaving a with-block and on collection."""
from __future__ import annotations

from typing import Any, TypeVar

_Self = TypeVar("_Self", bound="OwnsHandle")


class OwnsHandle:
    """Mixin for a class with a `_handle` attribute and a close() that releases it."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing may escape a finaliser
                pass

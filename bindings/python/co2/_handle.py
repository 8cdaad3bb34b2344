"""What every handle-owning class shares: close() on leaving a with-block and on collection."""


class OwnsHandle:
    """Mixin for a class with a `_handle` attribute and a close() that releases it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - nothing may escape a finaliser
                pass

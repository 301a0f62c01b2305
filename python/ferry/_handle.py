"""ferry._handle: the lifetime of an object that owns a libferry handle (context manager, close
on garbage collection, a clear error once closed). Subclasses set `_handle` and `_closed_what`
and implement close()."""

from . import errors


class OwnedHandle:
    _handle = None
    _closed_what = "the object"  # named in the error raised after close()

    def close(self):  # pragma: no cover - every subclass overrides it
        raise NotImplementedError

    def _require_open(self):
        if not self._handle:
            raise errors.FailedPreconditionError(errors.FAILED_PRECONDITION,
                                                 f"{self._closed_what} is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass

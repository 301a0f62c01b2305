"""ferry.errors: Python exceptions for the C API's error objects (code + message)."""

import builtins

# Status codes of ferry/plugin.h (ferry_status_code_t).
OK = 0
INVALID_ARGUMENT = 1
UNIMPLEMENTED = 2
INCOMPATIBLE = 3
NOT_FOUND = 4
IO = 5
CORRUPT_DATA = 6
TIMEOUT = 7
PEER_FAILED = 8
ABORTED = 9
OUT_OF_MEMORY = 10
FAILED_PRECONDITION = 11
INTERNAL = 12
END_OF_STREAM = 13

STATUS_NAMES = {
    OK: "OK",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    UNIMPLEMENTED: "UNIMPLEMENTED",
    INCOMPATIBLE: "INCOMPATIBLE",
    NOT_FOUND: "NOT_FOUND",
    IO: "IO",
    CORRUPT_DATA: "CORRUPT_DATA",
    TIMEOUT: "TIMEOUT",
    PEER_FAILED: "PEER_FAILED",
    ABORTED: "ABORTED",
    OUT_OF_MEMORY: "OUT_OF_MEMORY",
    FAILED_PRECONDITION: "FAILED_PRECONDITION",
    INTERNAL: "INTERNAL",
    END_OF_STREAM: "END_OF_STREAM",
}


class Error(Exception):
    """A ferry error: `code` (the C ferry_status_code_t), `status` (its name), `message`."""

    def __init__(self, code, message):
        self.code = int(code)
        self.status = STATUS_NAMES.get(self.code, "UNKNOWN")
        self.message = message
        super().__init__(f"{self.status}: {message}")


class InvalidArgumentError(Error, ValueError):
    pass


class UnimplementedError(Error, NotImplementedError):
    pass


class IncompatibleError(Error):
    pass


class NotFoundError(Error, LookupError):
    pass


class IoError(Error):
    pass


class CorruptDataError(Error):
    pass


class TimeoutError(Error, builtins.TimeoutError):  # noqa: A001 (ferry.TimeoutError on purpose)
    pass


class PeerFailedError(Error):
    pass


class AbortedError(Error):
    pass


class OutOfMemoryError(Error, MemoryError):
    pass


class FailedPreconditionError(Error):
    pass


class InternalError(Error):
    pass


class PushError(PeerFailedError):
    """Raised by Sender.push(check=True) when a receiver did not commit; `report` says which."""

    def __init__(self, report):
        failed = [r for r in report.receivers if not r.committed]
        lines = "; ".join(f"{r.address}: {r.error}" for r in failed)
        super().__init__(PEER_FAILED,
                         f"{len(failed)} of {len(report.receivers)} receivers did not commit "
                         f"version {report.version}: {lines}")
        self.report = report


_BY_CODE = {
    INVALID_ARGUMENT: InvalidArgumentError,
    UNIMPLEMENTED: UnimplementedError,
    INCOMPATIBLE: IncompatibleError,
    NOT_FOUND: NotFoundError,
    IO: IoError,
    CORRUPT_DATA: CorruptDataError,
    TIMEOUT: TimeoutError,
    PEER_FAILED: PeerFailedError,
    ABORTED: AbortedError,
    OUT_OF_MEMORY: OutOfMemoryError,
    FAILED_PRECONDITION: FailedPreconditionError,
    INTERNAL: InternalError,
}


def error_for(code, message):
    """The exception for a C status code (Error itself for codes without a subclass)."""
    return _BY_CODE.get(int(code), Error)(code, message)

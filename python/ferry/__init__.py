"""ferry: push model weights from RL trainers into rollout engines.

A thin ctypes binding over libferry.so (ferry/ferry.h): `Sender` pushes versioned updates of
named tensors (PyTorch, NumPy, anything with __dlpack__, zero-copy) to receivers; `Receiver`
embeds a receiver that writes updates into the engine's own tensors in place.
"""

from . import errors
from ._library import library_path
from .errors import (AbortedError, CorruptDataError, Error, FailedPreconditionError,
                     IncompatibleError, InternalError, InvalidArgumentError, IoError,
                     NotFoundError, OutOfMemoryError, PeerFailedError, PushError, TimeoutError,
                     UnimplementedError)
from .nccl import NcclGroup
from .receiver import Health, Receiver, Version
from .sender import PushReport, ReceiverOutcome, Sender
from .sharding import Block

__version__ = "0.1.0"


def api_version():
    """(major, minor) of the loaded libferry.so's C API."""
    import ctypes

    from ._library import lib
    major, minor = ctypes.c_uint32(), ctypes.c_uint32()
    lib().ferry_api_version(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


__all__ = [
    "AbortedError", "Block", "CorruptDataError", "Error", "FailedPreconditionError", "Health",
    "IncompatibleError", "InternalError", "InvalidArgumentError", "IoError", "NcclGroup",
    "NotFoundError",
    "OutOfMemoryError", "PeerFailedError", "PushError", "PushReport", "Receiver",
    "ReceiverOutcome", "Sender", "TimeoutError", "UnimplementedError", "Version", "api_version",
    "errors", "library_path",
]

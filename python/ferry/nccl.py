"""ferry.nccl: NCCL weight-update groups (SGLang's init_weights_update_group,
update_weights_from_distributed and destroy_weights_update_group) over libferry.so.

`NcclGroup` is rank 0, the trainer: it creates the group, gives each update's request (what every
receiver's POST /update_weights_from_distributed, or embedded Receiver, must get) and broadcasts
the update's tensors. An embedded `ferry.Receiver` joins with init_weights_update_group() and
receives with update_weights_from_distributed(). Keep NCCL_NVLS_ENABLE=0 in the environment.

A library built without NCCL raises ferry.UnimplementedError; a machine without a GPU,
ferry.FailedPreconditionError.
"""

import ctypes
import json

from . import errors
from ._handle import OwnedHandle
from ._library import ConfigSource, _err, _p, check, config_source, lib, override_key, struct_size
from ._tensors import Views

DEFAULT_GROUP = "weight_update_group"


class NcclGroupCreateArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("config", ctypes.POINTER(ConfigSource)),
        ("master_address", ctypes.c_char_p),
        ("master_port", ctypes.c_uint16),
        ("world_size", ctypes.c_uint32),
        ("group_name", ctypes.c_char_p),
        ("device", ctypes.c_int32),
        ("bucket_bytes", ctypes.c_uint64),
        ("init_timeout_ms", ctypes.c_int64),
        ("bucket_timeout_ms", ctypes.c_int64),
    ]


class WeightsUpdateGroupArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("master_address", ctypes.c_char_p),
        ("master_port", ctypes.c_uint16),
        ("rank_offset", ctypes.c_uint32),
        ("world_size", ctypes.c_uint32),
        ("group_name", ctypes.c_char_p),
        ("backend", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
    ]


_FUNCTIONS = {
    "ferry_nccl_group_create": (_err, [ctypes.POINTER(NcclGroupCreateArgs), ctypes.POINTER(_p)]),
    "ferry_nccl_group_update_request": (_err, [_p, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]),
    "ferry_nccl_group_broadcast": (_err, [_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_uint64),
                                          ctypes.POINTER(ctypes.c_double)]),
    "ferry_nccl_group_reinit": (_err, [_p]),
    "ferry_nccl_group_abort": (_err, [_p, ctypes.c_char_p]),
    "ferry_nccl_group_close": (_err, [_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p)]),
    "ferry_nccl_group_destroy": (None, [_p]),
    "ferry_receiver_init_weights_update_group": (_err, [_p,
                                                        ctypes.POINTER(WeightsUpdateGroupArgs)]),
    "ferry_receiver_update_weights_from_distributed": (_err, [_p, ctypes.c_char_p,
                                                              ctypes.POINTER(ctypes.c_uint64)]),
    "ferry_receiver_destroy_weights_update_group": (_err, [_p, ctypes.c_char_p, ctypes.c_int64,
                                                           ctypes.POINTER(ctypes.c_void_p)]),
}

_declared = set()


def _fn(name):
    """The C function `name`, declared on first use (a library older than these functions
    raises ferry.UnimplementedError naming it)."""
    c = lib()
    if name not in _declared:
        try:
            fn = getattr(c, name)
        except AttributeError:
            raise errors.UnimplementedError(
                errors.UNIMPLEMENTED, f"{name}: the loaded libferry.so has no NCCL groups "
                "(built before they were added)") from None
        fn.restype, fn.argtypes = _FUNCTIONS[name]
        _declared.add(name)
    return getattr(c, name)


def _take(pointer):
    if not pointer:
        return None
    text = ctypes.string_at(pointer).decode("utf-8", "replace")
    lib().ferry_string_free(pointer)
    return text


def _ms(seconds, what, default_none=0):
    if seconds is None:
        return default_none
    if seconds <= 0:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          f"{what} must be positive seconds, got {seconds!r}")
    return max(1, int(round(seconds * 1000)))


def _port(port):
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          f"master_port must be an integer from 1 to 65535, "
                                          f"got {port!r}")
    return port


class NcclGroup(OwnedHandle):
    """Rank 0 of an NCCL weight-update group on CUDA device `device`; blocks until every
    receiver rank joined (their init must run concurrently: start the engines' POST
    /init_weights_update_group in threads first) or `init_timeout` seconds passed.

    Typical loop: body = group.update_request(named_tensors, weight_version) is POSTed to every
    engine's /update_weights_from_distributed in threads while group.broadcast(named_tensors) runs.
    `bucket_bytes` is told to the receivers in each request. Threading: one broadcast at a time;
    abort() may be called from any thread.
    """

    _closed_what = "the NCCL group"

    def __init__(self, master_address, master_port, world_size, group_name=DEFAULT_GROUP,
                 device=0, bucket_bytes=0, init_timeout=None, bucket_timeout=None, config=None,
                 *, config_text=None, **overrides):
        self._handle = None
        if not isinstance(world_size, int) or world_size < 1:
            raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                              f"world_size must be an integer >= 1, got "
                                              f"{world_size!r}")
        source, keep = config_source(config, config_text,
                                     {override_key(k): v for k, v in overrides.items()})
        args = NcclGroupCreateArgs()
        args.struct_size = struct_size(NcclGroupCreateArgs)
        args.config = ctypes.pointer(source) if source is not None else None
        args.master_address = master_address.encode() if master_address else None
        args.master_port = _port(master_port)
        args.world_size = world_size
        args.group_name = group_name.encode() if group_name else None
        args.device = int(device)
        args.bucket_bytes = int(bucket_bytes)
        args.init_timeout_ms = _ms(init_timeout, "init_timeout")
        args.bucket_timeout_ms = _ms(bucket_timeout, "bucket_timeout")
        handle = ctypes.c_void_p()
        check(_fn("ferry_nccl_group_create")(ctypes.byref(args), ctypes.byref(handle)))
        del keep
        self._handle = handle
        self.group_name = group_name or DEFAULT_GROUP

    def update_request(self, named_tensors, weight_version=None):
        """The dict every receiver must get for this update (names, dtypes, shapes, group_name,
        bucket_bytes, timeout_s, weight_version)."""
        self._require_open()
        with Views(named_tensors, writable=False) as views:
            out = ctypes.c_void_p()
            check(_fn("ferry_nccl_group_update_request")(
                self._handle, views.pointers(), len(views.views),
                str(weight_version).encode() if weight_version is not None else None,
                ctypes.byref(out)))
        return json.loads(_take(out))

    def broadcast(self, named_tensors):
        """Broadcasts one update (CUDA tensors of the group's device, or host tensors; read in
        place). Returns (bytes, seconds). On failure every rank aborts and reinit() is needed."""
        self._require_open()
        with Views(named_tensors, writable=False) as views:
            sent = ctypes.c_uint64()
            seconds = ctypes.c_double()
            check(_fn("ferry_nccl_group_broadcast")(self._handle, views.pointers(),
                                                     len(views.views), ctypes.byref(sent),
                                                     ctypes.byref(seconds)))
        return sent.value, seconds.value

    def reinit(self):
        """Re-creates the group after a failure (the receivers init again, concurrently)."""
        self._require_open()
        check(_fn("ferry_nccl_group_reinit")(self._handle))

    def abort(self, reason=None):
        """Any thread: a broadcast in flight fails; every receiver's wait names rank 0."""
        self._require_open()
        check(_fn("ferry_nccl_group_abort")(self._handle, reason.encode() if reason else None))

    def destroy(self, timeout=None):
        """destroy_weights_update_group on rank 0 (run it while the engines destroy theirs):
        returns "finalized", "aborted", "continuing in the background" or "closed"."""
        self._require_open()
        how = ctypes.c_void_p()
        check(_fn("ferry_nccl_group_close")(self._handle, _ms(timeout, "timeout"),
                                            ctypes.byref(how)))
        return _take(how)

    def close(self):
        """Destroys the group (if not yet) and frees it."""
        if self._handle:
            _fn("ferry_nccl_group_destroy")(self._handle)
            self._handle = None



# ---- the embedded receiver's side (ferry.Receiver methods call these) ------------------------


def init_weights_update_group(handle, master_address, master_port, rank_offset, world_size,
                              group_name=DEFAULT_GROUP, backend="nccl", timeout=None):
    args = WeightsUpdateGroupArgs()
    args.struct_size = struct_size(WeightsUpdateGroupArgs)
    args.master_address = master_address.encode() if master_address else None
    args.master_port = _port(master_port)
    if not isinstance(rank_offset, int) or rank_offset < 0:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          f"rank_offset must be an integer >= 1, got "
                                          f"{rank_offset!r}")
    if not isinstance(world_size, int) or world_size < 0:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          f"world_size must be an integer >= 1, got "
                                          f"{world_size!r}")
    args.rank_offset = rank_offset
    args.world_size = world_size
    args.group_name = group_name.encode() if group_name else None
    args.backend = backend.encode() if backend else None
    args.timeout_ms = _ms(timeout, "timeout")
    check(_fn("ferry_receiver_init_weights_update_group")(handle, ctypes.byref(args)))


def update_weights_from_distributed(handle, request=None, *, names=None, dtypes=None, shapes=None,
                                    group_name=DEFAULT_GROUP, weight_version=None, **extra):
    if request is None:
        request = {"names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name}
        if weight_version is not None:
            request["weight_version"] = str(weight_version)
        request.update(extra)
    text = request if isinstance(request, str) else json.dumps(request)
    version = ctypes.c_uint64()
    check(_fn("ferry_receiver_update_weights_from_distributed")(handle, text.encode(),
                                                                ctypes.byref(version)))
    return version.value


def destroy_weights_update_group(handle, group_name=DEFAULT_GROUP, timeout=None):
    how = ctypes.c_void_p()
    check(_fn("ferry_receiver_destroy_weights_update_group")(
        handle, group_name.encode() if group_name else None, _ms(timeout, "timeout"),
        ctypes.byref(how)))
    return _take(how)

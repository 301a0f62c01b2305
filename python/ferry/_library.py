"""ferry._library: finds and loads libferry.so and declares the C API's functions for ctypes.

Search order: FERRY_LIBRARY, the copy a wheel carries (ferry/_native/lib/libferry.so, with its
plugins and libraries beside it), the newest build*/host/capi of a source checkout this package is
imported from, lib/ of a scripts/bundle folder it is imported from (<bundle>/python/ferry),
<sys.prefix>/lib*, then the system search path. Loaded once, on first use, so that `import ferry`
works without the library.
"""

import ctypes
import ctypes.util
import os
import sys
import threading
from pathlib import Path

from . import errors

# ---- C structs (ferry/ferry.h, ferry/dlpack.h). Field order and types follow the header. -----


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLDeleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLDeleter),
]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("dlpack", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("data", ctypes.c_void_p),
        ("memory_kind", ctypes.c_int),
        ("device", ctypes.c_int32),
    ]


class ConfigSource(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("path", ctypes.c_char_p),
        ("toml_text", ctypes.c_char_p),
        ("overrides", ctypes.POINTER(ctypes.c_char_p)),
        ("num_overrides", ctypes.c_size_t),
    ]


class SenderCreateArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("config", ctypes.POINTER(ConfigSource)),
        ("receivers", ctypes.POINTER(ctypes.c_char_p)),
        ("num_receivers", ctypes.c_size_t),
        ("transport", ctypes.c_char_p),
        ("bucket_bytes", ctypes.c_uint64),
        ("token", ctypes.c_char_p),
        ("connect_timeout_ms", ctypes.c_int64),
        ("bucket_timeout_ms", ctypes.c_int64),
        ("commit_timeout_ms", ctypes.c_int64),
    ]


class PushArgs(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("tensors", ctypes.POINTER(ctypes.c_void_p)),
        ("num_tensors", ctypes.c_size_t),
        ("version", ctypes.c_uint64),
        ("label", ctypes.c_char_p),
        # API 1.3: stream ordering (ferry_stream_order_t and its handles)
        ("order", ctypes.c_uint32),
        ("order_handles", ctypes.POINTER(ctypes.c_void_p)),
        ("num_order_handles", ctypes.c_size_t),
    ]


# ferry_stream_order_t
ORDER_SYNC_DEVICES = 0
ORDER_STREAMS = 1
ORDER_EVENTS = 2
ORDER_NONE = 3


class ReceiverResult(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("address", ctypes.c_char_p),
        ("committed", ctypes.c_int),
        ("error", ctypes.c_char_p),
        ("bytes", ctypes.c_uint64),
        ("buckets", ctypes.c_uint64),
        ("seconds", ctypes.c_double),
        ("transport", ctypes.c_char_p),
        ("direct", ctypes.c_int),
        ("writer_fingerprints", ctypes.c_int),
        ("reused_session", ctypes.c_int),
        # API 1.5: a sharded push's bytes needed and bytes moved per rank
        ("needed_bytes", ctypes.c_uint64),
        ("num_ranks", ctypes.c_size_t),
        ("rank_bytes", ctypes.POINTER(ctypes.c_uint64)),
        # API 1.7: the receiver read the tensors in place and applied its plan from them
        ("reads_in_place", ctypes.c_int),
    ]


class Block(ctypes.Structure):  # ferry_block_t (API 1.5)
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("global_shape", ctypes.POINTER(ctypes.c_uint64)),
        ("offsets", ctypes.POINTER(ctypes.c_uint64)),
        ("replica", ctypes.c_int),
    ]


class ShardedPushArgs(ctypes.Structure):  # ferry_sharded_push_args_t (API 1.5)
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("push", ctypes.POINTER(PushArgs)),
        ("rank", ctypes.c_uint32),
        ("world", ctypes.c_uint32),
        ("blocks", ctypes.POINTER(ctypes.c_void_p)),
    ]


PAUSE_MODES = ("abort", "retract", "in_place")  # ferry_pause_mode_t, in order

PauseCallback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                 ctypes.POINTER(ctypes.c_uint64))
FlagCallback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
PlainCallback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
MemoryCallback = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.c_int)


class EngineCallbacks(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("user_data", ctypes.c_void_p),
                ("pause", PauseCallback), ("resume", FlagCallback),
                ("flush_cache", FlagCallback), ("post_load", PlainCallback),
                ("memory", MemoryCallback), ("memory_tags", ctypes.POINTER(ctypes.c_char_p)),
                ("num_memory_tags", ctypes.c_size_t)]


def struct_size(struct_type):
    """FERRY_STRUCT_SIZE(type, last_field): the size up to the end of the last field."""
    name, field_type = struct_type._fields_[-1][:2]
    return getattr(struct_type, name).offset + ctypes.sizeof(field_type)


# ---- loading -------------------------------------------------------------------------------

API_MAJOR = 1
API_MINOR = 5

_lock = threading.Lock()
_lib = None
_path = None

_err = ctypes.c_void_p  # ferry_error_t*
_p = ctypes.c_void_p    # an opaque handle

# name: (restype, argtypes)
_FUNCTIONS = {
    "ferry_api_version": (None, [ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]),
    "ferry_version_string": (ctypes.c_char_p, []),
    "ferry_error_code": (ctypes.c_int, [_err]),
    "ferry_error_message": (ctypes.c_char_p, [_err]),
    "ferry_error_free": (None, [_err]),
    "ferry_string_free": (None, [ctypes.c_void_p]),
    "ferry_sender_create": (_err, [ctypes.POINTER(SenderCreateArgs), ctypes.POINTER(_p)]),
    "ferry_sender_push": (_err, [_p, ctypes.POINTER(PushArgs), ctypes.POINTER(_p)]),
    "ferry_sender_push_sharded": (_err, [_p, ctypes.POINTER(ShardedPushArgs),
                                         ctypes.POINTER(_p)]),
    "ferry_sender_status": (_err, [_p, ctypes.POINTER(_p)]),
    "ferry_sender_abort": (_err, [_p, ctypes.c_char_p]),
    "ferry_sender_destroy": (None, [_p]),
    "ferry_push_report_version": (ctypes.c_uint64, [_p]),
    "ferry_push_report_bytes": (ctypes.c_uint64, [_p]),
    "ferry_push_report_seconds": (ctypes.c_double, [_p]),
    "ferry_push_report_producer_wait_seconds": (ctypes.c_double, [_p]),
    "ferry_cuda_consumer_stream": (_err, [ctypes.c_int32, ctypes.POINTER(ctypes.c_size_t)]),
    "ferry_dlpack_release": (None, [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
    "ferry_receiver_set_engine_order": (_err, [_p, ctypes.c_uint32,
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]),
    "ferry_push_report_all_committed": (ctypes.c_int, [_p]),
    "ferry_push_report_num_receivers": (ctypes.c_size_t, [_p]),
    "ferry_push_report_receiver": (_err, [_p, ctypes.c_size_t, ctypes.POINTER(ReceiverResult)]),
    "ferry_push_report_free": (None, [_p]),
    "ferry_receiver_create": (_err, [ctypes.POINTER(ConfigSource), ctypes.POINTER(_p)]),
    "ferry_receiver_register_param": (_err, [_p, ctypes.POINTER(Tensor)]),
    "ferry_receiver_serve": (_err, [_p, ctypes.c_char_p, ctypes.c_int32,
                                    ctypes.POINTER(ctypes.c_int32)]),
    "ferry_receiver_stop": (_err, [_p]),
    "ferry_receiver_release": (_err, [_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "ferry_receiver_resume": (_err, [_p, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]),
    "ferry_receiver_version": (_err, [_p, ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_void_p)]),
    "ferry_receiver_health": (_err, [_p, ctypes.POINTER(ctypes.c_int),
                                     ctypes.POINTER(ctypes.c_void_p)]),
    "ferry_receiver_fingerprints": (_err, [_p, ctypes.POINTER(_p)]),
    "ferry_fingerprints_count": (ctypes.c_size_t, [_p]),
    "ferry_fingerprints_entry": (_err, [_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
                                        ctypes.POINTER(ctypes.c_uint64)]),
    "ferry_fingerprints_free": (None, [_p]),
    "ferry_receiver_destroy": (None, [_p]),
    "ferry_error_create": (_err, [ctypes.c_int, ctypes.c_char_p]),
    "ferry_receiver_set_engine_callbacks": (_err, [_p, ctypes.POINTER(EngineCallbacks)]),
    "ferry_receiver_update_weights_from_ipc": (_err, [_p, ctypes.c_char_p,
                                                      ctypes.POINTER(ctypes.c_uint64)]),
}


def _candidates():
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        return [env]  # an explicit choice is the only one tried
    here = Path(__file__).resolve().parent
    found = [here / "_native" / "lib" / "libferry.so"]
    checkout = here.parent.parent  # python/ferry -> repository root, or <bundle>/python/ferry
    if (checkout / "meson.build").is_file():
        builds = sorted(checkout.glob("build*/host/capi/libferry.so"),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        found += builds
    elif (checkout / "bin" / "ferry").is_file():
        found.append(checkout / "lib" / "libferry.so")
    for libdir in ("lib", "lib64", "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu"):
        found.append(Path(sys.prefix) / libdir / "libferry.so")
    system = ctypes.util.find_library("ferry")
    if system:
        found.append(system)
    found.append("libferry.so.1")  # the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig)
    return [str(p) for p in found]


def _declare(lib):
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def lib():
    """The loaded library (ctypes.CDLL), loading it on first use. Raises ferry.NotFoundError
    listing every place tried, or ferry.IncompatibleError for another API major."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for candidate in _candidates():
            if os.sep in candidate and not os.path.exists(candidate):
                tried.append(f"{candidate} (no such file)")
                continue
            try:
                loaded = ctypes.CDLL(candidate)
            except OSError as e:
                tried.append(f"{candidate} ({e})")
                continue
            _declare(loaded)
            major, minor = ctypes.c_uint32(), ctypes.c_uint32()
            loaded.ferry_api_version(ctypes.byref(major), ctypes.byref(minor))
            if major.value != API_MAJOR or minor.value < API_MINOR:
                raise errors.IncompatibleError(
                    errors.INCOMPATIBLE,
                    f"{candidate} implements the C API {major.value}.{minor.value}; this package "
                    f"needs {API_MAJOR}.{API_MINOR} or a later minor")
            _lib, _path = loaded, candidate
            return _lib
        raise errors.NotFoundError(
            errors.NOT_FOUND,
            "libferry.so not found: install the wheel scripts/wheel builds (it carries the library), "
            "or set FERRY_LIBRARY to the path of a built one; tried: " + "; ".join(tried))


def library_path():
    """The path of the loaded library (loads it if needed)."""
    lib()
    return _path


def check(error):
    """Raises the ferry.Error for a returned ferry_error_t* (and frees it); NULL is success."""
    if not error:
        return
    c = lib()
    code = c.ferry_error_code(error)
    message = (c.ferry_error_message(error) or b"").decode("utf-8", "replace")
    c.ferry_error_free(error)
    raise errors.error_for(code, message)


def take_string(pointer):
    """Copies and frees a char* the library returned as owned (None for NULL)."""
    if not pointer:
        return None
    text = ctypes.string_at(pointer).decode("utf-8", "replace")
    lib().ferry_string_free(pointer)
    return text


def config_source(config, config_text, overrides):
    """A ConfigSource (and the objects it points into, to keep alive) for a path, a TOML text
    and a dict of overrides; None when all three are empty."""
    if config is None and config_text is None and not overrides:
        return None, []
    keep = []
    source = ConfigSource()
    source.struct_size = struct_size(ConfigSource)
    if config is not None:
        source.path = os.fsencode(config)
    if config_text is not None:
        source.toml_text = config_text.encode()
    items = [f"{key}={toml_value(value)}".encode() for key, value in (overrides or {}).items()]
    array = (ctypes.c_char_p * max(1, len(items)))(*items)
    keep += [items, array]
    source.overrides = array
    source.num_overrides = len(items)
    return source, keep


def toml_value(value):
    """A config override's value as TOML text (strings may stay bare: the config accepts that)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_quoted(v) if isinstance(v, str) else toml_value(v)
                               for v in value) + "]"
    return str(value)


def _quoted(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def override_key(keyword):
    """A keyword argument's config key: `update__bucket_bytes` -> `update.bucket_bytes`."""
    return keyword.replace("__", ".")

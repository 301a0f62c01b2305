"""ferry._tensors: views of Python tensors as ferry_tensor_t, zero-copy.

Anything with `__dlpack__` (PyTorch CPU/CUDA tensors, NumPy >= 1.22 arrays, JAX, CuPy) is read
through its DLPack capsule: the capsule is consumed (renamed "used_dltensor" as the protocol
says), the DLTensor is handed to the C API as it is, and the producer's deleter is called when
the view is released. NumPy arrays that cannot export DLPack (read-only ones, old NumPy) are
described through `__array_interface__` as a plain view. Nothing is copied: a non-contiguous
tensor is refused by the C API with a message, never silently copied.

Stream ordering (docs/c-api.md, "Stream ordering"): a sender must not read a CUDA tensor before
the work its producer queued on it is done. `Producers` collects, while tensors are exported, what
the push must wait for: a CUDA tensor of another library is exported with
`__dlpack__(stream=S)`, S a stream ferry owns on its device, so the producer orders its pending
work before S (the DLPack protocol), and the push waits for S. A PyTorch tensor's protocol orders
S after torch's current stream of its device, whatever the tensor, so ferry names that current
stream itself, once per device, and exports without a per-tensor event (4096 tensors would cost
milliseconds of Python otherwise). A producer whose `__dlpack__` takes no stream makes the push
synchronise the devices instead.
"""

import ctypes
import sys

from . import errors
from ._library import (ORDER_NONE, ORDER_STREAMS, ORDER_SYNC_DEVICES, Tensor,
                       check, lib, struct_size)

_CAPSULE_NAME = b"dltensor"
_USED_CAPSULE_NAME = b"used_dltensor"  # module constant: the capsule keeps pointing at it

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# ferry_dtype_t for NumPy type strings (kind + item size), for the __array_interface__ path.
_NUMPY_DTYPES = {
    "f8": 1, "f4": 2, "f2": 3, "i8": 5, "i4": 6, "i2": 7, "i1": 8, "u1": 9, "b1": 10,
}
_MEMORY_HOST = 1
_TENSOR_SIZE = struct_size(Tensor)


class TensorView:
    """One named tensor lent to the C API. `struct` is the ferry_tensor_t; release() ends the
    loan (calls the DLPack deleter). The tensor object itself is kept alive meanwhile."""

    def __init__(self, name, obj, writable, producers=None):
        if not isinstance(name, str) or not name:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, f"tensor name {name!r} is not a non-empty string")
        self.name = name
        self.owner = obj
        self._managed = None
        self._keep = []
        self.struct = Tensor()
        self.struct.struct_size = _TENSOR_SIZE
        self.struct.name = name.encode()
        capsule = _dlpack_capsule(obj, name, producers)
        if capsule is not None:
            self._take_capsule(capsule)
        else:
            self._array_interface(obj, name, writable)

    def _take_capsule(self, capsule):
        if not _is_valid(capsule, _CAPSULE_NAME):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"tensor '{self.name}': __dlpack__() returned no unused 'dltensor' capsule")
        pointer = _get_pointer(capsule, _CAPSULE_NAME)
        # From here on the deleter is ours to call (the capsule's destructor skips used ones).
        _set_name(capsule, _USED_CAPSULE_NAME)
        self._managed = pointer
        self.struct.dlpack = pointer  # dl_tensor is the first member of DLManagedTensor

    def _array_interface(self, obj, name, writable):
        interface = getattr(obj, "__array_interface__", None)
        if interface is None:
            raise TypeError(f"tensor '{name}': {type(obj).__name__} has neither __dlpack__ nor "
                            "__array_interface__")
        data, readonly = interface["data"]
        if writable and readonly:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"tensor '{name}': the array is read-only, and a receiver writes into it")
        typestr = interface["typestr"]
        dtype = _NUMPY_DTYPES.get(typestr[1:])
        if dtype is None or typestr[0] == ">":
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"tensor '{name}': array type {typestr!r} is not a dtype ferry supports")
        itemsize = int(typestr[2:])
        shape = tuple(interface["shape"])
        byte_strides = interface.get("strides")
        shape_array = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        self._keep.append(shape_array)
        self.struct.dtype = dtype
        self.struct.ndim = len(shape)
        self.struct.shape = shape_array
        if byte_strides is not None:
            if any(s % itemsize for s in byte_strides):
                raise errors.InvalidArgumentError(
                    errors.INVALID_ARGUMENT,
                    f"tensor '{name}': byte strides {byte_strides} are not whole elements")
            strides = (ctypes.c_int64 * max(1, len(shape)))(*(s // itemsize for s in byte_strides))
            self._keep.append(strides)
            self.struct.strides = strides
        self.struct.data = data
        self.struct.memory_kind = _MEMORY_HOST

    def take_managed(self):
        """The DLManagedTensor address whose deleter is now the caller's to call (0: none)."""
        managed, self._managed = self._managed, None
        return managed or 0

    def release(self):
        managed = self.take_managed()
        if managed:
            lib().ferry_dlpack_release((ctypes.c_void_p * 1)(managed), 1)


_KDL_CUDA = 2
_KDL_CUDA_MANAGED = 13
_consumer_streams = {}  # CUDA device -> ferry's consumer stream there (ferry_cuda_consumer_stream)


def consumer_stream(device):
    """The cudaStream_t value of the stream ferry owns on `device`, for __dlpack__(stream=...)."""
    stream = _consumer_streams.get(device)
    if stream is None:
        value = ctypes.c_size_t()
        check(lib().ferry_cuda_consumer_stream(int(device), ctypes.byref(value)))
        stream = _consumer_streams.setdefault(device, value.value)
    return stream


def _cuda_device(obj):
    """The CUDA device ordinal of a DLPack producer's tensor, or None for other memory."""
    describe = getattr(obj, "__dlpack_device__", None)
    if describe is None:
        return None
    try:
        kind, device = describe()
    except (TypeError, ValueError, RuntimeError):
        return None
    return int(device) if int(kind) in (_KDL_CUDA, _KDL_CUDA_MANAGED) else None


def stream_handles(streams, what):
    """cudaStream_t values of `streams` (a stream object with `cuda_stream`, such as a
    torch.cuda.Stream, an int, or a list of them); InvalidArgumentError naming `what`
    otherwise. A string is refused (the callers treat "none" themselves)."""
    if isinstance(streams, str):
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT,
            f"{what}={streams!r}: give a CUDA stream, a list of them, or 'none'")
    handles = []
    for s in streams if isinstance(streams, (list, tuple)) else [streams]:
        handle = getattr(s, "cuda_stream", s)
        if not isinstance(handle, int) or isinstance(handle, bool) or handle < 0:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"{what}: {s!r} is neither a CUDA stream object nor a cudaStream_t value")
        if handle not in handles:
            handles.append(handle)
    return handles


def _is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


class Producers:
    """What a push waits for before ferry reads its CUDA tensors (see the module's text).
    `streams` overrides it: the caller names the producer's streams (ints or objects with
    `cuda_stream`), or "none" when it synchronised itself."""

    def __init__(self, streams=None):
        self.explicit = streams is not None
        self.sync_devices = False
        self.none = isinstance(streams, str) and streams == "none"
        self.streams = []
        self._torch_devices = set()
        self._pinned_seen = False
        if self.explicit and not self.none:
            for handle in stream_handles(streams, "stream"):
                self._add(handle)

    def _add(self, handle):
        if handle not in self.streams:
            self.streams.append(handle)

    def add_torch_device(self, device):
        """Orders the push after torch's current stream of CUDA `device` (unless the caller named
        the streams)."""
        if not self.explicit and device not in self._torch_devices:
            self._torch_devices.add(device)
            self._add(sys.modules["torch"].cuda.current_stream(device).cuda_stream)

    def export(self, source):
        """The capsule of `source`, ordered for reading by ferry (records what to wait for)."""
        if _is_torch_tensor(source):
            # PyTorch's own attributes: __dlpack_device__ and __dlpack__ cost ~5 us a tensor more.
            if source.is_cuda and not self.explicit:
                self.add_torch_device(source.get_device())
            elif (not self.explicit and not self._pinned_seen
                  and sys.modules["torch"].cuda.is_initialized() and source.is_pinned()):
                # Page-locked host memory that a non_blocking device-to-host copy may still be
                # filling: ordered after torch's current stream of the current device. (Without
                # CUDA initialised no copy can be in flight, and is_pinned() would initialise it.)
                self._pinned_seen = True
                self._add(sys.modules["torch"].cuda.current_stream().cuda_stream)
            # No event of its own: the current stream is named above (or by the caller).
            return sys.modules["torch"]._C._to_dlpack(source)
        device = None if self.explicit else _cuda_device(source)
        if device is None:
            return source.__dlpack__()
        stream = consumer_stream(device)
        try:
            capsule = source.__dlpack__(stream=stream)
        except TypeError:
            self.sync_devices = True  # a producer without the stream protocol
            return source.__dlpack__()
        self._add(stream)
        return capsule

    def fill(self, args):
        """Sets the push args' order fields; returns what must stay alive during the call."""
        if self.none:
            args.order = ORDER_NONE
            return None
        if self.sync_devices or not self.streams:
            args.order = ORDER_SYNC_DEVICES
            return None
        handles = (ctypes.c_void_p * len(self.streams))(*self.streams)
        args.order = ORDER_STREAMS
        args.order_handles = handles
        args.num_order_handles = len(self.streams)
        return handles


def _dlpack_capsule(obj, name, producers=None):
    """The DLPack capsule of `obj`, or None when it offers none NumPy's __array_interface__ could
    replace (read-only or old NumPy arrays)."""
    exporter = getattr(obj, "__dlpack__", None)
    if exporter is None:
        return None
    source = obj
    if _is_torch_tensor(obj) and (obj.is_neg() or obj.is_conj()):
        # A lazy negation or conjugation: the memory holds the values before it, and some
        # PyTorch releases export that memory as it is.
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT,
            f"tensor '{name}': its {'negative' if obj.is_neg() else 'conjugate'} bit is set (a "
            f"lazy {'negation' if obj.is_neg() else 'conjugation'}); pass "
            f"t.{'resolve_neg' if obj.is_neg() else 'resolve_conj'}() instead")
    if getattr(obj, "requires_grad", False) and hasattr(obj, "detach"):
        source = obj.detach()  # same storage; PyTorch refuses to export tensors that need grad
    try:
        if producers is not None:
            return producers.export(source)
        return source.__dlpack__()
    except (BufferError, TypeError, RuntimeError) as e:
        if hasattr(obj, "__array_interface__"):
            return None
        raise errors.InvalidArgumentError(
            errors.INVALID_ARGUMENT, f"tensor '{name}': __dlpack__() failed: {e}") from e


def named_items(named_tensors):
    """(name, tensor) pairs from a mapping or an iterable of pairs."""
    if hasattr(named_tensors, "items"):
        return list(named_tensors.items())
    return list(named_tensors)


class Views:
    """A batch of TensorViews; a context manager that releases every view on exit."""

    def __init__(self, named_tensors, writable, producers=None):
        self.views = []
        try:
            for item in named_items(named_tensors):
                if not isinstance(item, tuple) or len(item) != 2:
                    raise TypeError(f"expected (name, tensor) pairs, got {type(item).__name__}")
                self.views.append(TensorView(item[0], item[1], writable, producers))
        except BaseException:
            self.close()
            raise

    def pointers(self):
        array = (ctypes.c_void_p * max(1, len(self.views)))(
            *(ctypes.addressof(v.struct) for v in self.views))
        return array

    def close(self):
        # One C call gives every DLPack view back (ferry_dlpack_release, with the GIL released
        # like any ctypes call): a foreign call per view cost ~3 us each after a push returned,
        # ~1 ms for a model's few hundred tensors (docs/benchmarks.md, session 19).
        managed = [v.take_managed() for v in self.views]
        managed = [m for m in managed if m]
        if managed:
            lib().ferry_dlpack_release((ctypes.c_void_p * len(managed))(*managed), len(managed))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- the push of the same tensors again ----------------------------------------------------

_MEMORY_CUDA = 4
_torch_dtypes = {}  # torch.dtype -> ferry_dtype_t, filled on first use


def _ferry_dtype(torch, dtype):
    if not _torch_dtypes:
        names = {"float64": 1, "float32": 2, "float16": 3, "bfloat16": 4, "int64": 5, "int32": 6,
                 "int16": 7, "int8": 8, "uint8": 9, "bool": 10, "float8_e4m3fn": 11,
                 "float8_e5m2": 12}
        for name, value in names.items():
            if hasattr(torch, name):  # torch 1.13 has no float8 types
                _torch_dtypes[getattr(torch, name)] = value
    return _torch_dtypes.get(dtype)


class PlainViews:
    """The ferry_tensor_t array of one push, described without DLPack. `array` (pointers) stays
    valid while this object lives."""

    def __init__(self, signature, torch):
        self.devices = sorted({entry[5] for entry in signature if entry[5] >= 0})
        self._keep = []
        pointers = []
        for name, data, shape, strides, dtype, device in signature:
            struct = Tensor()
            struct.struct_size = _TENSOR_SIZE
            struct.name = name.encode()
            struct.dtype = _ferry_dtype(torch, dtype)
            struct.ndim = len(shape)
            shape_array = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            strides_array = (ctypes.c_int64 * max(1, len(shape)))(*strides)
            struct.shape = shape_array
            struct.strides = strides_array
            struct.data = data
            struct.memory_kind = _MEMORY_CUDA if device >= 0 else _MEMORY_HOST
            struct.device = max(device, 0)
            self._keep += [struct, shape_array, strides_array]
            pointers.append(ctypes.addressof(struct))
        self.array = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)


class ExportCache:
    """A sender's views of the torch tensors it pushed last, reused while the next push names the
    same tensors: the same names, data pointers, shapes, strides, dtypes and devices, in the same
    order (what describes a tensor to the C API, and nothing else). An RL trainer pushes the same
    parameters every step: exporting each one through DLPack costs ~5 us, a few milliseconds for a
    model's few hundred tensors on every push; comparing costs about one. It keeps no reference
    to the tensors (the caller's mapping keeps them alive during the push), and a push with
    anything else (another library's tensors, a tensor torch would not export, host tensors once
    CUDA is initialised: they may be page-locked and filled by a copy still running) goes through
    DLPack (Views)."""

    def __init__(self):
        self._signature = None
        self._quick = None  # the signature less the device (the one-pass check's)
        self._views = None
        self._host = False  # the cached views describe host tensors

    def _same(self, items, kinds):
        """Whether `items` describe the tensors of the cached views. Compared as it goes, with no
        list built: the objects it makes are freed at once, so it never sets off Python's
        garbage collector (a pass over a trainer's heap costs tens of milliseconds)."""
        try:
            for (name, t), (q_name, q_ptr, q_shape, q_strides, q_dtype) in zip(items, self._quick):
                if (type(t) not in kinds or t.data_ptr() != q_ptr or name != q_name
                        or t.dtype != q_dtype or t.shape != q_shape or t.stride() != q_strides
                        or t.is_neg()):
                    return False
        except (AttributeError, RuntimeError, TypeError):
            return False
        return True

    def views(self, items, producers):
        """PlainViews of `items` ((name, tensor) pairs), recording in `producers` what the push
        waits for; None when an item is not one this path takes."""
        torch = sys.modules.get("torch")
        if torch is None or not items:
            return None
        kinds = (torch.Tensor, torch.nn.Parameter)
        # The same tensors as last time: one pass over what describes them (~1 us a tensor; a
        # MoE trainer's 4719 tensors are pushed every step). What the full check below also
        # rejects cannot come back unseen: a sparse or meta tensor changes the data pointer (or
        # has none), a conjugate view is complex (no ferry dtype), and the negative bit is here.
        # (The device is the data pointer's: CUDA's unified addresses never repeat across
        # devices and host memory.)
        if (self._quick is not None and len(items) == len(self._quick)
                and not (self._host and torch.cuda.is_initialized())
                and self._same(items, kinds)):
            for device in self._views.devices:
                producers.add_torch_device(device)
            return self._views
        strided = torch.strided
        host_ok = not torch.cuda.is_initialized()
        signature = []
        for name, t in items:
            if type(t) not in kinds or not isinstance(name, str) or not name:
                return None
            device = t.get_device()  # -1: host memory
            if ((device < 0 and not host_ok) or t.layout is not strided or t.is_meta
                    or t.is_neg() or t.is_conj()):
                return None
            signature.append((name, t.data_ptr(), t.shape, t.stride(), t.dtype, device))
        if signature != self._signature:
            if any(_ferry_dtype(torch, entry[4]) is None for entry in signature):
                return None  # DLPack's path names the dtype ferry does not take
            self._views = PlainViews(signature, torch)
            self._signature = signature
            self._quick = [entry[:5] for entry in signature]
            self._host = any(entry[5] < 0 for entry in signature)
        for device in self._views.devices:
            producers.add_torch_device(device)
        return self._views

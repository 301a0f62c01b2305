"""ferry.receiver: an embedded receiver: updates land in the engine's own tensors, in place."""

import ctypes
from collections import namedtuple

from ._handle import OwnedHandle
from ._library import (ORDER_NONE, ORDER_STREAMS, ORDER_SYNC_DEVICES, PAUSE_MODES,
                       EngineCallbacks, FlagCallback, MemoryCallback, PauseCallback,
                       PlainCallback, check, config_source, lib, override_key, struct_size,
                       take_string)
from .errors import INTERNAL, Error
from ._tensors import TensorView, _is_torch_tensor, named_items, stream_handles

Version = namedtuple("Version", ["number", "label"])
Health = namedtuple("Health", ["ready", "state"])


class Receiver(OwnedHandle):
    """A receiver inside this process. Register the engine's parameters (they are written in
    place and never reallocated; they must live as long as the receiver, which keeps a reference
    to each), then serve() so that senders can push to HOST:PORT.

    The model family defaults to "identity" (the sender's names are the parameter names, e.g. a
    state_dict pushed into named_parameters()). `config` is a TOML file, `config_text` TOML text,
    every other keyword a config override with `__` for the dots
    (`receiver__model_family="dense"`, `update__verify_fingerprints=True`).

    Parameters on a GPU make the receiver's data path that GPU's (no receiver.device needed), so
    a trainer on the same host pushes through CUDA IPC. Before every update writes into them,
    ferry waits for the engine's work queued on them until then: on `engine_stream` (a
    torch.cuda.Stream, a cudaStream_t int, or a list) when given; "none" when the engine is idle
    during updates; by default, for PyTorch parameters, on torch's current stream of each
    parameter's device in the thread that registered them (where a PyTorch engine runs its
    forward passes; an engine with streams of its own names them), else by synchronising the
    parameters' devices. The engine must not start new work that reads the parameters while an
    update runs.
    """

    _closed_what = "the receiver"

    def __init__(self, config=None, *, config_text=None, engine_stream=None, **overrides):
        self._handle = None
        self._params = {}
        self._port = None
        self._host = None
        source, keep = config_source(config, config_text,
                                     {override_key(k): v for k, v in overrides.items()})
        handle = ctypes.c_void_p()
        check(lib().ferry_receiver_create(ctypes.byref(source) if source is not None else None,
                                          ctypes.byref(handle)))
        del keep
        self._handle = handle
        self._engine_stream_given = False  # by the caller (else torch's, found by register)
        self._torch_engine_streams = set()
        self._engine_callbacks = None  # the ctypes objects the library calls (kept alive)
        if engine_stream is not None:
            self.set_engine_stream(engine_stream)

    def set_engine_stream(self, engine_stream):
        """How updates wait for the engine before writing its parameters (see the class text)."""
        self._require_open()
        order, handles = ORDER_SYNC_DEVICES, []
        if isinstance(engine_stream, str) and engine_stream == "none":
            order = ORDER_NONE
        elif engine_stream is not None:
            handles = stream_handles(engine_stream, "engine_stream")
            order = ORDER_STREAMS
        array = (ctypes.c_void_p * max(1, len(handles)))(*handles)
        check(lib().ferry_receiver_set_engine_order(self._handle, order, array, len(handles)))
        self._engine_stream_given = True

    def register(self, named_params):
        """Registers (name, tensor) pairs, e.g. model.named_parameters(). Returns self."""
        self._require_open()
        devices = set()
        for name, tensor in named_items(named_params):
            view = TensorView(name, tensor, writable=True)
            try:
                check(lib().ferry_receiver_register_param(self._handle,
                                                          ctypes.byref(view.struct)))
            finally:
                view.release()
            self._params[name] = tensor  # the memory ferry writes into stays alive
            if getattr(tensor, "is_cuda", False) and _is_torch_tensor(tensor):
                devices.add(tensor.device.index)
        if devices and not self._engine_stream_given:
            # The engine's stream, by default: torch's current stream where it registers.
            import torch
            self._torch_engine_streams |= {torch.cuda.current_stream(d).cuda_stream
                                           for d in devices}
            self.set_engine_stream(sorted(self._torch_engine_streams))
            self._engine_stream_given = False
        return self

    def register_params(self, params):
        """Registers a mapping name -> tensor (NumPy arrays, PyTorch tensors, ...). Returns
        self."""
        return self.register(params.items())

    def serve(self, port=0, host="127.0.0.1"):
        """Starts serving in the background; returns the bound port (port 0: a free one)."""
        self._require_open()
        bound = ctypes.c_int32()
        check(lib().ferry_receiver_serve(self._handle, host.encode() if host else None,
                                         int(port), ctypes.byref(bound)))
        self._host, self._port = host, bound.value
        return bound.value

    @property
    def port(self):
        return self._port

    @property
    def address(self):
        """HOST:PORT to give senders (None before serve())."""
        return None if self._port is None else f"{self._host}:{self._port}"

    def stop(self):
        """Stops serving (a running update is aborted; the version stays)."""
        if self._handle:
            check(lib().ferry_receiver_stop(self._handle))
            self._port = None

    @property
    def version(self):
        """The published Version(number, label); number 0 before the first commit."""
        self._require_open()
        number = ctypes.c_uint64()
        label = ctypes.c_void_p()
        check(lib().ferry_receiver_version(self._handle, ctypes.byref(number),
                                           ctypes.byref(label)))
        return Version(number.value, take_string(label) or "")

    def health(self):
        self._require_open()
        ready = ctypes.c_int()
        state = ctypes.c_void_p()
        check(lib().ferry_receiver_health(self._handle, ctypes.byref(ready), ctypes.byref(state)))
        return Health(bool(ready.value), take_string(state) or "")

    def fingerprints(self):
        """{parameter name: fingerprint} (docs/fingerprint.md)."""
        self._require_open()
        c = lib()
        handle = ctypes.c_void_p()
        check(c.ferry_receiver_fingerprints(self._handle, ctypes.byref(handle)))
        try:
            out = {}
            for i in range(c.ferry_fingerprints_count(handle)):
                name = ctypes.c_char_p()
                value = ctypes.c_uint64()
                check(c.ferry_fingerprints_entry(handle, i, ctypes.byref(name),
                                                 ctypes.byref(value)))
                out[name.value.decode()] = value.value
            return out
        finally:
            c.ferry_fingerprints_free(handle)

    def release(self, tags=None):
        """release_memory_occupation for `tags` (a tag or a list; None: every tag). Kept sessions
        are suspended first (their senders unmap what they imported) and rejoined by the next
        push. For registered (engine-owned) parameters this is the engine saying it is about to
        free or unmap their memory itself: call it before, and resume() once the memory is mapped
        again at the same addresses; with memory.weights_policy "backup" ferry saves the weights
        and writes them back at the resume (docs/guides/colocated.md)."""
        self._tags_call(lib().ferry_receiver_release, tags)

    def resume(self, tags=None):
        """resume_memory_occupation for `tags` (a tag or a list; None: every tag)."""
        self._tags_call(lib().ferry_receiver_resume, tags)

    def _tags_call(self, fn, tags):
        self._require_open()
        if isinstance(tags, str):
            tags = [tags]
        encoded = [t.encode() for t in (tags or [])]
        array = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
        check(fn(self._handle, array, len(encoded)))

    def set_engine_callbacks(self, pause=None, resume=None, flush_cache=None, post_load=None,
                             memory=None, memory_tags=()):
        """What the engine does when the control API's SGLang routes ask (docs/http-api.md,
        "Engine routes"); each is optional and replaces any set before:

        - pause(mode) for /pause_generation (mode "abort", "retract" or "in_place"): returns the
          number of requests it paused or aborted (None: 0);
        - resume(torch_empty_cache) for /continue_generation, when generation was paused;
        - flush_cache(torch_empty_cache) for /flush_cache and after an update that asked for it;
        - post_load() at /end_weight_update, or after an update made outside a weight-update
          session (SGLang's post-load processing of new weights);
        - memory(tags, release) for /release_memory_occupation (release True) and
          /resume_memory_occupation of the engine's `memory_tags` (e.g. ["kv_cache"]).

        They run on the control API's threads, one at a time, and must not call this receiver.
        An exception in one fails the request that ran it, with the exception's text."""
        self._require_open()
        c = lib()

        def guarded(fn, what):
            def call(*args):
                try:
                    fn(*args)
                    return None
                except Error as e:  # keep a ferry error's code
                    return c.ferry_error_create(e.code, f"{what}: {e.message}".encode())
                except BaseException as e:  # noqa: BLE001 - reported, never swallowed
                    return c.ferry_error_create(
                        INTERNAL, f"{what}: {type(e).__name__}: {e}".encode())
            return call

        cb = EngineCallbacks()
        cb.struct_size = struct_size(EngineCallbacks)
        keep = []
        if pause is not None:
            def on_pause(_user, mode, count):
                n = pause(PAUSE_MODES[mode])
                count[0] = int(n or 0)
            cb.pause = PauseCallback(guarded(on_pause, "pause"))
            keep.append(cb.pause)
        if resume is not None:
            cb.resume = FlagCallback(guarded(lambda _u, e: resume(bool(e)), "resume"))
            keep.append(cb.resume)
        if flush_cache is not None:
            cb.flush_cache = FlagCallback(guarded(lambda _u, e: flush_cache(bool(e)),
                                                  "flush_cache"))
            keep.append(cb.flush_cache)
        if post_load is not None:
            cb.post_load = PlainCallback(guarded(lambda _u: post_load(), "post_load"))
            keep.append(cb.post_load)
        if memory is not None:
            def on_memory(_user, tags, count, release):
                memory([tags[i].decode() for i in range(count)], bool(release))
            cb.memory = MemoryCallback(guarded(on_memory, "memory"))
            keep.append(cb.memory)
        encoded = [t.encode() for t in memory_tags]
        tags = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
        cb.memory_tags = tags
        cb.num_memory_tags = len(encoded)
        check(c.ferry_receiver_set_engine_callbacks(self._handle, ctypes.byref(cb)))
        self._engine_callbacks = (cb, keep, tags)

    # NCCL weight-update groups (ferry/nccl.py; SGLang's names and fields).
    def init_weights_update_group(self, master_address, master_port, rank_offset, world_size,
                                  group_name="weight_update_group", backend="nccl", timeout=None):
        """Joins rank 0's group (blocks until every rank joined); fixes the parameter layout."""
        self._require_open()
        from . import nccl
        nccl.init_weights_update_group(self._handle, master_address, master_port, rank_offset,
                                       world_size, group_name, backend, timeout)

    def update_weights_from_distributed(self, request=None, **fields):
        """Receives one broadcast update: `request` is NcclGroup.update_request()'s dict (or
        names=, dtypes=, shapes=, group_name=, weight_version=). Returns the version number."""
        self._require_open()
        from . import nccl
        return nccl.update_weights_from_distributed(self._handle, request, **fields)

    def destroy_weights_update_group(self, group_name="weight_update_group", timeout=None):
        """Leaves the group: "finalized" when rank 0 destroys at the same time, else "aborted"."""
        self._require_open()
        from . import nccl
        return nccl.destroy_weights_update_group(self._handle, group_name, timeout)

    def update_weights_from_ipc(self, zmq_handles, weight_version=None, flush_cache=True,
                                timeout=None):
        """Receives one update from a checkpoint-engine ParameterServer on this node (SGLang's
        update_weights_from_ipc): `zmq_handles` maps GPU UUIDs to the ParameterServer's ZMQ
        addresses (its req_func's socket_paths, as a dict or a list of pairs); the entry of this
        receiver's GPU (receiver.device cuda:N) is used. `timeout`: seconds to wait for any one
        message (default 120). Blocks until the update is committed; returns the version number.
        The previous version stays on any failure."""
        self._require_open()
        import json
        request = {"zmq_handles": dict(zmq_handles), "flush_cache": bool(flush_cache)}
        if weight_version is not None:
            request["weight_version"] = str(weight_version)
        if timeout is not None:
            request["timeout_s"] = float(timeout)
        version = ctypes.c_uint64()
        check(lib().ferry_receiver_update_weights_from_ipc(
            self._handle, json.dumps(request).encode(), ctypes.byref(version)))
        return version.value

    def close(self):
        """Stops serving and frees the receiver; registered tensors are left as they are."""
        if self._handle:
            lib().ferry_receiver_destroy(self._handle)
            self._handle = None
            self._port = None


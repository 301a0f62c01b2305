"""ferry.sender: the trainer side: push versioned updates to one or many receivers."""

import contextlib
import ctypes
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field

from . import errors
from ._handle import OwnedHandle
from ._library import (Block as _CBlock, PushArgs, ReceiverResult, SenderCreateArgs,
                       ShardedPushArgs, config_source, lib, override_key, struct_size)
from ._library import check as _raise_if
from ._tensors import ExportCache, Producers, Views, named_items
from .sharding import Block, dtensor_block, dtensor_rank_world, is_dtensor

# Debug timings of push()'s Python side (the C++ side logs its own at debug level).
_log = logging.getLogger("ferry.sender")


@dataclass
class ReceiverOutcome:
    """One receiver's outcome of a push."""
    address: str
    committed: bool
    error: str
    bytes: int
    buckets: int
    seconds: float
    transport: str
    direct: bool = False  # straight into the receiver's parameters (not through staging slots)
    writer_fingerprints: bool = False  # the copies fingerprinted what they wrote
    reused_session: bool = False  # through the session kept from the previous push
    # A sharded push: the bytes each rank moved to this receiver (by rank) and the bytes of
    # every tensor once (what the receiver needed).
    rank_bytes: list = field(default_factory=list)
    needed_bytes: int = 0
    # The receiver read the tensors where they are and applied its plan from them (a plan that
    # is not one whole copy, over cuda_ipc): no staging copy.
    reads_in_place: bool = False


@dataclass
class PushReport:
    """The outcome of Sender.push, per receiver (in the order the receivers were given)."""
    version: int
    bytes: int  # payload bytes per receiver
    seconds: float
    receivers: list = field(default_factory=list)
    producer_wait_seconds: float = 0.0  # of `seconds`: waiting for the tensors' producers

    @property
    def all_committed(self):
        return bool(self.receivers) and all(r.committed for r in self.receivers)

    def __str__(self):
        lines = [f"version {self.version}: {self.bytes} bytes in {self.seconds:.3f} s"]
        for r in self.receivers:
            state = f"committed via {r.transport}" if r.committed else f"FAILED: {r.error}"
            lines.append(f"  {r.address}: {state}")
        return "\n".join(lines)


def _read_report(handle):
    c = lib()
    try:
        receivers = []
        for i in range(c.ferry_push_report_num_receivers(handle)):
            out = ReceiverResult()
            out.struct_size = struct_size(ReceiverResult)
            _raise_if(c.ferry_push_report_receiver(handle, i, ctypes.byref(out)))
            receivers.append(ReceiverOutcome(
                address=(out.address or b"").decode(), committed=bool(out.committed),
                error=(out.error or b"").decode("utf-8", "replace"), bytes=out.bytes,
                buckets=out.buckets, seconds=out.seconds,
                transport=(out.transport or b"").decode(), direct=bool(out.direct),
                writer_fingerprints=bool(out.writer_fingerprints),
                reused_session=bool(out.reused_session),
                rank_bytes=[out.rank_bytes[k] for k in range(out.num_ranks)],
                needed_bytes=out.needed_bytes,
                reads_in_place=bool(out.reads_in_place)))
        return PushReport(version=c.ferry_push_report_version(handle),
                          bytes=c.ferry_push_report_bytes(handle),
                          seconds=c.ferry_push_report_seconds(handle), receivers=receivers,
                          producer_wait_seconds=c.ferry_push_report_producer_wait_seconds(handle))
    finally:
        c.ferry_push_report_free(handle)


def _sharded_items(named_tensors, rank, world):
    """(name, tensor) pairs for the views, one Block or None per pair, and the rank and world
    (None, None: not a sharded push)."""
    pairs = named_items(named_tensors)
    sharded = rank is not None or world is not None
    if not sharded and all(type(item) is tuple and len(item) == 2 for item in pairs):
        # The usual push: no value is a block or a DTensor (one look at the values' types; a
        # MoE trainer pushes thousands of tensors every step).
        kinds = {type(value) for _, value in pairs}
        if not any(k.__name__ == "DTensor" or issubclass(k, Block) for k in kinds):
            return pairs, [None] * len(pairs), None, None
    items, blocks = [], []
    mesh_rank = None
    for item in pairs:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError(f"expected (name, tensor) pairs, got {type(item).__name__}")
        name, value = item
        if is_dtensor(value):
            sharded = True
            here = dtensor_rank_world(value)
            if mesh_rank is not None and here != mesh_rank:
                raise errors.InvalidArgumentError(
                    errors.INVALID_ARGUMENT,
                    f"tensor '{name}': its mesh puts this process at rank {here[0]} of "
                    f"{here[1]}, another tensor's at {mesh_rank[0]} of {mesh_rank[1]}")
            mesh_rank = here
            value = dtensor_block(name, value)
            if value is None:
                continue  # an empty shard: nothing held
        if isinstance(value, Block):
            sharded = True
            items.append((name, value.tensor))
            blocks.append(value)
        else:
            items.append((name, value))
            blocks.append(None)
    if not sharded:
        return items, blocks, None, None
    if rank is None or world is None:
        if mesh_rank is None:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                "a sharded push (ferry.sharding.Block) needs rank= and world=")
        rank = mesh_rank[0] if rank is None else rank
        world = mesh_rank[1] if world is None else world
    return items, blocks, int(rank), int(world)


def _block_structs(blocks):
    """The ferry_block_t pointers (NULL for a whole tensor) and what keeps them alive."""
    keep, pointers = [], []
    for b in blocks:
        if b is None:
            pointers.append(None)
            continue
        n = len(b.global_shape)
        shape = (ctypes.c_uint64 * max(1, n))(*b.global_shape)
        offsets = (ctypes.c_uint64 * max(1, n))(*b.offsets)
        s = _CBlock()
        s.struct_size = struct_size(_CBlock)
        s.global_shape = shape
        s.offsets = offsets
        s.replica = 1 if b.replica else 0
        keep += [shape, offsets, s]
        pointers.append(ctypes.addressof(s))
    array = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
    keep.append(array)
    return array, keep


class _BlockCache:
    """_block_structs of the last sharded push, reused while the blocks describe the same
    global coordinates (a trainer builds new Block objects of the same shards every step)."""

    def __init__(self):
        self._key = None
        self._value = None

    def structs(self, blocks):
        key = [None if b is None else (b.global_shape, b.offsets, b.replica) for b in blocks]
        if key != self._key:
            self._value = _block_structs(blocks)
            self._key = key
        return self._value


def _progress_mode(progress):
    """The config's `progress` for Sender(progress=...), and the callable to call, if any."""
    if callable(progress):
        return "never", progress
    if progress is True:
        return "auto", None
    if progress is False or progress is None:
        return "never", None
    if progress in ("auto", "terminal", "lines", "never"):
        return progress, None
    raise errors.InvalidArgumentError(
        errors.INVALID_ARGUMENT,
        f"progress={progress!r}: must be 'auto', 'terminal', 'lines', 'never', a bool or a "
        "callable(bytes_done, bytes_total)")


class _ProgressPoller:
    """Calls `callback(bytes_done, bytes_total)` from a thread about twice a second while a
    push runs, summed over the receivers (Sender.status()), and once when it ends."""

    def __init__(self, sender, callback, total):
        self._sender, self._callback, self._total = sender, callback, total
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ferry-progress", daemon=True)
        self._thread.start()

    def _done(self):
        done = sum(r.bytes for r in self._sender.status())
        return min(done, self._total) if self._total is not None else done

    def _run(self):
        while not self._stop.wait(0.5):
            self._callback(self._done(), self._total)

    def finish(self):
        self._stop.set()
        self._thread.join()
        self._callback(self._done(), self._total)


def _milliseconds(seconds, what):
    if seconds is None:
        return 0
    if seconds <= 0:
        raise errors.InvalidArgumentError(errors.INVALID_ARGUMENT,
                                          f"{what} must be positive seconds, got {seconds!r}")
    return max(1, int(round(seconds * 1000)))


def _token(token, token_file):
    """The bearer token: `token`, else the first line of `token_file` (refused when every user
    may read or write it), else FERRY_TOKEN; None: the config's receiver.token."""
    if token is not None:
        return token
    if token_file is not None:
        path = os.fspath(token_file)
        try:
            with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NONBLOCK)) as f:
                mode = os.fstat(f.fileno()).st_mode
                if not stat.S_ISREG(mode):
                    raise errors.InvalidArgumentError(
                        errors.INVALID_ARGUMENT, f"token file '{path}' is not a regular file")
                text = f.read(4097).decode()
        except OSError as e:
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT, f"token file '{path}': cannot open: {e.strerror}") from e
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"token file '{path}' can be read or written by every user "
                f"(mode {mode & 0o777:o}); chmod 600 it")
        value = text.strip()
        if not value or len(text) > 4096 or any(ord(c) < 0x20 or c == "\x7f" for c in value):
            raise errors.InvalidArgumentError(
                errors.INVALID_ARGUMENT,
                f"token file '{path}' must hold one line: the token (at most 4096 bytes)")
        return value
    return os.environ.get("FERRY_TOKEN") or None


class Sender(OwnedHandle):
    """Pushes named tensors to receivers, each given as the HOST:PORT its user knows (`ferry
    serve --port`, or an embedded Receiver's serve() port).

    `transport`: None (the config's `update.transport`, "auto" unless set), "auto" (per
    receiver, the first plugin of `update.transport_preference`, ["cuda_ipc", "ucx"] by default,
    whose capabilities fit: "cuda_ipc" for CUDA tensors and a receiver on this host in another
    process, else UCX when its plugin loads, else inline on the session socket), "cuda_ipc" (same
    host only; the receiver keeps its weights on a GPU; CUDA tensors are copied device to device),
    "ucx", "inline" or another transport plugin's name. Over cuda_ipc the sender writes each tensor
    straight into the receiver's parameters where the receiver offers it (`update__delivery`:
    "auto", "direct" or "staged"). `config` is a TOML file, `config_text` TOML
    text; every other keyword is a config override with `__` for the dots
    (`update__bucket_bytes=1 << 26`). Timeouts are seconds. The receivers' bearer token:
    `token`, else `token_file` (its first line; refused when every user may read it), else the
    environment variable FERRY_TOKEN, else the config's `receiver.token`.

    `progress`: how a push shows its progress on stderr. "terminal" (the default): one line
    redrawn in place when stderr is a terminal, nothing otherwise (a trainer's log stays
    quiet); "auto" (or True): in place on a terminal, else a line every `progress_interval_ms`
    (5000); "lines": those lines always; "never" (or False): nothing. A callable is called as
    `progress(bytes_done, bytes_total)` (summed over the receivers) from a helper thread about
    twice a second during each push and once at its end, and nothing is printed.

    Threading: one push at a time; abort() and status() may be called from other threads.
    """

    _closed_what = "the sender"

    def __init__(self, receivers, transport=None, config=None, *, config_text=None,
                 bucket_bytes=0, token=None, token_file=None, connect_timeout=None,
                 bucket_timeout=None, commit_timeout=None, **overrides):
        if isinstance(receivers, str):
            receivers = [r for r in receivers.split(",") if r]
        self.receivers = [str(r) for r in receivers]
        self._handle = None
        self._exports = ExportCache()
        self._blocks = _BlockCache()
        mode, self._progress = _progress_mode(overrides.pop("progress", "terminal"))
        overrides["progress"] = mode
        source, keep = config_source(config, config_text,
                                     {override_key(k): v for k, v in overrides.items()})
        addresses = [r.encode() for r in self.receivers]
        array = (ctypes.c_char_p * max(1, len(addresses)))(*addresses)
        args = SenderCreateArgs()
        args.struct_size = struct_size(SenderCreateArgs)
        args.config = ctypes.pointer(source) if source is not None else None
        args.receivers = array
        args.num_receivers = len(addresses)
        args.transport = transport.encode() if transport else None
        args.bucket_bytes = int(bucket_bytes)
        token = _token(token, token_file)
        args.token = token.encode() if token is not None else None
        args.connect_timeout_ms = _milliseconds(connect_timeout, "connect_timeout")
        args.bucket_timeout_ms = _milliseconds(bucket_timeout, "bucket_timeout")
        args.commit_timeout_ms = _milliseconds(commit_timeout, "commit_timeout")
        handle = ctypes.c_void_p()
        _raise_if(lib().ferry_sender_create(ctypes.byref(args), ctypes.byref(handle)))
        del keep
        self._handle = handle

    def push(self, named_tensors, version, label=None, check=True, stream=None, *, rank=None,
             world=None):
        """Pushes `named_tensors` (a mapping such as a state_dict, or (name, tensor) pairs) as
        update `version`; each receiver commits it or keeps its previous version. Tensors are
        read in place and must not change until push returns. Returns a PushReport; raises
        ferry.PushError (carrying the report) when a receiver did not commit and
        `check` is true, and ferry.InvalidArgumentError for bad tensors.

        Call it right after the optimizer step, with no synchronisation: nothing is read before
        the work queued on the tensors is done. By default that is the DLPack stream protocol
        (for PyTorch tensors: torch's current stream of each device). `stream` names the
        producer's CUDA stream(s) instead (a torch.cuda.Stream, a cudaStream_t int, or a list),
        or "none" when the caller synchronised itself.

        Sharded trainers (docs/sharded.md): each rank pushes what it holds, as blocks of the
        global tensors: torch DTensors (Shard(d) / Replicate placements: rank and world come from
        their mesh) or ferry.sharding.Block(tensor, global_shape, offsets) with `rank` and
        `world` given. Each receiver commits the version once every rank's blocks arrived and
        tile every tensor exactly once; the report's receivers carry `rank_bytes` (bytes moved
        per rank) and `needed_bytes`."""
        self._require_open()
        t_call = time.perf_counter()
        items, blocks, rank, world = _sharded_items(named_tensors, rank, world)
        producers = Producers(stream)
        plain = self._exports.views(items, producers)
        with (contextlib.nullcontext() if plain is not None else
              Views(items, writable=False, producers=producers)) as views:
            pointers = plain.array if plain is not None else views.pointers()
            t_exported = time.perf_counter()
            args = PushArgs()
            args.struct_size = struct_size(PushArgs)
            args.tensors = pointers
            args.num_tensors = len(items)
            args.version = int(version)
            args.label = label.encode() if label is not None else None
            keep_handles = producers.fill(args)  # noqa: F841 (alive during the call)
            report = ctypes.c_void_p()
            poller = None
            if self._progress is not None:
                sizes = [getattr(t, "nbytes", None) for _, t in items]
                total = None if None in sizes else sum(sizes) * len(self.receivers)
                poller = _ProgressPoller(self, self._progress, total)
            try:
                if world is None:
                    _raise_if(lib().ferry_sender_push(self._handle, ctypes.byref(args),
                                                      ctypes.byref(report)))
                else:
                    structs, keep = self._blocks.structs(blocks)
                    sharded = ShardedPushArgs()
                    sharded.struct_size = struct_size(ShardedPushArgs)
                    sharded.push = ctypes.pointer(args)
                    sharded.rank = rank
                    sharded.world = world
                    sharded.blocks = structs
                    _raise_if(lib().ferry_sender_push_sharded(
                        self._handle, ctypes.byref(sharded), ctypes.byref(report)))
                    del keep
            finally:
                t_returned = time.perf_counter()
                if poller is not None:
                    poller.finish()
        t_released = time.perf_counter()
        result = _read_report(report)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("push of version %d: %d tensors exported in %.3f ms (%s), "
                       "ferry_sender_push %.3f ms, views released in %.3f ms, report read in "
                       "%.3f ms", int(version), len(items), (t_exported - t_call) * 1e3,
                       "plain views" if plain is not None else "DLPack",
                       (t_returned - t_exported) * 1e3, (t_released - t_returned) * 1e3,
                       (time.perf_counter() - t_released) * 1e3)
        if check and not result.all_committed:
            raise errors.PushError(result)
        return result

    def status(self):
        """The per-receiver state of the last (or the running) push: ReceiverOutcome list."""
        self._require_open()
        report = ctypes.c_void_p()
        _raise_if(lib().ferry_sender_status(self._handle, ctypes.byref(report)))
        return _read_report(report).receivers

    def abort(self, reason=None):
        """Makes a running push fail every receiver that has not committed (any thread)."""
        self._require_open()
        _raise_if(lib().ferry_sender_abort(self._handle, reason.encode() if reason else None))

    def close(self):
        if self._handle:
            lib().ferry_sender_destroy(self._handle)
            self._handle = None


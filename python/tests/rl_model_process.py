"""python/tests/rl_model_process.py: one side of test_real_model_rl.py, run as its own process on
cuda:0 with a small Hugging Face Qwen3 model (dense Qwen3ForCausalLM or MoE Qwen3MoeForCausalLM,
built from a config, random init from SEED, bf16, eval mode, eager attention):

  rollout  the inference engine: ferry.Receiver() with the defaults (receiver.device not set;
           only update.delivery, when not "auto"), the model's named_parameters() registered and
           their data_ptrs recorded, serving on a free port
  trainer  the RL trainer: AdamW steps, each followed AT ONCE (no torch.cuda.synchronize) by
           ferry.Sender.push(model.state_dict(), version=step) into the rollout, through one
           Sender kept across steps. Before each optimizer.step() it queues torch.cuda._sleep on
           torch's current stream, so that the optimizer's writes land tens of ms after step()
           returned: a push that does not order itself after that stream reads stale weights.

Commands on stdin, one JSON line on stdout per command (other stdout lines are noise):
  logits PATH   torch.save({"logits": ..., "state": {name: tensor}}) of the fixed input's logits
                and of every parameter (CPU copies) to PATH. The rollout answers
                {"version": n, "pointers_unchanged": bool, "moved": [names]}, the trainer {}.
  step N PATH   (trainer) one training step, the push as version N, then what "logits PATH" does;
                answers with the push report (committed, transport, direct, reused_session, ...).
  lend          (rollout) the engine lends its GPU memory for a training step, as a colocated
                engine does every step: tells ferry (receiver.release("weights")), frees a
                KV-cache-sized buffer and overwrites every parameter with zeros (what an
                allocator's new memory holds), then takes a new KV cache and tells ferry
                (receiver.resume("weights")), which writes the weights back from its host
                mirror; answers {"restored": bool, "health": state}. With `vmm` the parameters
                live in the rollout's own VMM arena (torch_memory_saver style) and the lend
                unmaps and releases its physical memory instead of zeroing (answering also
                how much device memory that freed) and maps new memory at the same addresses.
  quit          (or end of stdin) exits 0.
  connect HOST:PORT  (trainer) creates the ferry.Sender to the rollout (kept for every step).

A rollout started with `tp=R/S` is tensor-parallel rank R of S of a dense engine: it registers
only its slices of the model's parameters (tp_slice: the dense family's split, layout "hf") and
runs no forward pass (its snapshot's logits are empty). `connect` takes several comma-separated
receivers, and the step's answer lists every receiver's outcome under "receivers".
A trainer started with `rank=R/S` is rank R of a sharded trainer of S ranks (FSDP style): every
rank trains the same model on the same batches, and pushes only its dim-0 rows of every tensor
(rows [R*ceil(n/S), ...), ferry.sharding.Block views into the parameters the optimizer writes)
with push(..., rank=R, world=S); its snapshot holds its whole state, its answer also
`rows` {name: [first, end)} and the rank_bytes / needed_bytes of the report.
The first line is {"ready": ...}; a failure answers {"failure": "..."} (and exits 1 at startup).

Usage: rl_model_process.py rollout|trainer dense|moe auto|direct|staged SEED [vmm|rank=R/S|tp=R/S]
"""

import contextlib
import ctypes
import json
import os
import sys
import time
import traceback

# cuda:0 always in the test; FERRY_RL_DEVICE=cpu checks this script itself without a GPU.
DEVICE = os.environ.get("FERRY_RL_DEVICE", "cuda:0")

# A fixed input both sides compute logits for, and the training batches' shape.
BATCH, SEQ = 2, 16
VOCAB = 4096
LR = 1e-2  # large enough that bf16 weights near 1.0 (the norms) change on every step too
DELAY_CYCLES = 50_000_000  # torch.cuda._sleep before optimizer.step(): ~25 ms on an H200
KV_CACHE_BYTES = 256 << 20  # the rollout's stand-in KV cache, freed and taken back by "lend"


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def model_config(transformers, family):
    common = dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                  tie_word_embeddings=False, use_cache=False, attn_implementation="eager")
    if family == "dense":
        return transformers.Qwen3Config(head_dim=64, **common), transformers.Qwen3ForCausalLM
    return (transformers.Qwen3MoeConfig(moe_intermediate_size=256, num_experts=8,
                                        num_experts_per_tok=2, norm_topk_prob=True,
                                        decoder_sparse_step=1, mlp_only_layers=[],
                                        experts_implementation="eager", **common),
            transformers.Qwen3MoeForCausalLM)


def build_model(torch, transformers, family, seed):
    config, cls = model_config(transformers, family)
    torch.manual_seed(seed)
    device = torch.device(DEVICE)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with device if hasattr(device, "__enter__") else contextlib.nullcontext():
            model = cls(config)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    # Random init from the seed; anything the model left uninitialized (or not finite) is drawn
    # here, so that both sides start from finite weights that differ.
    gen = torch.Generator(device=device).manual_seed(seed + 7)
    redrawn = 0
    with torch.no_grad():
        for p in model.parameters():
            if not bool(torch.isfinite(p).all()):
                p.normal_(0.0, 0.02, generator=gen)
                redrawn += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return model, config, redrawn


def fixed_input(torch):
    return (torch.arange(BATCH * SEQ, device=DEVICE).reshape(BATCH, SEQ) * 37 + 11) % VOCAB


def logits_of(torch, model, tokens):
    with torch.no_grad():
        return model(input_ids=tokens, use_cache=False).logits


def save_snapshot(torch, path, logits, named):
    torch.save({"logits": logits.detach().cpu(),
                "state": {name: t.detach().cpu() for name, t in named}}, path)


def describe(model, config, redrawn):
    params = list(model.named_parameters())
    return {"tensors": len(params), "bytes": sum(p.numel() * p.element_size() for _, p in params),
            "experts": getattr(config, "num_experts", None), "redrawn": redrawn,
            "dtypes": sorted({str(p.dtype) for _, p in params})}


class VmmArena:
    """An engine allocator of the torch_memory_saver kind, through the CUDA driver (ctypes): one
    reserved address range over `chunks` physical allocations (cuMemCreate, exportable as POSIX
    fds, cuMemMap, cuMemSetAccess). unmap() unmaps and releases the physical memory (the
    addresses stay reserved); map() creates new physical memory at the same addresses."""

    class _Prop(ctypes.Structure):  # CUmemAllocationProp
        _fields_ = [("type", ctypes.c_int), ("requested_handle_types", ctypes.c_int),
                    ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                    ("win32_metadata", ctypes.c_void_p), ("compression_type", ctypes.c_ubyte),
                    ("gpu_direct_rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                    ("reserved", ctypes.c_ubyte * 4)]

    class _Access(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                    ("flags", ctypes.c_int)]

    def __init__(self, torch, nbytes, chunks=4):
        self.torch = torch
        self.cu = ctypes.CDLL("libcuda.so.1")
        device = torch.cuda.current_device()
        # Pinned device memory of this GPU, exportable as a POSIX fd.
        self.prop = self._Prop(type=1, requested_handle_types=1, location_type=1,
                               location_id=device)
        self.access = self._Access(location_type=1, location_id=device, flags=3)
        granularity = ctypes.c_size_t()
        self._check(self.cu.cuMemGetAllocationGranularity(
            ctypes.byref(granularity), ctypes.byref(self.prop), ctypes.c_int(0)),
            "cuMemGetAllocationGranularity")
        g = granularity.value
        self.chunk = -(-nbytes // chunks // g) * g
        self.size = self.chunk * chunks
        self.va = ctypes.c_uint64()
        self._check(self.cu.cuMemAddressReserve(ctypes.byref(self.va), ctypes.c_size_t(self.size),
                                                ctypes.c_size_t(0), ctypes.c_uint64(0),
                                                ctypes.c_uint64(0)), "cuMemAddressReserve")
        self.handles = []
        self.map()

    @staticmethod
    def _check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def map(self):
        for i in range(self.size // self.chunk):
            h = ctypes.c_uint64()
            self._check(self.cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(self.chunk),
                                            ctypes.byref(self.prop), ctypes.c_uint64(0)),
                        "cuMemCreate")
            self._check(self.cu.cuMemMap(ctypes.c_uint64(self.va.value + i * self.chunk),
                                         ctypes.c_size_t(self.chunk), ctypes.c_size_t(0), h,
                                         ctypes.c_uint64(0)), "cuMemMap")
            self.handles.append(h)
        self._check(self.cu.cuMemSetAccess(ctypes.c_uint64(self.va.value),
                                           ctypes.c_size_t(self.size), ctypes.byref(self.access),
                                           ctypes.c_size_t(1)), "cuMemSetAccess")

    def unmap(self):
        self.torch.cuda.synchronize()
        self._check(self.cu.cuMemUnmap(ctypes.c_uint64(self.va.value), ctypes.c_size_t(self.size)),
                    "cuMemUnmap")
        for h in self.handles:
            self._check(self.cu.cuMemRelease(h), "cuMemRelease")
        self.handles = []

    def tensor(self, offset, nbytes):
        """A uint8 tensor over [offset, offset + nbytes) of the arena (not owning it)."""
        class Window:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                        "data": (self.va.value + offset, False), "version": 3}
        return self.torch.as_tensor(Window(), device="cuda")


def move_into_arena(torch, model):
    """Moves every parameter's data into a new VmmArena (each at a 512-byte aligned offset);
    returns the arena."""
    params = list(model.parameters())
    sizes = [p.numel() * p.element_size() for p in params]
    offsets, total = [], 0
    for n in sizes:
        offsets.append(total)
        total += -(-n // 512) * 512
    arena = VmmArena(torch, total)
    with torch.no_grad():
        for p, offset, n in zip(params, offsets, sizes):
            view = arena.tensor(offset, n).view(p.dtype).view(p.shape)
            view.copy_(p.data)
            p.data = view
    torch.cuda.synchronize()
    return arena


# The dense family's tensor-parallel split of a checkpoint tensor (layout "hf"): column-parallel
# projections and the vocabulary along dim 0, row-parallel ones along dim 1, the rest whole.
TP_DIM0 = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight",
           "up_proj.weight", "embed_tokens.weight", "lm_head.weight")
TP_DIM1 = ("o_proj.weight", "down_proj.weight")


def tp_slice(name, t, rank, world):
    """Tensor-parallel rank `rank` of `world`'s part of checkpoint tensor `name` (a view)."""
    dim = 0 if name.endswith(TP_DIM0) else 1 if name.endswith(TP_DIM1) else None
    if dim is None:
        return t
    n = t.shape[dim] // world
    return t.narrow(dim, rank * n, n)


def rollout(torch, transformers, ferry, family, delivery, seed, vmm=False, tp=None):
    model, config, redrawn = build_model(torch, transformers, family, seed)
    arena = move_into_arena(torch, model) if vmm else None
    overrides = {} if delivery == "auto" else {"update__delivery": delivery}
    if tp is None:
        named = list(model.named_parameters())
    else:
        # One tensor-parallel rank: the engine holds its slices only (no forward pass).
        overrides.update(receiver__model_family="dense", receiver__layout="hf",
                         receiver__tp_rank=tp[0], receiver__tp_size=tp[1])
        with torch.no_grad():
            named = [(n, tp_slice(n, p, *tp).clone()) for n, p in model.named_parameters()]
        del model
        model = None
    receiver = ferry.Receiver(**overrides)
    receiver.register(named)
    pointers = {name: p.data_ptr() for name, p in named}
    port = receiver.serve(port=0)
    tokens = fixed_input(torch)
    kv_cache = [torch.empty(KV_CACHE_BYTES, dtype=torch.uint8, device=DEVICE)]
    say({"ready": True, "port": port, "names": sorted(pointers),
         **({"dtypes": sorted({str(p.dtype) for _, p in named})} if model is None
            else describe(model, config, redrawn))})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            if words[0] == "lend":
                before = {n: p.detach().clone() for n, p in named}
                receiver.release("weights")
                kv_cache.clear()
                if DEVICE.startswith("cuda"):
                    torch.cuda.empty_cache()
                freed = None
                if arena is not None:
                    free_before = torch.cuda.mem_get_info()[0]
                    arena.unmap()  # the physical memory goes; the addresses stay reserved
                    freed = torch.cuda.mem_get_info()[0] - free_before
                    arena.map()  # new physical memory at the same addresses
                else:
                    with torch.no_grad():
                        for _, p in named:
                            p.zero_()
                kv_cache.append(torch.empty(KV_CACHE_BYTES, dtype=torch.uint8, device=DEVICE))
                receiver.resume("weights")
                restored = all(torch.equal(p.detach(), before[n]) for n, p in named)
                say({"restored": restored, "health": receiver.health().state,
                     "freed_bytes": freed, "arena_bytes": arena.size if arena else None})
            elif words[0] == "logits":
                logits = torch.empty(0) if model is None else logits_of(torch, model, tokens)
                save_snapshot(torch, words[1], logits, named)
                moved = [n for n, p in named if p.data_ptr() != pointers[n]]
                v = receiver.version
                say({"version": v.number, "label": v.label, "pointers_unchanged": not moved,
                     "moved": moved[:5], "health": receiver.health().state})
            else:
                say({"failure": f"unknown command {words[0]!r}"})
        except Exception as e:  # answer, so that the test shows it instead of timing out
            say({"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    receiver.close()
    return 0


def delay(torch):
    """Queues GPU work on torch's current stream that keeps it busy for tens of ms."""
    if not DEVICE.startswith("cuda"):
        return
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(DELAY_CYCLES)
        return
    a = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    for _ in range(40):
        a = a @ a * 1e-3


def row_blocks(ferry, state, rank, world):
    """Rank `rank` of `world`'s dim-0 rows of every tensor (FSDP's even split: ceil(n / world)
    rows a rank, the last ranks' blocks shorter or empty) as ferry.sharding.Block views, and
    {name: [first, end)}."""
    blocks, rows = {}, {}
    for name, t in state.items():
        n = t.shape[0]
        per = -(-n // world)
        first, end = min(rank * per, n), min((rank + 1) * per, n)
        blocks[name] = ferry.sharding.Block(t[first:end], tuple(t.shape),
                                            (first,) + (0,) * (t.dim() - 1))
        rows[name] = [first, end]
    return blocks, rows


def trainer(torch, transformers, ferry, family, delivery, seed, shard=None):
    model, config, redrawn = build_model(torch, transformers, family, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    overrides = {} if delivery == "auto" else {"update__delivery": delivery}
    sender = None
    tokens = fixed_input(torch)
    say({"ready": True, **describe(model, config, redrawn),
         "names": sorted(model.state_dict().keys()),
         "sleep": "torch.cuda._sleep" if hasattr(torch.cuda, "_sleep") else "matmuls"})
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            if words[0] == "connect":
                sender = ferry.Sender(words[1].split(","), **overrides)
                say({"connected": words[1]})
            elif words[0] == "logits":
                save_snapshot(torch, words[1], logits_of(torch, model, tokens),
                              model.state_dict().items())
                say({})
            elif words[0] == "step":
                step, path = int(words[1]), words[2]
                gen = torch.Generator(device=DEVICE).manual_seed(1000 + step)
                batch = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen, device=DEVICE)
                logits = model(input_ids=batch, use_cache=False).logits
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                    batch[:, 1:].reshape(-1))
                loss.backward()
                delay(torch)  # the optimizer's kernels now wait behind tens of ms of GPU work
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                t0 = time.perf_counter()
                rows = None
                if shard is None:
                    report = sender.push(model.state_dict(), version=step, check=False)  # no sync
                else:
                    blocks, rows = row_blocks(ferry, model.state_dict(), *shard)
                    report = sender.push(blocks, version=step, check=False, rank=shard[0],
                                         world=shard[1])
                wall = time.perf_counter() - t0
                save_snapshot(torch, path, logits_of(torch, model, tokens),
                              model.state_dict().items())
                r = report.receivers[0] if report.receivers else None
                say({"version": report.version, "bytes": report.bytes, "wall_s": wall,
                     "loss": float(loss),
                     "committed": bool(r and r.committed), "error": r.error if r else "no receiver",
                     "transport": r.transport if r else "", "direct": bool(r and r.direct),
                     "reused_session": bool(r and r.reused_session),
                     "writer_fingerprints": bool(r and r.writer_fingerprints),
                     "seconds": r.seconds if r else 0.0,
                     "producer_wait_s": getattr(report, "producer_wait_seconds", None),
                     "rows": rows, "rank_bytes": list(r.rank_bytes) if r else [],
                     "needed_bytes": r.needed_bytes if r else 0,
                     "receivers": [{"committed": bool(x.committed), "error": x.error,
                                    "transport": x.transport, "direct": bool(x.direct),
                                    "reads_in_place": bool(x.reads_in_place),
                                    "reused_session": bool(x.reused_session),
                                    "rank_bytes": list(x.rank_bytes),
                                    "needed_bytes": x.needed_bytes}
                                   for x in report.receivers]})
            else:
                say({"failure": f"unknown command {words[0]!r}"})
        except Exception as e:
            say({"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
    if sender is not None:
        sender.close()
    return 0


def main():
    role, family, delivery, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    vmm = sys.argv[5:] == ["vmm"]
    shard = tp = None
    for word, prefix in ((w, p) for w in sys.argv[5:] for p in ("rank=", "tp=")):
        if word.startswith(prefix):
            rank, world = word[len(prefix):].split("/")
            if prefix == "rank=":
                shard = (int(rank), int(world))
            else:
                tp = (int(rank), int(world))
    try:
        import torch
        import transformers

        import ferry
        # Both sides must compute bit-identical logits from identical weights.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if role == "rollout":
            return rollout(torch, transformers, ferry, family, delivery, seed, vmm, tp)
        return trainer(torch, transformers, ferry, family, delivery, seed, shard)
    except Exception as e:
        say({"failure": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        return 1


if __name__ == "__main__":
    sys.exit(main())

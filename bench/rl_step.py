#!/usr/bin/env python3
"""bench/rl_step.py: the colocated RL step as users run it, timed case by case: the rollout
engine lends its GPU for the training step, takes it back, and the trainer pushes the weights its
optimizer step just wrote ([one-pass] item 3).

Run by `ferry bench rl-step` as a child process (or by hand); prints exactly one JSON object on
stdout, as its last line (the protocol of bench/embedded_push.py):

  {"ok": true, ...numbers...}                 the bench ran (see "verified")
  {"ok": false, "unavailable": "<reason>"}    torch, CUDA, ferry or the ferry executable is
                                              missing; exit 3
  {"ok": false, "error": "<reason>"}          the run failed; exit 1

Two kinds of process on one device: this one is the trainer, holding the checkpoint's tensors
(Hugging Face names, bf16, values a function of the element's index: no download); the rollout
engine is one `ferry serve` per rank (the engine's layout made by its model family). Cases:

  dense     Qwen3-8B dims (--layers, default 36: 16.4 GB), family dense (fused q/k/v and
            gate/up, as SGLang holds them)
  moe       Qwen3-30B-A3B dims (hidden 2048, 128 experts of intermediate 768, --layers default
            12: 16.2 GB; 48 is the whole model, ~61 GB), one tensor per expert as a trainer's
            state dict names them, family moe (experts stacked into w13 / w2)
  moe-fp8   the same MoE into family lowbit: every linear weight FP8 e4m3 with 128x128 block
            scales, quantised on arrival
  tp2       the dense model into two engine ranks (tp_size 2): column slices, row slices

One step, --steps times: every engine releases its memory (POST /release_memory_occupation),
the trainer's step allocates, writes and frees --train-gib of device memory, every engine resumes;
then the trainer's "optimizer step" (one foreach add over every tensor: its last kernels write
every weight) and, with no synchronize, the push through one ferry.Sender kept across steps
(update.delivery auto). Timed per step: push (call to return: every engine committed) and
ready (from the later of the call and the optimizer's kernels done, to the return). The first
push (it opens the sessions and makes the engines' layouts) is reported apart.

Verified, every step: a second Sender pushes the same values staged (update.delivery = staged:
the path the CPU twins prove) as the next version; every engine's /get_fingerprints of the timed
version must equal that of the staged one, and differ from the step before.

The ceiling, in the same run: the device copy of the bytes the engines write (a flat copy_ of
the model's bytes, CUDA events, scaled to the bytes written). For moe-fp8 the kernel reads bf16
and writes FP8 plus scales: its roofline is that copy scaled to (bytes read + bytes written) / 2.

The baseline, same run, after ferry's steps (--baseline-steps, 0 for none): torch's flattened-
bucket CUDA IPC as slime and verl drive SGLang: per bucket (--bucket-mib) torch.cat of its
tensors on the trainer, the bucket's IPC handle pickled to each engine process (this script,
--role torch-engine, holding the same layout in torch), which rebuilds it and loads each tensor
with torch ops: copy_ into its slice of a fused or stacked parameter, narrow() for its TP
slice, and for moe-fp8 a blockwise amax, divide and cast to float8_e4m3fn. No lend (torch has no
release of its own); timed from the first torch.cat to the last engine's answer.

With --device cpu the same flow runs on host tensors of tiny models (a check of this script on a
machine without a GPU; host transport; the fp8 baseline needs torch's float8_e4m3fn).

Usage: rl_step.py [--cases dense,moe,moe-fp8,tp2] [--layers 0] [--steps 5] [--train-gib 8]
                  [--baseline-steps 3] [--bucket-mib 512] [--ferry PATH] [--device cuda|cpu]
                  [--log-dir DIR] [--no-table]
"""

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embedded_push as common  # noqa: E402  (the child protocol, events, D2D, flat buckets)
import sharded_push as sharded  # noqa: E402  (ferry serve, the value fill)

TARGET = 0.70  # [one-pass]: every case, every step, >= 0.7 of D2D (FP8: of its roofline)
TORCH_TARGET = 3.0  # ... and >= 3x torch's flattened-bucket IPC
CASES = ("dense", "moe", "moe-fp8", "tp2")
# Cases run only when named: the tp2 model and engines, the trainer pushing as rank 0 of a
# 1-rank sharded update (push(rank=0, world=1)): each engine rank is sent only its pieces.
VARIANTS = {"tp2-pieces": "tp2"}
BLOCK = 128  # FP8 block edge (models/lowbit)


def note(text):
    sys.stderr.write("rl_step: %s\n" % text)
    sys.stderr.flush()


def unavailable(reason):
    sys.stderr.write("rl_step: unavailable: %s\n" % reason)
    common.emit({"ok": False, "unavailable": reason}, 3)


# ---- the models --------------------------------------------------------------------------------

def dims(case, device):
    """The case's model dimensions (tiny on the CPU)."""
    if case in ("dense", "tp2"):
        if device == "cpu":
            return dict(vocab=4096, hidden=256, inter=768, heads=4, kv=2, hd=64, experts=0)
        return dict(vocab=151936, hidden=4096, inter=12288, heads=32, kv=8, hd=128, experts=0)
    if device == "cpu":
        return dict(vocab=4096, hidden=256, inter=128, heads=4, kv=2, hd=64, experts=8)
    return dict(vocab=151936, hidden=2048, inter=768, heads=32, kv=4, hd=128, experts=128)


def default_layers(case, device):
    if device == "cpu":
        return 1
    return 36 if case in ("dense", "tp2") else 12


def checkpoint_shapes(case, layers, device):
    """[(name, shape)] of the trainer's tensors (Hugging Face names)."""
    d = dims(case, device)
    h, hd = d["hidden"], d["hd"]
    out = [("model.embed_tokens.weight", (d["vocab"], h))]
    for i in range(layers):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (d["heads"] * hd, h)),
                (p + "self_attn.k_proj.weight", (d["kv"] * hd, h)),
                (p + "self_attn.v_proj.weight", (d["kv"] * hd, h)),
                (p + "self_attn.o_proj.weight", (h, d["heads"] * hd)),
                (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)),
                (p + "post_attention_layernorm.weight", (h,))]
        if d["experts"]:
            out.append((p + "mlp.gate.weight", (d["experts"], h)))
            for e in range(d["experts"]):
                q = p + "mlp.experts.%d." % e
                out += [(q + "gate_proj.weight", (d["inter"], h)),
                        (q + "up_proj.weight", (d["inter"], h)),
                        (q + "down_proj.weight", (h, d["inter"]))]
        else:
            out += [(p + "mlp.gate_proj.weight", (d["inter"], h)),
                    (p + "mlp.up_proj.weight", (d["inter"], h)),
                    (p + "mlp.down_proj.weight", (h, d["inter"]))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (d["vocab"], h))]
    return out


def numel(shape):
    n = 1
    for x in shape:
        n *= x
    return n


def quantised(case, name):
    """Whether family lowbit stores this checkpoint tensor as FP8 (its default `unquantized`:
    norms, embeddings, lm_head, the router)."""
    if case != "moe-fp8" or not name.endswith(".weight"):
        return False
    return not any(s in name for s in ("norm", "embed_tokens", "lm_head", "mlp.gate.weight"))


def bytes_written(case, shapes):
    """What the engines write per update: bf16 where a tensor stays bf16, else one byte per
    element plus a float32 scale per 128x128 block."""
    total = 0
    for name, shape in shapes:
        if quantised(case, name):
            rows, cols = shape
            total += numel(shape) + 4 * (-(-rows // BLOCK)) * (-(-cols // BLOCK))
        else:
            total += 2 * numel(shape)
    return total


# ---- the torch baseline's engine (a child process) ---------------------------------------------

class Layout:
    """The engine's parameters in torch (fused q/k/v and gate/up, stacked experts, this TP rank's
    slices, FP8 weights with their scales) and, per checkpoint name, how a tensor is loaded."""

    def __init__(self, torch, case, layers, rank, world, device):
        self.torch = torch
        self.fp8 = case == "moe-fp8"
        self.params = {}
        self.loads = {}
        d = dims(case, device)
        h, hd, dev = d["hidden"], d["hd"], device
        q_rows, kv_rows = d["heads"] * hd, d["kv"] * hd

        def param(name, shape, fp8):
            dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
            t = torch.empty(shape, dtype=dtype, device=dev)
            self.params[name] = t
            if not fp8:
                return t, None
            s = torch.empty(shape[:-2] + (-(-shape[-2] // BLOCK), -(-shape[-1] // BLOCK)),
                            dtype=torch.float32, device=dev)
            self.params[name + "_scale_inv"] = s
            return t, s

        def part(ckpt, dst, scale, row0, rows, dim=None):
            """ckpt's slice [rank] along dim (None: whole) into dst rows [row0, row0 + rows)."""
            def load(t):
                if dim is not None:
                    n = t.shape[dim] // world
                    t = t.narrow(dim, rank * n, n)
                if scale is None:
                    dst[row0:row0 + rows].copy_(t)
                else:
                    q, s = self.quantise(t)
                    dst[row0:row0 + rows].copy_(q)
                    scale[row0 // BLOCK:(row0 + rows) // BLOCK].copy_(s)
            self.loads[ckpt] = load

        vocab_rows = d["vocab"] // world
        t, _ = param("model.embed_tokens.weight", (vocab_rows, h), False)
        part("model.embed_tokens.weight", t, None, 0, vocab_rows, 0 if world > 1 else None)
        for i in range(layers):
            p = "model.layers.%d." % i
            for norm, n in (("input_layernorm.weight", h), ("post_attention_layernorm.weight", h),
                            ("self_attn.q_norm.weight", hd), ("self_attn.k_norm.weight", hd)):
                t, _ = param(p + norm, (n,), False)
                part(p + norm, t, None, 0, n)
            qr, kr = q_rows // world, kv_rows // world
            t, s = param(p + "self_attn.qkv_proj.weight", (qr + 2 * kr, h), self.fp8)
            split = 0 if world > 1 else None
            part(p + "self_attn.q_proj.weight", t, s, 0, qr, split)
            part(p + "self_attn.k_proj.weight", t, s, qr, kr, split)
            part(p + "self_attn.v_proj.weight", t, s, qr + kr, kr, split)
            t, s = param(p + "self_attn.o_proj.weight", (h, q_rows // world), self.fp8)
            part(p + "self_attn.o_proj.weight", t, s, 0, h, 1 if world > 1 else None)
            if d["experts"]:
                t, _ = param(p + "mlp.gate.weight", (d["experts"], h), False)
                part(p + "mlp.gate.weight", t, None, 0, d["experts"])
                w13, s13 = param(p + "mlp.experts.w13_weight", (d["experts"], 2 * d["inter"], h),
                                 self.fp8)
                w2, s2 = param(p + "mlp.experts.w2_weight", (d["experts"], h, d["inter"]),
                               self.fp8)
                for e in range(d["experts"]):
                    q = p + "mlp.experts.%d." % e
                    sel = (lambda x, e=e: None if x is None else x[e])
                    part(q + "gate_proj.weight", w13[e], sel(s13), 0, d["inter"])
                    part(q + "up_proj.weight", w13[e], sel(s13), d["inter"], d["inter"])
                    part(q + "down_proj.weight", w2[e], sel(s2), 0, h)
            else:
                ir = d["inter"] // world
                t, _ = param(p + "mlp.gate_up_proj.weight", (2 * ir, h), False)
                part(p + "mlp.gate_proj.weight", t, None, 0, ir, split)
                part(p + "mlp.up_proj.weight", t, None, ir, ir, split)
                t, _ = param(p + "mlp.down_proj.weight", (h, ir), False)
                part(p + "mlp.down_proj.weight", t, None, 0, h, 1 if world > 1 else None)
        t, _ = param("model.norm.weight", (h,), False)
        part("model.norm.weight", t, None, 0, h)
        t, _ = param("lm_head.weight", (vocab_rows, h), False)
        part("lm_head.weight", t, None, 0, vocab_rows, 0 if world > 1 else None)

    def quantise(self, x):
        """128x128 blockwise FP8 e4m3 as torch code writes it: scale = amax / 448."""
        torch = self.torch
        rows, cols = x.shape
        blocks = x.float().view(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK)
        scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-4) / 448.0
        q = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        return q.view(rows, cols), scale


def torch_engine_main(args):
    import base64
    import torch
    import torch.multiprocessing  # noqa: F401  (registers torch's reductions)
    from multiprocessing.reduction import ForkingPickler
    common.flattened_metadata_class()
    device = sharded.device_of(args)
    layout = Layout(torch, args.case, args.layers, args.rank, args.world, device)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        words = line.split(" ", 1)
        if not words or words[0].strip() == "quit":
            break
        try:
            payload = ForkingPickler.loads(base64.b64decode(words[1]))
            flat = payload["flattened_tensor"]
            with torch.no_grad():
                for m in payload["metadata"]:
                    layout.loads[m.name](flat[m.start_idx:m.end_idx].view(m.dtype).view(m.shape))
            common.sync(torch, args.device)
            del payload, flat
            print(json.dumps({"loaded": True}), flush=True)
        except Exception as e:
            print(json.dumps({"failure": "%s: %s" % (type(e).__name__, e)}), flush=True)
    return 0


# ---- the trainer (this process) ----------------------------------------------------------------

def post(address, route):
    import urllib.request
    req = urllib.request.Request("http://%s/%s" % (address, route), data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        if r.status != 200:
            raise RuntimeError("ferry serve %s: %s answered %d" % (address, route, r.status))


def optimizer_step(torch, tensors, step):
    """The training step's last kernels: every weight written (on torch's current stream)."""
    torch._foreach_add_(tensors, 2.0 ** -7 * (1 + step % 3))


def path_of(report):
    """How a push reached its engine ranks: direct, reads in place or staged (mixed: each's),
    and "parts" where each rank was sent only the parts it reads (as rank 0 of a 1-rank sharded
    update: the receivers' rank_bytes are set)."""
    paths = {"direct" if x.direct else "reads in place" if x.reads_in_place else "staged"
             for x in report.receivers}
    path = paths.pop() if len(paths) == 1 else "mixed"
    return path + (", parts" if any(x.rank_bytes for x in report.receivers) else "")


def run_case(args, torch, ferry, label, folder, d2d_per_byte):
    case = VARIANTS.get(label, label)  # the model and engines
    shard = {"rank": 0, "world": 1} if label == "tp2-pieces" else {}
    layers = args.layers or default_layers(case, args.device)
    shapes = checkpoint_shapes(case, layers, args.device)
    model_bytes = sum(2 * numel(s) for _, s in shapes)
    written = bytes_written(case, shapes)
    world = 2 if case == "tp2" else 1
    family = {"dense": "dense", "tp2": "dense", "moe": "moe", "moe-fp8": "lowbit"}[case]
    note("%s: %d layers, %d tensors, %.2f GB bf16 into %d engine rank(s) of family %s"
         % (label, layers, len(shapes), model_bytes / 1e9, world, family))
    device = sharded.device_of(args)
    state = {}
    for i, (name, shape) in enumerate(shapes):
        t = torch.empty(shape, dtype=torch.bfloat16, device=device)
        sharded.fill(torch, t, 1, i, 0)
        state[name] = t
    tensors = list(state.values())
    common.sync(torch, args.device)
    Event = torch.cuda.Event if args.device == "cuda" else common.HostEvent
    train_bytes = int(args.train_gib * (1 << 30)) if args.device == "cuda" else 1 << 20
    log_dir = os.path.join(args.log_dir, label) if args.log_dir else None
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    case_folder = os.path.join(folder, label)  # its engines' port files
    os.makedirs(case_folder)
    serves, result = [], {"case": label, "layers": layers, "tensors": len(shapes),
                          "model_bytes": model_bytes, "written_bytes": written,
                          "engine_ranks": world, "family": family}
    trainer_log = saved_stderr = py_handler = None
    try:
        for r in range(world):
            serves.append(sharded.Serve(args.ferry, device, case_folder, r, log_dir,
                                        world if world > 1 else 0, family))
        addresses = [s.address for s in serves]
        # The staged reference Sender first: the log level is the library's, set by the Sender
        # made last.
        # It rejoins the engines' kept sessions at its own push, after the timed one: a trainer
        # has one Sender, whose rejoin after a resume would otherwise share the engine and the
        # driver with this one's.
        reference = ferry.Sender(addresses, progress=False, update__delivery="staged",
                                 update__rejoin_when_resumed=False)
        if log_dir:
            # The timed Sender's log at debug level (where the trainer's side of a step goes):
            # this process's stderr goes to trainer.log for the case.
            trainer_log = open(os.path.join(log_dir, "trainer.log"), "w")
            sys.stderr.flush()
            saved_stderr = os.dup(2)
            os.dup2(trainer_log.fileno(), 2)
            os.environ["FERRY_LOG_LEVEL"] = "debug"
            # ferry's Python side too (each push's export and call times).
            py_handler = logging.StreamHandler(sys.stderr)
            py_handler.setFormatter(logging.Formatter("[%(asctime)s] [%(name)s] %(message)s"))
            logging.getLogger("ferry").addHandler(py_handler)
            logging.getLogger("ferry").setLevel(logging.DEBUG)
        sender = ferry.Sender(addresses, progress=False)
        os.environ.pop("FERRY_LOG_LEVEL", None)
        version = 1
        t0 = time.perf_counter()
        first = sender.push(state, version, check=False, **shard)
        result["first_push_s"] = time.perf_counter() - t0
        if not first.all_committed:
            raise RuntimeError("%s: the first push failed: %s" % (label, first))
        result["direct"] = all(x.direct for x in first.receivers)
        result["reads_in_place"] = all(x.reads_in_place for x in first.receivers)
        result["first_path"] = path_of(first)
        result["transport"] = first.receivers[0].transport
        previous = [s.fingerprints()[1] for s in serves]
        pushes, readies, lends, notes = [], [], [], []
        verified = True
        for step in range(1, args.steps + 1):
            t_lend = time.perf_counter()
            for s in serves:
                post(s.address, "release_memory_occupation")
            released = time.perf_counter()
            borrowed = torch.empty(train_bytes, dtype=torch.uint8, device=device)
            borrowed.fill_(step % 251)
            del borrowed
            if args.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()  # the memory goes back for the engine's resume
            trained = time.perf_counter()
            for s in serves:
                post(s.address, "resume_memory_occupation")
            lends.append({"release_s": released - t_lend, "resume_s": time.perf_counter() - trained,
                          "total_s": time.perf_counter() - t_lend})
            # When the optimizer's kernels end: the host's clock at the start event (the stream
            # is idle: the step above synchronised) plus the GPU's time to the end event. No
            # thread polls the event during the push: one would take the GIL from the push's
            # Python side every few microseconds.
            began, done = Event(enable_timing=True), Event(enable_timing=True)
            began.record()
            t_began = time.perf_counter()
            optimizer_step(torch, tensors, step)
            done.record()
            version += 1
            t0 = time.perf_counter()
            report = sender.push(state, version, check=False, **shard)  # no synchronize first
            t1 = time.perf_counter()
            done.synchronize()
            kernels_done = t_began + began.elapsed_time(done) / 1e3
            if not report.all_committed:
                raise RuntimeError("%s, step %d: the push failed: %s" % (label, step, report))
            pushes.append(t1 - t0)
            result["path"] = path_of(report)  # the last step's
            readies.append(t1 - max(t0, kernels_done))
            timed = [s.fingerprints() for s in serves]
            version += 1
            check = reference.push(state, version, check=False)
            if not check.all_committed:
                raise RuntimeError("%s, step %d: the staged reference push failed: %s"
                                   % (label, step, check))
            staged = [s.fingerprints() for s in serves]
            for r in range(world):
                if timed[r][1] != staged[r][1] or timed[r][1] == previous[r]:
                    verified = False
                    notes.append("%s, step %d, rank %d: %s" % (
                        label, step, r, "differs from the staged push of the same values"
                        if timed[r][1] != staged[r][1] else "unchanged from the step before"))
            previous = [x[1] for x in staged]
        reference.close()
        sender.close()
    finally:
        for s in serves:
            s.close()
        if py_handler is not None:
            logging.getLogger("ferry").removeHandler(py_handler)
            logging.getLogger("ferry").setLevel(logging.NOTSET)
        if saved_stderr is not None:
            sys.stderr.flush()
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            trainer_log.close()
    med = statistics.median
    result.update({"push_s": pushes, "ready_s": readies, "lends": lends,
                   "push_median_s": med(pushes), "push_best_s": min(pushes),
                   "ready_median_s": med(readies), "ready_worst_s": max(readies),
                   "verified": verified,
                   "verification": "; ".join(notes) or
                   "every step's version equal on every engine rank to a staged push of the "
                   "same values, and different from the step before"})
    if d2d_per_byte:
        # The ceiling: a device copy of the bytes written; FP8 reads more than it writes.
        ceiling = d2d_per_byte * (written if case != "moe-fp8" else (model_bytes + written) / 2)
        result["ceiling_s"] = ceiling
        result["of_ceiling"] = ceiling / result["push_median_s"]
        result["ready_of_ceiling"] = ceiling / result["ready_median_s"]
        # The target holds for every step: the slowest one's.
        result["worst_of_ceiling"] = ceiling / result["ready_worst_s"]
    if args.baseline_steps > 0:
        result.update(torch_baseline(args, torch, case, layers, state, tensors, world))
        if result.get("torch_median_s"):
            result["vs_torch"] = result["torch_median_s"] / result["push_median_s"]
    del state, tensors
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return result


def torch_baseline(args, torch, case, layers, state, tensors, world):
    if case == "moe-fp8" and not hasattr(torch, "float8_e4m3fn"):
        return {"torch_unavailable": "torch %s has no float8_e4m3fn" % torch.__version__}
    engines = [common.Child([sys.executable, os.path.abspath(__file__), "--role", "torch-engine",
                             "--case", case, "--layers", str(layers), "--rank", str(r),
                             "--world", str(world), "--device", args.device],
                            "torch engine rank %d of %s" % (r, case)) for r in range(world)]
    runs = []
    try:
        for e in engines:
            e.answer(args.answer_timeout)
        for step in range(args.baseline_steps):
            optimizer_step(torch, tensors, step)
            common.sync(torch, args.device)
            t0 = time.perf_counter()
            for b in common.flattened_buckets(torch, state, args.bucket_mib << 20):
                line = "load " + common.serialize(b)
                for e in engines:
                    e.proc.stdin.write(line + "\n")
                    e.proc.stdin.flush()
                for e in engines:
                    e.answer(args.answer_timeout)
                del b
            runs.append(time.perf_counter() - t0)
    finally:
        for e in engines:
            e.close()
        if args.device == "cuda":
            # The buckets the engines mapped stay allocated until torch learns they are gone.
            torch.cuda.ipc_collect()
    return {"torch_s": runs, "torch_median_s": statistics.median(runs)}


def bench_main(args, torch, ferry):
    folder = tempfile.mkdtemp(prefix="ferry-rl-step-")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    d2d_per_byte, d2d = None, None
    if args.device == "cuda":
        probe = 4 << 30
        runs, same = common.d2d_ceiling(torch, probe, 10, args.device)
        if same:
            d2d = statistics.median(runs)
            d2d_per_byte = d2d / probe
    rows = []
    try:
        for case in args.cases:
            rows.append(run_case(args, torch, ferry, case, folder, d2d_per_byte))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"ok": True, "device": args.device,
            "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "steps": args.steps,
            "train_bytes": int(args.train_gib * (1 << 30)) if args.device == "cuda" else 1 << 20,
            "baseline_steps": args.baseline_steps, "bucket_mib": args.bucket_mib,
            "d2d_probe_s": d2d, "d2d_probe_bytes": 4 << 30 if d2d else None,
            "target": TARGET, "torch_target": TORCH_TARGET, "rows": rows,
            "verified": all(r["verified"] for r in rows),
            "verification": "; ".join(r["verification"] for r in rows if not r["verified"]) or
            "every step's version equal on every engine rank to a staged push of the same "
            "values, and different from the step before"}


def ms(s):
    return "-" if s is None else "%.2f" % (s * 1e3)


def print_table(r):
    out = sys.stderr
    out.write("\nrl-step on %s: %d steps per case, each after a release, a training step of "
              "%.1f GiB and a resume\n" % (r["device_name"], r["steps"], r["train_bytes"] / 2**30))
    out.write("%-8s %7s %9s %9s %9s %9s %9s %8s %8s %9s %7s  %s\n" % (
        "case", "tensors", "GB", "first ms", "push ms", "ready ms", "ceil ms", "of ceil",
        "slowest", "torch ms", "vs torch", "path"))
    for row in r["rows"]:
        path = row["path"] if row["path"] == row["first_path"] else "%s, then %s" % (
            row["first_path"], row["path"])
        of = "-" if row.get("ready_of_ceiling") is None else "%.2f" % row["ready_of_ceiling"]
        worst = "-" if row.get("worst_of_ceiling") is None else "%.2f" % row["worst_of_ceiling"]
        vs = "-" if row.get("vs_torch") is None else "%.2f" % row["vs_torch"]
        out.write("%-8s %7d %9.2f %9s %9s %9s %9s %8s %8s %9s %7s  %s\n" % (
            row["case"], row["tensors"], row["model_bytes"] / 1e9, ms(row["first_push_s"]),
            ms(row["push_median_s"]), ms(row["ready_median_s"]), ms(row.get("ceiling_s")), of,
            worst, ms(row.get("torch_median_s")), vs, path))
    out.write("verified: %s (%s)\n" % ("yes" if r["verified"] else "NO", r["verification"]))
    out.flush()


def main():
    parser = argparse.ArgumentParser(description="ferry bench rl-step: the colocated RL step")
    parser.add_argument("--role", choices=["trainer", "torch-engine"], default="trainer",
                        help=argparse.SUPPRESS)
    parser.add_argument("--case", default="dense", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--cases", default=",".join(CASES),
                        help="comma-separated, of %s (all)" % ", ".join(CASES))
    parser.add_argument("--layers", type=int, default=0,
                        help="decoder layers (0: 36 for dense and tp2, 12 for the MoE cases)")
    parser.add_argument("--steps", type=int, default=5, help="lend + step + push cycles (5)")
    parser.add_argument("--train-gib", type=float, default=8.0,
                        help="what the training step allocates, writes and frees (8 GiB)")
    parser.add_argument("--baseline-steps", type=int, default=3,
                        help="steps of torch's flattened-bucket IPC (3; 0: none)")
    parser.add_argument("--bucket-mib", type=int, default=512,
                        help="the torch baseline's flattened bucket size (512 MiB)")
    parser.add_argument("--ferry", default=os.environ.get("FERRY_EXE", "ferry"),
                        help="the ferry executable the engines run ($FERRY_EXE or ferry)")
    parser.add_argument("--log-dir", default=None,
                        help="keep each engine's log and the trainer's (its timed Sender's) here, "
                             "at debug level, one folder per case")
    parser.add_argument("--answer-timeout", type=float, default=300,
                        help="seconds to wait for a child at any point (300)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (cuda:0); cpu: host tensors of tiny models")
    parser.add_argument("--no-table", action="store_true",
                        help="no table on stderr (ferry bench rl-step prints its own)")
    args = parser.parse_args()
    if args.role == "torch-engine":
        return torch_engine_main(args)
    args.cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.cases if c not in CASES and c not in VARIANTS]
    if unknown or not args.cases:
        parser.error("--cases takes %s; got %s" % (", ".join(CASES + tuple(VARIANTS)),
                                                  args.cases))
    if args.steps < 1 or args.layers < 0 or args.baseline_steps < 0:
        parser.error("need --steps >= 1, --layers >= 0 and --baseline-steps >= 0")
    torch, ferry = sharded.what_a_run_needs(args, unavailable)
    sharded.run_and_emit("rl_step", lambda: bench_main(args, torch, ferry), print_table, args)


if __name__ == "__main__":
    sys.exit(main())

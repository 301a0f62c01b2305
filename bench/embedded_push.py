#!/usr/bin/env python3
"""bench/embedded_push.py: an RL weight update as users run it, timed: a trainer process (this
script) holding a Hugging Face Qwen3 model with Qwen3-8B's dimensions on cuda:0 pushes
model.state_dict() right after optimizer.step() (no torch.cuda.synchronize) through one kept
ferry.Sender into a rollout process (this script again, --role rollout, spawned) on the same GPU
whose model's named_parameters() are registered with a ferry.Receiver() left at its defaults.

Run by `ferry bench embedded` as a child process (or by hand); prints exactly one JSON object on
stdout, as its last line (the protocol of bench/torch_baselines.py):

  {"ok": true, ...numbers...}                 the bench ran (see "verified")
  {"ok": false, "unavailable": "<reason>"}    torch, CUDA, transformers or ferry is missing; exit 3
  {"ok": false, "error": "<reason>"}          the run failed; exit 1

The model: hidden 4096, intermediate 12288, 32 heads, 8 KV heads, head_dim 128, vocab 151936,
untied lm_head, --layers N (default 5: 4.42 GB of bf16, over 4 GiB), random init, built directly
on the GPU. Per step: optimizer.step() of AdamW over the parameters with fixed fake gradients
(randn_like, set once), then push(model.state_dict(), version=step), --steps (default 8) steps.

Timed on the wall clock, per push:
  push     from push() called to its return (it returns after the receiver committed). No
           synchronize comes first, so this includes waiting for the optimizer's kernels still
           queued on torch's stream (a correct push orders itself after them).
  ready    from the later of push() called and the optimizer's kernels done to its return: the
           push's own cost. The kernels' end is the host's clock at a CUDA event recorded on the
           idle stream before optimizer.step() plus the device's time from it to an event after
           (no thread polls an event during the push: one would take the GIL from the push's
           Python side every few microseconds).
The first push (it opens the session) is reported apart; steps 2..N give the median and best.
The ceiling, in the same run: one flat device-to-device copy_ of a uint8 buffer of the payload's
bytes on the same GPU, CUDA events, median of --ceiling-repeat (10). Ratios: ceiling / push.
Verified after the last step: the rollout publishes version N, its parameters were written in
place (same data_ptr as registered), and each parameter's checksum (the int64 sum of its int16
view) equals the trainer's.

With --device cpu the same flow runs on host tensors with a tiny Qwen3 (hidden 256): a check of
the script itself on a machine without a GPU (ferry then uses a host transport).

--model qwen3-moe pushes a Qwen3-MoE with Qwen3-30B-A3B's dimensions instead (its experts are
stacked tensors in transformers 5, copied whole). --lend runs the colocated RL loop: before every
push after the first the rollout lends its GPU (ferry releases its weights, the rollout frees its
2 GiB KV cache stand-in and overwrites its parameters), the trainer's step allocates, writes and
frees 8 GiB, the rollout takes a KV cache again and resumes (ferry writes the weights back); then
the optimizer step and the push, which rejoins the session the release suspended. The lend's
own time is reported apart. With a GPU, the baseline steps (torch's flat-bucket CUDA IPC of the
same tensors: SGLang's own receive) follow the pushes in the same run, without lending.

Usage: embedded_push.py [--model qwen3|qwen3-moe] [--layers 5] [--lend] [--steps 8]
                        [--delivery auto|direct|staged]
                        [--ceiling-repeat 10] [--answer-timeout 300] [--no-table]
                        [--device cuda|cpu]
"""

import argparse
import contextlib
import json
import logging
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time

TARGET = 0.70  # PERF.md: >= 70% of the D2D ceiling
LR = 1e-2
KV_CACHE_BYTES = 2 << 30  # the rollout's KV cache stand-in, freed while it lends its GPU
TRAIN_BYTES = 8 << 30  # --lend: what the trainer's step allocates, writes and frees meanwhile


def emit(obj, code):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def unavailable(reason):
    sys.stderr.write("embedded_push: unavailable: %s\n" % reason)
    emit({"ok": False, "unavailable": reason}, 3)


def note(text):
    sys.stderr.write("embedded_push: %s\n" % text)
    sys.stderr.flush()


MODELS = {
    "qwen3": ("Qwen3ForCausalLM, Qwen3-8B dims (hidden 4096, intermediate 12288, 32 heads, "
              "8 kv heads, head_dim 128, vocab 151936, untied)"),
    "qwen3-moe": ("Qwen3MoeForCausalLM, Qwen3-30B-A3B dims (hidden 2048, 128 experts of "
                  "intermediate 768, top 8, 32 heads, 4 kv heads, head_dim 128, vocab 151936, "
                  "untied)"),
}


def model_config(transformers, model, layers, device):
    """(config, model class) of --model with --layers decoder layers."""
    common = dict(num_hidden_layers=layers, max_position_embeddings=4096,
                  tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")
    if model == "qwen3-moe":
        if device == "cpu":
            dims = dict(vocab_size=4096, hidden_size=256, moe_intermediate_size=128,
                        num_experts=8, num_experts_per_tok=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=64)
        else:
            dims = dict(vocab_size=151936, hidden_size=2048, moe_intermediate_size=768,
                        num_experts=128, num_experts_per_tok=8, num_attention_heads=32,
                        num_key_value_heads=4, head_dim=128)
        config = transformers.Qwen3MoeConfig(intermediate_size=6144, norm_topk_prob=True,
                                             decoder_sparse_step=1, mlp_only_layers=[],
                                             **common, **dims)
        return config, transformers.Qwen3MoeForCausalLM
    if device == "cpu":  # the CPU check of this script: the same code, a tiny model
        dims = dict(vocab_size=4096, hidden_size=256, intermediate_size=768,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    else:
        dims = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                    num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    return transformers.Qwen3Config(**common, **dims), transformers.Qwen3ForCausalLM


def sync(torch, device):
    if device != "cpu":
        torch.cuda.synchronize()


def build_model(torch, transformers, model_name, layers, seed, device):
    """--model in bf16, built (and randomly initialized) directly on the device."""
    config, cls = model_config(transformers, model_name, layers, device)
    device = "cuda:0" if device == "cuda" else device
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        where = torch.device(device)
        with where if hasattr(where, "__enter__") else contextlib.nullcontext():
            model = cls(config)
    finally:
        torch.set_default_dtype(old)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    sync(torch, device)
    return model


def checksums(torch, named):
    """{name: int64 sum of the tensor's int16 view} (exact; bf16 bits as integers)."""
    out = {}
    for name, t in named:
        out[name] = int(t.detach().reshape(-1).view(torch.int16).sum(dtype=torch.int64))
    return out


# ---- SGLang's colocated path (--path sglang-tensor) -------------------------------------------

def flattened_metadata_class():
    """SGLang's FlattenedTensorMetadata: the installed one, else a dataclass of the same module
    path and fields (what a pickle names; ferry's restricted reader checks that path)."""
    try:
        from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorMetadata
        return FlattenedTensorMetadata
    except ImportError:
        pass
    import dataclasses
    import types

    @dataclasses.dataclass
    class FlattenedTensorMetadata:
        name: str
        shape: object
        dtype: object
        start_idx: int
        end_idx: int
        numel: int

    path = "sglang.srt.weight_sync.tensor_bucket"
    parts = path.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    FlattenedTensorMetadata.__module__ = path
    FlattenedTensorMetadata.__qualname__ = "FlattenedTensorMetadata"
    sys.modules[path].FlattenedTensorMetadata = FlattenedTensorMetadata
    return FlattenedTensorMetadata


def flattened_buckets(torch, state, bucket_bytes):
    """The state dict in SGLang flattened buckets, as verl and slime make them: tensors in order,
    each bucket at most bucket_bytes (a larger tensor alone), every tensor's bytes flattened into
    one uint8 tensor (torch.cat: a copy on the trainer's stream) plus the metadata."""
    meta_cls = flattened_metadata_class()
    groups, group, size = [], [], 0
    for name, t in state.items():
        nbytes = t.numel() * t.element_size()
        if group and size + nbytes > bucket_bytes:
            groups.append(group)
            group, size = [], 0
        group.append((name, t))
        size += nbytes
    if group:
        groups.append(group)
    out = []
    for group in groups:
        parts, meta, start = [], [], 0
        for name, t in group:
            flat = t.detach().reshape(-1).view(torch.uint8)
            parts.append(flat)
            meta.append(meta_cls(name=name, shape=t.shape, dtype=t.dtype, start_idx=start,
                                 end_idx=start + flat.numel(), numel=flat.numel()))
            start += flat.numel()
        out.append({"flattened_tensor": torch.cat(parts), "metadata": meta})
    return out


def serialize(payload):
    """SGLang's MultiprocessingSerializer: torch's ForkingPickler (CUDA tensors as IPC handles),
    base64 for HTTP."""
    import base64
    import io
    import torch.multiprocessing  # registers torch's reductions
    from multiprocessing.reduction import ForkingPickler
    torch.multiprocessing.set_sharing_strategy("file_system")  # CPU tensors: what ferry reads
    buf = io.BytesIO()
    ForkingPickler(buf).dump(payload)
    return base64.b64encode(buf.getvalue()).decode()


def post_json(url, body, timeout):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def sglang_update(torch, url, state, step, bucket_bytes, timeout):
    """One update the way verl/slime drive SGLang: /update_weights_from_tensor per flattened
    bucket, the last with weight_version. Returns (buckets, the last answer)."""
    buckets = flattened_buckets(torch, state, bucket_bytes)
    last = None
    for i, b in enumerate(buckets):
        body = {"serialized_named_tensors": [serialize(b)], "load_format": "flattened_bucket",
                "flush_cache": i == len(buckets) - 1}
        if i == len(buckets) - 1:
            body["weight_version"] = str(step)
        status, last = post_json(url + "/update_weights_from_tensor", body, timeout)
        if status != 200 or not last.get("success"):
            raise RuntimeError("update_weights_from_tensor, bucket %d of step %d: %s %s"
                               % (i, step, status, last.get("message")))
    return len(buckets), last


def torch_receive(torch, params, line):
    """What SGLang itself does with one such call: unpickle (torch opens the IPC handle and waits
    for the producer's event) and copy_ each tensor into its parameter."""
    import base64
    import torch.multiprocessing  # noqa: F401
    from multiprocessing.reduction import ForkingPickler
    flattened_metadata_class()
    payload = ForkingPickler.loads(base64.b64decode(line))
    flat = payload["flattened_tensor"]
    with torch.no_grad():
        for m in payload["metadata"]:
            params[m.name].copy_(flat[m.start_idx:m.end_idx].view(m.dtype).view(m.shape))
    torch.cuda.synchronize()
    del payload, flat


# ---- the rollout process ---------------------------------------------------------------------

def rollout_main(args):
    import torch
    import transformers

    import ferry
    model = build_model(torch, transformers, args.model, args.layers, seed=1, device=args.device)
    receiver = ferry.Receiver()  # the defaults: device, weights policy, delivery
    receiver.register(model.named_parameters())
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    port = receiver.serve(port=0)
    # The engine's KV cache stand-in, freed while the trainer borrows the GPU (--lend).
    kv_bytes = KV_CACHE_BYTES if args.device != "cpu" else 1 << 20
    kv_cache = [torch.empty(kv_bytes, dtype=torch.uint8, device=model.device)]
    print(json.dumps({"ready": True, "port": port}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            if words[0] == "lend":
                # A colocated engine lending its GPU for a training step, as SGLang's
                # release/resume_memory_occupation does: ferry saves the weights and the engine
                # frees its KV cache; when the step is over the engine takes a KV cache again and
                # ferry writes the weights back. The engine's parameters are overwritten
                # meanwhile (its memory was lent), so the resume must restore them.
                t0 = time.perf_counter()
                receiver.release("weights")
                kv_cache.clear()
                if args.device != "cpu":
                    torch.cuda.empty_cache()
                with torch.no_grad():
                    for p in model.parameters():
                        p.zero_()
                print(json.dumps({"lent": True, "release_s": time.perf_counter() - t0}),
                      flush=True)
            elif words[0] == "take_back":
                t0 = time.perf_counter()
                kv_cache.append(torch.empty(kv_bytes, dtype=torch.uint8, device=model.device))
                receiver.resume("weights")
                sync(torch, args.device)
                print(json.dumps({"resume_s": time.perf_counter() - t0,
                                  "health": receiver.health().state}), flush=True)
            elif words[0] == "torch_receive":
                torch_receive(torch, dict(model.named_parameters()), words[1])
                print(json.dumps({"received": True}), flush=True)
            elif words[0] == "verify":
                sync(torch, args.device)
                moved = [n for n, p in model.named_parameters() if p.data_ptr() != pointers[n]]
                v = receiver.version
                print(json.dumps({"version": v.number, "moved": moved[:5],
                                  "checksums": checksums(torch, model.named_parameters())}),
                      flush=True)
            else:
                print(json.dumps({"failure": "unknown command %r" % words[0]}), flush=True)
        except Exception as e:
            print(json.dumps({"failure": "%s: %s" % (type(e).__name__, e)}), flush=True)
    receiver.close()
    return 0


class Child:
    """A child process of a bench script: commands on stdin, JSON lines on stdout (read by a
    thread so that every wait has a timeout), its stderr shared with ours. `what` names it in
    the errors (bench/sharded_push.py uses it for its senders)."""

    def __init__(self, cmd, what, stderr=None, env=None):
        self.what = what
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=stderr, env=env, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def answer(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("%s gave no answer within %.0f s" % (self.what, timeout))
            if line is None:
                self.proc.wait(timeout=10)
                raise RuntimeError("%s exited (code %s)" % (self.what, self.proc.returncode))
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # not ours (a library printing to stdout)
            if not isinstance(msg, dict):
                continue
            if "failure" in msg:
                raise RuntimeError("%s failed: %s" % (self.what, msg["failure"]))
            return msg

    def ask(self, command, timeout):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(timeout)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


class Rollout(Child):
    """The rollout child (this script, --role rollout)."""

    def __init__(self, args):
        super().__init__([sys.executable, os.path.abspath(__file__), "--role", "rollout",
                          "--model", args.model, "--layers", str(args.layers), "--device",
                          args.device],
                         "the rollout process")


# ---- the trainer (this process) ---------------------------------------------------------------

class HostEvent:
    """torch.cuda.Event's interface on the wall clock (the CPU check)."""

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def d2d_ceiling(torch, nbytes, repeat, device):
    device = "cuda:0" if device == "cuda" else device
    src = torch.empty((nbytes,), dtype=torch.uint8, device=device)
    src.random_(0, 256)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    sync(torch, device)
    runs = []
    if device == "cpu":
        for _ in range(repeat):
            t0 = time.perf_counter()
            dst.copy_(src)
            runs.append(time.perf_counter() - t0)
    for _ in range(repeat if device != "cpu" else 0):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1e3)
    piece = 1 << 30
    same = all(torch.equal(dst[lo:lo + piece], src[lo:lo + piece])
               for lo in range(0, nbytes, piece))
    del src, dst
    if device != "cpu":
        torch.cuda.empty_cache()
    return runs, same


def ms(s):
    return "-" if s is None else "%.2f" % (s * 1e3)


def print_table(r):
    later = "after a lend" if r.get("lend") else "kept session"
    rows = [("first push (opens the session)", r["first_push_s"], r["first_ready_s"]),
            (later + ", median", r["kept_median_s"], r["kept_ready_median_s"]),
            (later + ", best", r["kept_best_s"], r["kept_ready_best_s"]),
            ("D2D copy ceiling, median", r["d2d_s"], r["d2d_s"])]
    if r.get("torch_median_s"):
        rows.append(("torch (SGLang's receive), median", r["torch_median_s"],
                     r["torch_ready_median_s"]))
    out = sys.stderr
    out.write("\nembedded push: %s, %d layers, %d tensors, %.2f GB bf16, "
              "trainer -> rollout process on %s, %s%s\n"
              % (r["model"].split(" (")[0], r["layers"], r["tensors"], r["payload_bytes"] / 1e9,
                 r["device_name"],
                 r["transport"], ", direct" if r["direct"] else ", staged"))
    out.write("%-32s %10s %10s %12s %10s\n" % ("", "push ms", "ready ms", "GB/s (ready)",
                                               "D2D/ready"))
    for name, push, ready in rows:
        gbs = "%.1f" % (r["payload_bytes"] / ready / 1e9) if ready else "-"
        ratio = "%.2f" % (r["d2d_s"] / ready) if ready else "-"
        out.write("%-32s %10s %10s %12s %10s\n" % (name, ms(push), ms(ready), gbs, ratio))
    out.write("ratio D2D / push (median, best): %.2f, %.2f; D2D / ready: %.2f, %.2f "
              "(target >= %.2f)\n" % (r["ratio_median"], r["ratio_best"], r["ratio_ready_median"],
                                      r["ratio_ready_best"], TARGET))
    if r.get("vs_torch"):
        out.write("ferry / torch (median): %.2fx faster; after the optimizer's kernels: %.2fx\n"
                  % (r["vs_torch"], r["vs_torch_ready"] or 0.0))
    if r.get("lend_runs"):
        med = statistics.median
        out.write("lends (not in the push times), median: release %.1f ms, resume %.1f ms, the "
                  "whole lend with the trainer's step %.1f ms\n"
                  % (med([x["release_s"] for x in r["lend_runs"]]) * 1e3,
                     med([x["resume_s"] for x in r["lend_runs"]]) * 1e3,
                     med([x["total_s"] for x in r["lend_runs"]]) * 1e3))
    out.write("verified: %s (%s)\n" % ("yes" if r["verified"] else "NO", r["verification"]))
    out.flush()


def trainer_main(args, torch, transformers, ferry):
    rollout = Rollout(args)
    try:
        note("building the trainer's model (%d layers) while the rollout builds its own"
             % args.layers)
        model = build_model(torch, transformers, args.model, args.layers, seed=2,
                            device=args.device)
        Event = torch.cuda.Event if args.device != "cpu" else HostEvent
        params = [p for p in model.parameters()]
        for p in params:
            p.grad = torch.randn_like(p)  # fixed fake gradients: a real optimizer step per push
        optimizer = torch.optim.AdamW(params, lr=LR)
        state = model.state_dict()
        payload = sum(t.numel() * t.element_size() for t in state.values())
        note("payload: %d tensors, %d bytes (%.2f GiB)" % (len(state), payload, payload / 2**30))
        del state
        ready = rollout.answer(args.answer_timeout)
        overrides = {} if args.delivery == "auto" else {"update__delivery": args.delivery}
        url = "http://127.0.0.1:%d" % ready["port"]
        bucket_bytes = args.bucket_mib << 20
        sender = (ferry.Sender(["127.0.0.1:%d" % ready["port"]], **overrides)
                  if args.path == "push" else None)

        pushes, readies, reports, opt_gpu, early, lends = [], [], [], [], [], []
        train_bytes = TRAIN_BYTES if args.device != "cpu" else 1 << 20
        for step in range(1, args.steps + 1):
            if args.lend and step > 1:
                # The colocated RL loop: the rollout lends its GPU, the trainer's step takes the
                # memory and gives it back, the rollout takes it again; the push follows.
                t_lend = time.perf_counter()
                lent = rollout.ask("lend", args.answer_timeout)
                borrowed = torch.empty(train_bytes, dtype=torch.uint8, device=model.device)
                borrowed.fill_(step % 251)
                del borrowed
                if args.device != "cpu":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()  # back to the device, for the rollout's KV cache
                back = rollout.ask("take_back", args.answer_timeout)
                if back["health"] != "ready":
                    raise RuntimeError("step %d: the rollout is %s after its resume"
                                       % (step, back["health"]))
                lends.append({"release_s": lent["release_s"], "resume_s": back["resume_s"],
                              "total_s": time.perf_counter() - t_lend})
            started = Event(enable_timing=True)
            done = Event(enable_timing=True)
            sync(torch, args.device)  # the stream is idle: `started` completes when recorded
            started.record()
            t_started = time.perf_counter()
            optimizer.step()
            done.record()
            t0 = time.perf_counter()
            if sender is not None:
                report = sender.push(model.state_dict(), version=step, check=False)  # no sync
            else:
                buckets, answer = sglang_update(torch, url, model.state_dict(), step, bucket_bytes,
                                                args.answer_timeout)
            t1 = time.perf_counter()
            done.synchronize()
            opt_gpu.append(started.elapsed_time(done) / 1e3)
            pushes.append(t1 - t0)
            finished = t_started + opt_gpu[-1]
            if finished > t1:
                early.append(step)  # it cannot have read what the optimizer wrote
            readies.append(max(0.0, t1 - max(t0, finished)))
            if sender is not None:
                r = report.receivers[0]
                if not r.committed:
                    raise RuntimeError("push %d did not commit: %s" % (step, r.error))
                reports.append({"seconds": r.seconds,
                                "producer_wait_s": getattr(report, "producer_wait_seconds", None),
                                "transport": r.transport, "direct": r.direct,
                                "reused_session": r.reused_session,
                                "writer_fingerprints": r.writer_fingerprints,
                                "buckets": r.buckets})
            else:
                if not answer.get("committed"):
                    raise RuntimeError("step %d did not commit: %s" % (step, answer))
                reports.append({"seconds": answer.get("seconds"), "buckets": buckets,
                                "transport": "update_weights_from_tensor (flattened_bucket, "
                                             "%d MiB buckets)" % args.bucket_mib,
                                "direct": False, "reused_session": False})
            r = reports[-1]
            note("push %d: %.2f ms (%.2f ms after the optimizer's kernels; optimizer %.2f ms on "
                 "the device), %s%s%s" % (step, pushes[-1] * 1e3, readies[-1] * 1e3,
                                       opt_gpu[-1] * 1e3, r["transport"],
                                       ", direct" if r["direct"] else "",
                                       ", kept session" if r["reused_session"] else ""))
        if sender is not None:
            sender.close()

        sync(torch, args.device)
        mine = checksums(torch, model.state_dict().items())
        seen = rollout.ask("verify", args.answer_timeout)
        theirs = seen["checksums"]
        problems = []
        if early:
            problems.append("pushes %s returned before the optimizer's kernels finished: they read "
                            "stale weights" % early)
        if seen["version"] != args.steps:
            problems.append("the rollout publishes version %d, expected %d"
                            % (seen["version"], args.steps))
        if seen["moved"]:
            problems.append("parameters were reallocated, not written in place: %s"
                            % seen["moved"])
        wrong = sorted(n for n in set(mine) | set(theirs) if mine.get(n) != theirs.get(n))
        if wrong:
            problems.append("%d of %d tensors differ from the trainer's: %s"
                            % (len(wrong), len(mine), wrong[:5]))
        verification = "; ".join(problems) if problems else (
            "after push %d the rollout publishes version %d, its %d parameters were written in "
            "place and each one's checksum equals the trainer's" % (args.steps, args.steps,
                                                                    len(mine)))

        torch_runs, torch_ready = [], []
        if args.device != "cpu" and args.baseline_steps > 0:
            # Torch's flat-bucket CUDA IPC of the same tensors (SGLang's own receive of the calls
            # verl and slime make), in the same run, without lending: the baseline.
            for step in range(args.steps + 1, args.steps + 1 + args.baseline_steps):
                started, done = Event(enable_timing=True), Event(enable_timing=True)
                sync(torch, args.device)
                started.record()
                t_started = time.perf_counter()
                optimizer.step()
                done.record()
                t0 = time.perf_counter()
                buckets = flattened_buckets(torch, model.state_dict(), bucket_bytes)
                for b in buckets:
                    rollout.ask("torch_receive " + serialize(b), args.answer_timeout)
                t1 = time.perf_counter()
                done.synchronize()
                finished = t_started + started.elapsed_time(done) / 1e3
                torch_runs.append(t1 - t0)
                torch_ready.append(max(0.0, t1 - max(t0, finished)))
                del buckets
                note("torch baseline step %d: %.2f ms (%.2f ms after the optimizer's kernels)"
                     % (step, torch_runs[-1] * 1e3, torch_ready[-1] * 1e3))
            sync(torch, args.device)
            again = rollout.ask("verify", args.answer_timeout)["checksums"]
            now = checksums(torch, model.state_dict().items())
            if any(now.get(n) != again.get(n) for n in set(now) | set(again)):
                problems.append("the torch baseline's receive left other weights than the "
                                "trainer's (the baseline is wrong)")
                verification = "; ".join(problems)

        del optimizer, params
        for p in model.parameters():
            p.grad = None
        if args.device != "cpu":
            torch.cuda.empty_cache()
        note("the D2D ceiling: %d copies of %d bytes" % (args.ceiling_repeat, payload))
        d2d_runs, d2d_same = d2d_ceiling(torch, payload, args.ceiling_repeat, args.device)
        if not d2d_same:
            problems.append("the D2D copy differs from its source")
            verification = "; ".join(problems)
    finally:
        rollout.close()

    kept, kept_ready = pushes[1:], readies[1:]
    d2d = statistics.median(d2d_runs)

    def ratio(num, den):
        return num / den if den > 0 else 0.0

    result = {
        "ok": True,
        "case": "embedded",
        "model": (MODELS[args.model] if args.device != "cpu" else
                  MODELS[args.model].split(",")[0] + ", tiny (hidden 256, vocab 4096): the CPU "
                  "check"),
        "model_name": args.model,
        "lend": args.lend,
        "lend_runs": lends,
        "layers": args.layers,
        "tensors": len(mine),
        "payload_bytes": payload,
        "steps": args.steps,
        "delivery": args.delivery,
        "transport": reports[-1]["transport"],
        "direct": all(x["direct"] for x in reports[1:] or reports),
        "reused_session": all(x["reused_session"] for x in reports[1:]) if kept else False,
        "first_push_s": pushes[0],
        "first_ready_s": readies[0],
        "kept_median_s": statistics.median(kept) if kept else 0.0,
        "kept_best_s": min(kept) if kept else 0.0,
        "kept_ready_median_s": statistics.median(kept_ready) if kept else 0.0,
        "kept_ready_best_s": min(kept_ready) if kept else 0.0,
        "push_runs_s": pushes,
        "ready_runs_s": readies,
        "optimizer_gpu_s": opt_gpu,
        "reports": reports,
        "d2d_s": d2d,
        "d2d_best_s": min(d2d_runs),
        "d2d_runs_s": d2d_runs,
        "target": TARGET,
        "verified": not problems,
        "verification": verification,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": args.device,
        "device_name": (torch.cuda.get_device_name(0) if args.device != "cpu"
                        else platform.processor() or "cpu"),
        "ferry_library": str(ferry.library_path()),
        "returned_before_optimizer": early,
        "timing": "time.perf_counter around push(); ready: from the later of push() called and "
                  "the optimizer's kernels done (CUDA events around optimizer.step() on an idle "
                  "stream); D2D: "
                  "torch.cuda.Event around one copy_",
    }
    result["path"] = args.path
    result["bucket_mib"] = args.bucket_mib
    if torch_runs:
        result["torch_runs_s"] = torch_runs
        result["torch_median_s"] = statistics.median(torch_runs) if torch_runs else None
        result["torch_ready_runs_s"] = torch_ready
        result["torch_ready_median_s"] = statistics.median(torch_ready) if torch_ready else None
        result["vs_torch_ready"] = (ratio(result["torch_ready_median_s"],
                                          result["kept_ready_median_s"]) if torch_ready else None)
        result["vs_torch"] = (ratio(result["torch_median_s"], result["kept_median_s"])
                              if torch_runs else None)
    result["ratio_median"] = ratio(d2d, result["kept_median_s"])
    result["ratio_best"] = ratio(d2d, result["kept_best_s"])
    result["ratio_ready_median"] = ratio(d2d, result["kept_ready_median_s"])
    result["ratio_ready_best"] = ratio(d2d, result["kept_ready_best_s"])
    return result


def main():
    parser = argparse.ArgumentParser(description="ferry bench embedded: a real-model RL push")
    parser.add_argument("--role", choices=["trainer", "rollout"], default="trainer",
                        help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3",
                        help="qwen3 (Qwen3-8B dims, default) or qwen3-moe (Qwen3-30B-A3B dims)")
    parser.add_argument("--layers", type=int, default=5, help="decoder layers (default 5)")
    parser.add_argument("--lend", action="store_true",
                        help="before every push after the first the rollout lends its GPU: "
                             "release of its weights and KV cache, the trainer's step takes "
                             "and frees memory, resume; then the push (the colocated RL loop)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps + pushes (8)")
    parser.add_argument("--delivery", choices=["auto", "direct", "staged"], default="auto",
                        help="the Sender's update.delivery (default: auto, not set)")
    parser.add_argument("--path", choices=["push", "sglang-tensor"], default="push",
                        help="push: ferry.Sender.push; sglang-tensor: /update_weights_from_tensor "
                             "per flattened bucket as verl/slime call SGLang, against SGLang's "
                             "own receive (unpickle + copy_) in the same run")
    parser.add_argument("--bucket-mib", type=int, default=512,
                        help="flattened bucket size of sglang-tensor and of the torch "
                             "baseline (512 MiB)")
    parser.add_argument("--baseline-steps", type=int, default=3,
                        help="steps of the torch baseline (3; 0: none)")
    parser.add_argument("--ceiling-repeat", type=int, default=10, help="D2D copies timed (10)")
    parser.add_argument("--answer-timeout", type=float, default=300,
                        help="seconds to wait for the rollout process at any point (300)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (cuda:0); cpu checks this script itself with a tiny model")
    parser.add_argument("--no-table", action="store_true",
                        help="no table on stderr (ferry bench embedded prints its own)")
    args = parser.parse_args()
    if args.layers <= 0 or args.steps < 2 or args.ceiling_repeat <= 0:
        parser.error("need --layers > 0, --steps >= 2 and --ceiling-repeat > 0")
    if os.environ.get("FERRY_LOG_LEVEL", "").lower() in ("debug", "trace"):
        # ferry's Python side logs its debug timings (the C++ side logs its own on stderr).
        logging.basicConfig(stream=sys.stderr, level=logging.DEBUG,
                            format="[%(asctime)s] [%(name)s] [debug] %(message)s")

    if args.role == "rollout":
        try:
            return rollout_main(args)
        except Exception as e:
            print(json.dumps({"failure": "%s: %s" % (type(e).__name__, e)}), flush=True)
            return 1

    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising anything else
        unavailable("torch is not importable by %s: %s" % (sys.executable, e))
    if args.device == "cuda" and not torch.cuda.is_available():
        unavailable("torch %s sees no CUDA device (torch.cuda.is_available() is False)"
                    % torch.__version__)
    try:
        import transformers
        transformers.Qwen3Config, transformers.Qwen3ForCausalLM
        if args.model == "qwen3-moe":
            transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM
    except Exception as e:
        unavailable("transformers with Qwen3 is not importable by %s: %s: %s"
                    % (sys.executable, type(e).__name__, e))
    try:
        import ferry
        ferry.library_path()
    except Exception as e:
        unavailable("the ferry package or libferry.so is not found by %s: %s (set PYTHONPATH to "
                    "ferry's python/ folder and FERRY_LIBRARY to libferry.so)"
                    % (sys.executable, e))

    try:
        result = trainer_main(args, torch, transformers, ferry)
    except Exception as e:
        sys.stderr.write("embedded_push: error: %s: %s\n" % (type(e).__name__, e))
        emit({"ok": False, "error": "%s: %s" % (type(e).__name__, e)}, 1)
    if not args.no_table:
        print_table(result)
    emit(result, 0)


if __name__ == "__main__":
    main()

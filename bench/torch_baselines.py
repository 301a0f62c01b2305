#!/usr/bin/env python3
"""bench/torch_baselines.py: the PyTorch baselines `ferry bench` compares ferry's kernels against.

Run by `ferry bench scatter` as a child process (or by hand); prints exactly one JSON object on
stdout, as its last line:

  {"ok": true, ...numbers...}                 the baselines ran
  {"ok": false, "unavailable": "<reason>"}    torch (or CUDA in torch) is missing; exit 3
  {"ok": false, "error": "<reason>"}          the run failed; exit 1

Case `scatter`: the same layout as ferry's bench (bench/README.md): a bucket of COUNT bf16 tensors
of BYTES bytes each, back to back, copied into COUNT destination slots of one region, BYTES + GAP
bytes apart, in a fixed shuffled order. Measured, each as the median of REPEAT runs after WARMUP
runs (CUDA: torch.cuda.Event timing around the whole call, then synchronize; CPU: wall clock):

  loop     for d, s in zip(dst, src): d.copy_(s)      (what users write)
  foreach  torch._foreach_copy_(dst, src)              (the best plain torch call)
  flat     one copy_ of the whole bucket               (torch's view of the ceiling)

The destination is poisoned (0xA5) before each method; after it, a sample of tensors is compared
with the source and the gaps after them with the poison.

Case `cuda_ipc`: the colocated handoff users write today with torch.multiprocessing: this
process (the producer, the trainer) holds COUNT bf16 tensors of BYTES bytes on DEVICE; a consumer
process (spawn context, the rollout engine) holds its own preallocated parameters of the same
shapes. One call, timed on the producer's wall clock from the handoff started to the consumer's
"done" (after its copies and a synchronize), is one of:

  per_tensor  queue.put(list of the tensors) (CUDA IPC handles; torch's producer-side caches
              reused from the second call on); the consumer rebuilds them, copy_ each into its
              parameter, synchronizes, drops them and answers
  bucket      torch.cat of every tensor into one flattened bucket (as FlattenedTensorBucket-style
              code does), queue.put(bucket, offsets); the consumer copy_ each slice into its
              parameter, synchronizes, drops the bucket and answers

The first call of each method is reported apart (it opens the IPC handles for the first time);
then REPEAT calls: median and best. Before each call the producer changes every tensor (+1 on its
int16 view, outside the timing), so a stale parameter shows; after the last call the consumer
compares every parameter with the producer's tensors byte for byte (through the same sharing).
With DEVICE cpu the tensors travel through shared memory (a CPU check of the script itself).

Case `disk`: every *.safetensors file of the folder PATH loaded with
safetensors.torch.load_file(file, device=DEVICE), all files one after another, then
torch.cuda.synchronize(); wall clock, median of REPEAT runs after WARMUP runs. The tensors of a
run are dropped before the next one (torch's caching allocator keeps the memory, as ferry's
weight store keeps its own). Checked: the tensor count and byte total equal the files' headers.
"""

import argparse
import json
import platform
import statistics
import sys
import time

POISON = 0xA5


def emit(obj, code):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def unavailable(reason):
    sys.stderr.write("torch_baselines: unavailable: %s\n" % reason)
    emit({"ok": False, "unavailable": reason}, 3)


def timed(torch, fn, repeat, warmup, cuda):
    """Median seconds of `fn` over `repeat` runs after `warmup` runs, and every run."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    runs = []
    for _ in range(repeat):
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    return {"median_s": statistics.median(runs), "runs_s": runs}


def scatter(torch, args):
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    count, nbytes, gap = args.count, args.bytes, args.gap
    if count <= 0 or nbytes <= 0 or nbytes % 2 or gap < 0 or gap % 2:
        raise ValueError("need count > 0, bytes > 0 and even, gap >= 0 and even (bf16 views)")
    slot = nbytes + gap

    gen = torch.Generator(device=device)
    gen.manual_seed(1234)
    # Finite bf16 values (like weights): torch._foreach_copy_ moves bf16 through float on CUDA,
    # which does not keep NaN payloads, so random bytes would fail the byte-exact check below.
    src = torch.empty((count * nbytes,), dtype=torch.uint8, device=device)
    src.view(torch.bfloat16).normal_(generator=gen)
    dst = torch.empty((count * slot,), dtype=torch.uint8, device=device)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(5678)).tolist()
    src_views = [src[i * nbytes:(i + 1) * nbytes].view(torch.bfloat16) for i in range(count)]
    dst_views = [dst[order[i] * slot:order[i] * slot + nbytes].view(torch.bfloat16)
                 for i in range(count)]

    picked = sorted({0, count - 1} | {(i * 7919 + 13) % count for i in range(14)})
    failures = []

    def check(method):
        if cuda:
            torch.cuda.synchronize()
        for i in picked:
            # Compared as bytes: random bf16 bits include NaNs, which never compare equal.
            lo = order[i] * slot
            if not torch.equal(dst[lo:lo + nbytes], src[i * nbytes:(i + 1) * nbytes]):
                failures.append("%s: tensor %d differs from its source" % (method, i))
                return
            lo = order[i] * slot + nbytes
            if gap and not bool((dst[lo:lo + gap] == POISON).all()):
                failures.append("%s: the gap after tensor %d was overwritten" % (method, i))
                return

    def loop():
        for d, s in zip(dst_views, src_views):
            d.copy_(s)

    result = {
        "ok": True,
        "case": "scatter",
        "device": args.device,
        "count": count,
        "bytes": nbytes,
        "gap": gap,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor(),
        "timing": "torch.cuda.Event around the call, then synchronize" if cuda
                  else "time.perf_counter around the call",
    }

    dst.fill_(POISON)
    result["loop"] = timed(torch, loop, args.repeat, args.warmup, cuda)
    check("loop")

    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is None:
        result["foreach"] = {"unavailable": "torch %s has no torch._foreach_copy_" % torch.__version__}
    else:
        dst.fill_(POISON)
        result["foreach"] = timed(torch, lambda: foreach_copy(dst_views, src_views),
                                  args.repeat, args.warmup, cuda)
        check("foreach")

    flat_dst = dst[:count * nbytes]
    result["flat"] = timed(torch, lambda: flat_dst.copy_(src), args.repeat, args.warmup, cuda)
    if cuda:
        torch.cuda.synchronize()
    piece = 1 << 30  # compare in pieces: a whole-bucket torch.equal allocates a bucket of bools
    for lo in range(0, count * nbytes, piece):
        if not torch.equal(flat_dst[lo:lo + piece], src[lo:lo + piece]):
            failures.append("flat: the copy differs from its source at byte %d.." % lo)
            break

    result["verified"] = not failures
    result["verification"] = "; ".join(failures) if failures else (
        "%d sampled tensors equal their source and their gaps hold the poison, after loop and "
        "foreach; the flat copy equals the bucket" % len(picked))
    return result


def disk(torch, args):
    import glob
    import os
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file
    except Exception as e:
        unavailable("safetensors is not importable by %s: %s" % (sys.executable, e))
    cuda = args.device == "cuda"
    files = sorted(glob.glob(os.path.join(args.path, "*.safetensors")))
    if not files:
        raise ValueError("no *.safetensors files in %s" % args.path)
    expected_tensors = 0
    for f in files:
        with safe_open(f, framework="pt") as h:
            expected_tensors += len(list(h.keys()))

    state = {}

    def load():
        state.clear()
        loaded = {}
        for f in files:
            loaded.update(load_file(f, device=args.device))
        if cuda:
            torch.cuda.synchronize()
        state["tensors"] = loaded

    runs = []
    for i in range(args.warmup + args.repeat):
        state.clear()
        t0 = time.perf_counter()
        load()
        elapsed = time.perf_counter() - t0
        if i >= args.warmup:
            runs.append(elapsed)
    loaded = state["tensors"]
    nbytes = sum(t.numel() * t.element_size() for t in loaded.values())
    on_device = all(t.device.type == args.device for t in loaded.values())
    verified = len(loaded) == expected_tensors and on_device
    return {
        "ok": True,
        "case": "disk",
        "device": args.device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "files": len(files),
        "tensors": len(loaded),
        "bytes": nbytes,
        "median_s": statistics.median(runs),
        "runs_s": runs,
        "verified": verified,
        "verification": "%d tensors (%d bytes) loaded onto %s" % (len(loaded), nbytes, args.device),
    }


def fp8(torch, args):
    """Case fp8: COUNT bf16 matrices [ROWS, COLS] quantized to e4m3 with 128x128 block scales by
    the obvious code (view into blocks, amax, divide, cast), one matrix after another."""
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    rows, cols, count = args.rows, args.cols, args.count
    if rows % 128 or cols % 128:
        raise ValueError("the torch fp8 baseline needs ROWS and COLS divisible by 128")
    if not hasattr(torch, "float8_e4m3fn"):
        unavailable("torch %s has no float8_e4m3fn" % torch.__version__)
    gen = torch.Generator(device=device)
    gen.manual_seed(42)
    weights = [torch.empty((rows, cols), dtype=torch.bfloat16, device=device).normal_(
        0.0, 0.02, generator=gen) for _ in range(count)]

    def quantize(w):
        blocks = w.view(rows // 128, 128, cols // 128, 128).float()
        amax = blocks.abs().amax(dim=(1, 3), keepdim=True).clamp(min=1e-4)
        scale = amax / 448.0
        q = (blocks / scale).to(torch.float8_e4m3fn)
        return q.view(rows, cols), scale.view(rows // 128, cols // 128)

    def run():
        for w in weights:
            quantize(w)

    result = {"ok": True, "case": "fp8", "device": args.device, "count": count, "rows": rows,
              "cols": cols, "torch": torch.__version__, "python": platform.python_version()}
    result["fp8"] = timed(torch, run, args.repeat, args.warmup, cuda)
    return result


def moe(torch, args):
    """Case moe: LAYERS layers of EXPERTS experts (gate/up [INTER, HIDDEN], down [HIDDEN, INTER])
    from one bucket into stacked w13 [E, 2*INTER, HIDDEN] and w2 [E, HIDDEN, INTER] per layer:
    a per-tensor copy_ loop, and one torch._foreach_copy_ over every tensor."""
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    layers, experts, hidden, inter = args.layers, args.experts, args.hidden, args.inter
    n = hidden * inter
    bucket = torch.empty((experts * 3 * n,), dtype=torch.bfloat16, device=device).normal_()
    src = [bucket[i * n:(i + 1) * n] for i in range(experts * 3)]
    w13 = [torch.empty((experts, 2 * inter, hidden), dtype=torch.bfloat16, device=device)
           for _ in range(layers)]
    w2 = [torch.empty((experts, hidden, inter), dtype=torch.bfloat16, device=device)
          for _ in range(layers)]
    dst_views, src_views = [], []
    for layer in range(layers):
        for e in range(experts):
            dst_views += [w13[layer][e, :inter].view(-1), w13[layer][e, inter:].view(-1),
                          w2[layer][e].view(-1)]
            src_views += src[3 * e:3 * e + 3]

    def loop():
        for d, s in zip(dst_views, src_views):
            d.copy_(s)

    result = {"ok": True, "case": "moe", "device": args.device, "layers": layers,
              "experts": experts, "hidden": hidden, "inter": inter, "tensors": len(dst_views),
              "torch": torch.__version__, "python": platform.python_version()}
    result["loop"] = timed(torch, loop, args.repeat, args.warmup, cuda)
    foreach_copy = getattr(torch, "_foreach_copy_", None)
    if foreach_copy is None:
        result["foreach"] = {"unavailable": "torch %s has no torch._foreach_copy_" % torch.__version__}
    else:
        result["foreach"] = timed(torch, lambda: foreach_copy(dst_views, src_views), args.repeat,
                                  args.warmup, cuda)
    if cuda:
        torch.cuda.synchronize()
    result["verified"] = bool(torch.equal(w13[-1][experts - 1, inter:].reshape(-1),
                                          src[3 * experts - 2]))
    return result


def _ipc_consumer(device, count, numel, requests, answers):
    """The consumer process of case cuda_ipc: its own parameters, one answer per request."""
    import torch
    dev = torch.device(device)
    params = [torch.empty((numel,), dtype=torch.bfloat16, device=dev) for _ in range(count)]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    answers.put(("ready",))
    while True:
        msg = requests.get()
        kind = msg[0]
        if kind == "quit":
            return
        if kind == "poison":
            for p in params:
                p.view(torch.int16).fill_(-23131)  # 0xA5A5
            sync()
            answers.put(("done",))
        elif kind == "per_tensor":
            received = msg[1]
            for p, s in zip(params, received):
                p.copy_(s)
            sync()
            del received, msg
            answers.put(("done",))
        elif kind == "bucket":
            bucket, offsets = msg[1], msg[2]
            for p, off in zip(params, offsets):
                p.copy_(bucket[off:off + numel])
            sync()
            del bucket, msg
            answers.put(("done",))
        elif kind == "verify":
            received = msg[1]
            bad = [i for i, (p, s) in enumerate(zip(params, received))
                   if not torch.equal(p.view(torch.int16), s.view(torch.int16))]
            del received, msg
            answers.put(("verified", len(bad), bad[:5]))


def cuda_ipc(torch, args):
    import torch.multiprocessing as tmp
    cuda = args.device == "cuda"
    device = torch.device("cuda" if cuda else "cpu")
    count, nbytes = args.count, args.bytes
    if count <= 0 or nbytes <= 0 or nbytes % 2:
        raise ValueError("need count > 0 and bytes > 0 and even (bf16 tensors)")
    numel = nbytes // 2
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in ("per_tensor", "bucket"):
            raise ValueError("unknown method %r (per_tensor, bucket)" % m)
    gen = torch.Generator(device=device)
    gen.manual_seed(4321)
    tensors = [torch.empty((numel,), dtype=torch.bfloat16, device=device).normal_(generator=gen)
               for _ in range(count)]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()

    ctx = tmp.get_context("spawn")
    requests, answers = ctx.Queue(), ctx.Queue()
    consumer = ctx.Process(target=_ipc_consumer,
                           args=(args.device, count, numel, requests, answers), daemon=True)
    consumer.start()

    def answer(expected):
        while True:
            try:
                msg = answers.get(timeout=5)
                break
            except Exception:  # queue.Empty: is the consumer still there?
                if not consumer.is_alive():
                    raise RuntimeError("the consumer process died (exit code %s)"
                                       % consumer.exitcode)
        if msg[0] != expected:
            raise RuntimeError("the consumer answered %r, expected %r" % (msg[0], expected))
        return msg

    result = {"ok": True, "case": "cuda_ipc", "device": args.device, "count": count,
              "bytes": nbytes, "total_bytes": count * nbytes, "repeat": args.repeat,
              "torch": torch.__version__, "torch_cuda": torch.version.cuda,
              "python": platform.python_version(),
              "device_name": torch.cuda.get_device_name() if cuda else platform.processor(),
              "sharing_strategy": tmp.get_sharing_strategy(),
              "timing": "time.perf_counter on the producer, from the handoff started to the "
                        "consumer's answer after its copies and a synchronize"}
    failures = []
    try:
        answer("ready")
        offsets = [i * numel for i in range(count)]
        for method in methods:
            requests.put(("poison",))
            answer("done")
            runs = []
            for call in range(1 + args.repeat):
                for t in tensors:  # new weights for this call, outside the timing
                    t.view(torch.int16).add_(1)
                sync()
                t0 = time.perf_counter()
                if method == "per_tensor":
                    requests.put(("per_tensor", tensors))
                    answer("done")
                else:
                    bucket = torch.cat([t.view(-1) for t in tensors])
                    requests.put(("bucket", bucket, offsets))
                    answer("done")
                runs.append(time.perf_counter() - t0)
                if method == "bucket":
                    del bucket
            requests.put(("verify", tensors))
            _, bad, first_bad = answer("verified")
            if bad:
                failures.append("%s: %d of %d parameters differ from the producer's tensors "
                                "(first: %s)" % (method, bad, count, first_bad))
            steady = runs[1:]
            result[method] = {"first_s": runs[0], "median_s": statistics.median(steady),
                              "best_s": min(steady), "runs_s": steady}
        requests.put(("quit",))
        consumer.join(timeout=30)
    finally:
        if consumer.is_alive():
            consumer.kill()
    result["verified"] = not failures
    result["verification"] = "; ".join(failures) if failures else (
        "after the last call of each method every consumer parameter equals the producer's "
        "tensor byte for byte")
    return result


def main():
    parser = argparse.ArgumentParser(description="PyTorch baselines for ferry bench")
    parser.add_argument("--case", choices=["scatter", "disk", "fp8", "moe", "cuda_ipc"],
                        required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--count", type=int, help="tensors (scatter)")
    parser.add_argument("--bytes", type=int, help="bytes per tensor (scatter)")
    parser.add_argument("--path", help="folder of *.safetensors files (disk)")
    parser.add_argument("--gap", type=int, default=512, help="bytes between destination slots")
    parser.add_argument("--rows", type=int, default=4096, help="matrix rows (fp8)")
    parser.add_argument("--cols", type=int, default=7168, help="matrix columns (fp8)")
    parser.add_argument("--layers", type=int, default=48, help="layers (moe)")
    parser.add_argument("--experts", type=int, default=128, help="experts per layer (moe)")
    parser.add_argument("--hidden", type=int, default=2048, help="hidden size (moe)")
    parser.add_argument("--inter", type=int, default=768, help="moe_intermediate_size (moe)")
    parser.add_argument("--methods", default="per_tensor,bucket",
                        help="comma-separated: per_tensor, bucket (cuda_ipc)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.repeat <= 0 or args.warmup < 0:
        parser.error("--repeat must be positive and --warmup not negative")
    if args.case in ("scatter", "cuda_ipc") and (args.count is None or args.bytes is None):
        parser.error("--case %s needs --count and --bytes" % args.case)
    if args.case == "disk" and not args.path:
        parser.error("--case disk needs --path")

    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising anything else
        unavailable("torch is not importable by %s: %s" % (sys.executable, e))
    if args.device == "cuda" and not torch.cuda.is_available():
        unavailable("torch %s sees no CUDA device (torch.cuda.is_available() is False)"
                    % torch.__version__)

    try:
        result = {"scatter": scatter, "disk": disk, "fp8": fp8, "moe": moe,
                  "cuda_ipc": cuda_ipc}[args.case](torch, args)
    except Exception as e:
        sys.stderr.write("torch_baselines: error: %s: %s\n" % (type(e).__name__, e))
        emit({"ok": False, "error": "%s: %s" % (type(e).__name__, e)}, 1)
    emit(result, 0)


if __name__ == "__main__":
    main()

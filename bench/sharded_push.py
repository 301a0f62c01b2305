#!/usr/bin/env python3
"""bench/sharded_push.py: a sharded trainer's push, timed against the one-sender push of the same
model in the same run (docs/sharded.md). S sender processes (this script, --role sender), rank r
holding rows [r*n/S, (r+1)*n/S) of every tensor of a Qwen3-shaped model (FSDP-style dim-0
shards, as ferry.Block views of its own device memory), push one version together into R
`ferry serve` receivers on the same device; then this process, holding the whole model, pushes
the same values as the next version with one ferry.Sender into the same receivers.

Run by `ferry bench sharded` as a child process (or by hand); prints exactly one JSON object on
stdout, as its last line (the protocol of bench/embedded_push.py):

  {"ok": true, ...numbers...}                 the bench ran (see "verified")
  {"ok": false, "unavailable": "<reason>"}    torch, CUDA, ferry or the ferry executable is
                                              missing; exit 3
  {"ok": false, "error": "<reason>"}          the run failed; exit 1

The model: hidden 4096, intermediate 12288, 32 heads, 8 KV heads, head_dim 128, vocab 151936,
untied lm_head, --layers N (36: Qwen3-8B, 16.38 GB of bf16), values a function of the element's
global index and the round's seed (no download, no transformers needed). With --device cpu the
same flow runs on host tensors of a tiny model (hidden 256): over UCX or inline on a CPU machine.

Per S (--senders, default 1,2,4) and round (--rounds, default 3): every sender refills its
shards with the round's values, the sharded push runs (timed from the first rank's push() call to
the last rank's return on CLOCK_MONOTONIC, which every process here shares: what a trainer
whose ranks push together waits; each rank's push returns once every receiver committed; the
round, from this process telling the senders to push to the last one's answer through their
pipes, is reported beside it), every receiver's /get_fingerprints is read; then the one-sender push of the
same values (timed), the fingerprints again. Verified: every sharded version equal to the
one-sender push of the same values on every receiver (and different from the round before), and
each receiver's report of bytes moved per rank adding up to its bytes needed. The ceiling, in the
same run: one device-to-device copy of the model's bytes (--device cuda), times R (each receiver
writes the whole model: receivers with a tensor-parallel size do not take part yet).

Usage: sharded_push.py [--senders 1,2,4] [--receivers 2] [--layers 36] [--rounds 3]
                       [--transport auto] [--bucket-mib 0] [--delivery auto|direct|staged]
                       [--no-keep] [--lend]
                       [--ferry PATH] [--device cuda|cpu]
                       [--log-dir DIR]
                       [--no-table]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embedded_push as common  # noqa: E402  (the child protocol and the D2D ceiling)

TARGET = 0.70  # the target for 4 senders on the H200: >= 0.7 of D2D


def unavailable(reason):
    sys.stderr.write("sharded_push: unavailable: %s\n" % reason)
    common.emit({"ok": False, "unavailable": reason}, 3)


def note(text):
    sys.stderr.write("sharded_push: %s\n" % text)
    sys.stderr.flush()


def model_shapes(layers, device):
    """[(name, shape)] of a Qwen3 checkpoint's tensors (Hugging Face names)."""
    if device == "cpu":
        vocab, hidden, inter, heads, kv, hd = 4096, 256, 768, 4, 2, 64
    else:
        vocab, hidden, inter, heads, kv, hd = 151936, 4096, 12288, 32, 8, 128
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", (hidden,)),
                (p + "self_attn.q_proj.weight", (heads * hd, hidden)),
                (p + "self_attn.k_proj.weight", (kv * hd, hidden)),
                (p + "self_attn.v_proj.weight", (kv * hd, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, heads * hd)),
                (p + "self_attn.q_norm.weight", (hd,)),
                (p + "self_attn.k_norm.weight", (hd,)),
                (p + "post_attention_layernorm.weight", (hidden,)),
                (p + "mlp.gate_proj.weight", (inter, hidden)),
                (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def rows_of(n, rank, world):
    return n * rank // world, n * (rank + 1) // world


def fill(torch, t, seed, tensor_index, row0):
    """Writes the values of rows [row0, row0 + len(t)) of tensor `tensor_index` for `seed` into t:
    a function of the global element index (so every rank computes its own rows alone)."""
    cols = 1
    for d in t.shape[1:]:
        cols *= d
    flat = t.view(t.shape[0], cols)
    step = max(1, (1 << 24) // cols)
    for lo in range(0, t.shape[0], step):
        hi = min(t.shape[0], lo + step)
        idx = torch.arange((row0 + lo) * cols, (row0 + hi) * cols, device=t.device,
                           dtype=torch.int64)
        v = (idx * 2654435761 + seed * 40503 + tensor_index * 9973) % 65521
        flat[lo:hi].copy_((v.to(torch.float32) / 65521.0 - 0.5).view(hi - lo, cols))


def device_of(args):
    return "cuda:0" if args.device == "cuda" else "cpu"


# ---- a sender rank (a child process) ----------------------------------------------------------

def sender_main(args):
    if os.environ.get("FERRY_LOG_LEVEL") == "debug":  # bench --log-dir: push()'s Python timings
        import logging
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    import torch
    import ferry
    shapes = model_shapes(args.layers, args.device)
    shards = []
    for i, (name, shape) in enumerate(shapes):
        lo, hi = rows_of(shape[0], args.rank, args.world)
        shards.append((name, shape, lo,
                       torch.empty((hi - lo,) + tuple(shape[1:]), dtype=torch.bfloat16,
                                   device=device_of(args))))
    sender = ferry.Sender(args.to.split(","), transport=args.transport, progress=False,
                          bucket_bytes=args.bucket_mib << 20, update__delivery=args.delivery,
                          update__keep_sessions=not args.no_keep)
    print(json.dumps({"ready": True, "bytes": sum(t.numel() * 2 for *_, t in shards)}),
          flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        try:
            if words[0] == "fill":
                seed = int(words[1])
                for i, (name, shape, lo, t) in enumerate(shards):
                    fill(torch, t, seed, i, lo)
                if args.device == "cuda":
                    torch.cuda.synchronize()
                print(json.dumps({"filled": seed}), flush=True)
            elif words[0] == "push":
                t_got = time.time()
                called = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
                version = int(words[1])
                state = {name: ferry.Block(t, shape, (lo,) + (0,) * (len(shape) - 1))
                         for name, shape, lo, t in shards}
                t0 = time.perf_counter()
                report = sender.push(state, version, check=False, rank=args.rank,
                                     world=args.world)
                seconds = time.perf_counter() - t0
                returned = time.monotonic()
                print(json.dumps({
                    "pushed": version, "seconds": seconds, "committed": report.all_committed,
                    "called_mono": called, "returned_mono": returned,
                    "got_at": t_got, "returned_at": time.time(),
                    "errors": [r.error for r in report.receivers if not r.committed],
                    "transports": [r.transport for r in report.receivers],
                    "direct": [r.direct for r in report.receivers],
                    "rank_bytes": [list(r.rank_bytes) for r in report.receivers],
                    "needed_bytes": [r.needed_bytes for r in report.receivers]}), flush=True)
            else:
                print(json.dumps({"failure": "unknown command %r" % words[0]}), flush=True)
        except Exception as e:
            print(json.dumps({"failure": "%s: %s" % (type(e).__name__, e)}), flush=True)
    sender.close()
    return 0


def rank_log(log_dir, world, rank):
    """With --log-dir, a sender rank's stderr goes to a file there and it logs at debug level
    (push()'s Python phases and the C++ sender's); without, it shares our stderr."""
    if not log_dir:
        return {}
    return {"stderr": open(os.path.join(log_dir, "sender-%d-of-%d.log" % (rank, world)), "w"),
            "env": dict(os.environ, FERRY_LOG_LEVEL="debug")}


# ---- the receivers: `ferry serve` processes -----------------------------------------------------

class Serve:
    def __init__(self, ferry_exe, device, folder, index, log_dir=None, tp_size=0, family=""):
        self.ready_file = os.path.join(folder, "serve-%d.port" % index)
        self.log_path = os.path.join(log_dir or folder, "serve-%d.log" % index)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [ferry_exe, "--log-level", "debug" if log_dir else "warn", "serve", "--port", "0",
             "--ready-file",
             self.ready_file, "--device", device]
            + (["--model-family", family or "dense", "--tp-rank", str(index), "--tp-size",
                str(tp_size)] if tp_size else ["--model-family", family or "identity"]),
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not (os.path.exists(self.ready_file) and os.path.getsize(self.ready_file) > 0):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("ferry serve %d did not start: %s" % (index, self.tail()))
            time.sleep(0.05)
        with open(self.ready_file) as f:
            self.address = "127.0.0.1:%d" % int(f.read().strip())

    def tail(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-2000:]

    def lend(self):
        """The colocated loop's lend: release and resume of every memory tag (kept sessions
        are suspended; the next pushes rejoin them)."""
        for route in ("release_memory_occupation", "resume_memory_occupation"):
            req = urllib.request.Request("http://%s/%s" % (self.address, route), data=b"{}",
                                         method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                if r.status != 200:
                    raise RuntimeError("ferry serve %s: %s answered %d" % (self.address, route,
                                                                            r.status))

    def fingerprints(self):
        with urllib.request.urlopen("http://%s/get_fingerprints" % self.address,
                                    timeout=120) as r:
            body = json.loads(r.read())
        return body["weight_version"], body["fingerprints"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


# ---- the bench (this process) -----------------------------------------------------------------

def bench_main(args, torch, ferry):
    shapes = model_shapes(args.layers, args.device)
    model_bytes = sum(2 * _numel(s) for _, s in shapes)
    note("%d tensors, %.2f GB bf16, %s senders into %d receivers on %s"
         % (len(shapes), model_bytes / 1e9, args.senders, args.receivers, args.device))
    whole = [(name, torch.empty(shape, dtype=torch.bfloat16, device=device_of(args)))
             for name, shape in shapes]
    folder = tempfile.mkdtemp(prefix="ferry-sharded-bench-")
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    serves = []
    try:
        for i in range(args.receivers):
            serves.append(Serve(args.ferry, device_of(args), folder, i, args.log_dir,
                                args.receivers if args.tp else 0, args.receiver_family))
        addresses = [s.address for s in serves]
        one = ferry.Sender(addresses, transport=args.transport, progress=False,
                           update__delivery=args.whole_delivery)
        version = [0]

        def push_whole(seed):
            for i, (name, t) in enumerate(whole):
                fill(torch, t, seed, i, 0)
            common.sync(torch, args.device)
            version[0] += 1
            t0 = time.perf_counter()
            report = one.push(dict(whole), version[0], check=False)
            seconds = time.perf_counter() - t0
            if not report.all_committed:
                raise RuntimeError("the one-sender push of version %d failed: %s"
                                   % (version[0], report))
            return seconds, report

        first_s, first_report = push_whole(0)  # creates the receivers' layout
        rows, verified, notes = [], True, []
        previous = [s.fingerprints()[1] for s in serves]
        for world in args.senders:
            senders = [common.Child([sys.executable, os.path.abspath(__file__), "--role",
                                     "sender", "--rank", str(r), "--world", str(world),
                                     "--to", ",".join(addresses), "--layers", str(args.layers),
                                     "--device", args.device, "--transport", args.transport,
                                     "--bucket-mib", str(args.bucket_mib),
                                     "--delivery", "staged" if r in args.staged_ranks
                                     else args.delivery]
                                    + (["--no-keep"] if args.no_keep else []),
                                    "sender rank %d of %d" % (r, world),
                                    **rank_log(args.log_dir, world, r))
                       for r in range(world)]
            try:
                for s in senders:
                    s.answer(args.answer_timeout)
                sharded_s, whole_s, transports = [], [], set()
                rank_push_s, last_start_s, span_s = [], [], []
                moved_ratio = 0.0  # the largest bytes moved / bytes needed of a receiver
                direct_ranks = [True] * world
                for k in range(args.rounds):
                    seed = 1000 * world + k + 1
                    for s in senders:
                        s.proc.stdin.write("fill %d\n" % seed)
                        s.proc.stdin.flush()
                    for s in senders:
                        s.answer(args.answer_timeout)
                    if args.lend:
                        for serve in serves:
                            serve.lend()
                    version[0] += 1
                    t0 = time.perf_counter()
                    wall0 = time.time()
                    for s in senders:
                        s.proc.stdin.write("push %d\n" % version[0])
                        s.proc.stdin.flush()
                    answers = [s.answer(args.answer_timeout) for s in senders]
                    sharded_s.append(time.perf_counter() - t0)
                    # The trainer's view: from the first rank's push() call (its Blocks built
                    # inside) to the last rank's return, on the clock all processes share; the
                    # round above adds this bench's own pipes and process wake-ups.
                    span_s.append(max(a["returned_mono"] for a in answers)
                                  - min(a["called_mono"] for a in answers))
                    # Where a round's time goes: the ranks' push() calls, and how late the last
                    # one began (a rank's process waking up and building its Blocks).
                    rank_push_s.append(max(a["seconds"] for a in answers))
                    last_start_s.append(max(a["got_at"] for a in answers) - wall0)
                    for r, a in enumerate(answers):
                        if not a["committed"]:
                            raise RuntimeError("rank %d of %d: version %d failed: %s"
                                               % (r, world, version[0], a["errors"]))
                        transports.update(a["transports"])
                        direct_ranks[r] = direct_ranks[r] and all(a["direct"])
                    moved = [sum(b) for b in answers[0]["rank_bytes"]]
                    for i, needed in enumerate(answers[0]["needed_bytes"]):
                        moved_ratio = max(moved_ratio, moved[i] / needed if needed else
                                          float("inf"))
                    sharded = [s.fingerprints() for s in serves]
                    seconds, _ = push_whole(seed)
                    whole_s.append(seconds)
                    reference = [s.fingerprints() for s in serves]
                    for i in range(len(serves)):
                        same = sharded[i][1] == reference[i][1]
                        fresh = sharded[i][1] != previous[i]
                        if not (same and fresh):
                            verified = False
                            notes.append("receiver %d, %d senders, round %d: %s" % (
                                i, world, k, "not the one-sender push's values" if not same
                                else "unchanged from the round before"))
                    previous = [r[1] for r in reference]
                rows.append({"senders": world, "sharded_median_s": statistics.median(span_s),
                             "sharded_best_s": min(span_s),
                             "round_median_s": statistics.median(sharded_s),
                             "slowest_rank_push_median_s": statistics.median(rank_push_s),
                             "last_rank_start_median_s": statistics.median(last_start_s),
                             "whole_median_s":
                             statistics.median(whole_s), "transports": sorted(transports),
                             "moved_equals_needed": moved_ratio == 1.0,
                             "moved_over_needed": moved_ratio, "moved_bytes": moved,
                             "direct": all(direct_ranks),
                             "direct_ranks": direct_ranks,
                             "rank_bytes": answers[0]["rank_bytes"][0],
                             "needed_bytes": answers[0]["needed_bytes"][0]})
                # Each receiver takes every byte it needs, once.
                if moved_ratio != 1.0:
                    verified = False
                    notes.append("%d senders: a receiver took %.3f x the bytes it needs"
                                 % (world, moved_ratio))
            finally:
                for s in senders:
                    s.close()
        one.close()
    finally:
        for s in serves:
            s.close()
        shutil.rmtree(folder, ignore_errors=True)  # the port files (and logs without --log-dir)
    d2d = None
    if args.device == "cuda":
        runs, same = common.d2d_ceiling(torch, model_bytes, 10, args.device)
        d2d = statistics.median(runs) if same else None
    for row in rows:
        # The ceiling: one device copy of the bytes the receivers took (the whole model each for
        # the one-sender push, which sends every receiver every tensor whole).
        moved = sum(row["moved_bytes"]) / model_bytes
        row["of_d2d"] = (moved * d2d / row["sharded_median_s"]) if d2d else None
        row["round_of_d2d"] = (moved * d2d / row["round_median_s"]) if d2d else None
        # (Tensor-parallel receivers take one copy of the model between them.)
        whole_copies = 1 if args.tp else args.receivers
        row["whole_of_d2d"] = (whole_copies * d2d / row["whole_median_s"]) if d2d else None
        row["vs_whole"] = row["whole_median_s"] / row["sharded_median_s"]
        # Aggregate throughput: the bytes every receiver took, over the sharded push's time.
        row["gb_per_s"] = sum(row["moved_bytes"]) / row["sharded_median_s"] / 1e9
    return {"ok": True, "device": args.device,
            "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
            "layers": args.layers, "tensors": len(shapes), "model_bytes": model_bytes,
            "receivers": args.receivers, "tp": args.tp, "transport": args.transport,
            "rounds": args.rounds,
            "bucket_mib": args.bucket_mib, "delivery": args.delivery, "kept": not args.no_keep,
            "lend": args.lend,
            "first_push_s": first_s, "first_transport": first_report.receivers[0].transport,
            "first_direct": first_report.receivers[0].direct,
            "whole_delivery": args.whole_delivery, "receiver_family": args.receiver_family,
            "whole_reads_in_place": all(x.reads_in_place for x in first_report.receivers),
            "d2d_s": d2d, "target": TARGET, "rows": rows, "verified": verified,
            "verification": "; ".join(notes) or
            "every sharded version equal to the one-sender push of the same values on every "
            "receiver, bytes moved = bytes needed"}


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def ms(s):
    return "-" if s is None else "%.2f" % (s * 1e3)


def print_table(r):
    out = sys.stderr
    out.write("\nsharded push: %d layers, %d tensors, %.2f GB bf16 into %d receivers%s on %s "
              "(%s)\n" % (r["layers"], r["tensors"], r["model_bytes"] / 1e9, r["receivers"],
                          " (tensor-parallel ranks)" if r["tp"] else "", r["device_name"],
                          r["transport"]))
    out.write("%8s %14s %10s %14s %10s %10s %10s %12s %8s  %s\n" % (
        "senders", "sharded ms", "GB/s", "one sender ms", "vs one", "of D2D", "one/D2D",
        "moved/needed", "direct", "transports"))
    for row in r["rows"]:
        of = "-" if row["of_d2d"] is None else "%.2f" % row["of_d2d"]
        wof = "-" if row["whole_of_d2d"] is None else "%.2f" % row["whole_of_d2d"]
        out.write("%8d %14s %10.2f %14s %10.2f %10s %10s %12.3f %8s  %s\n" % (
            row["senders"], ms(row["sharded_median_s"]), row["gb_per_s"], ms(row["whole_median_s"]),
            row["vs_whole"], of, wof, row["moved_over_needed"], "yes" if row["direct"] else "no",
            ",".join(row["transports"])))
    out.write("where the sharded time goes (medians): " + "; ".join(
        "%d senders: the last rank read the push command %s ms in, the slowest push() took %s ms" % (
            row["senders"], ms(row["last_rank_start_median_s"]),
            ms(row["slowest_rank_push_median_s"])) for row in r["rows"]) + "\n")
    out.write("the one sender (update.delivery = %s): %s\n" % (
        r["whole_delivery"], "direct" if r["first_direct"] else
        "read in place by the receivers" if r["whole_reads_in_place"] else "staged"))
    out.write("verified: %s (%s)\n" % ("yes" if r["verified"] else "NO", r["verification"]))
    out.flush()


def what_a_run_needs(args, unavailable):
    """torch (with CUDA for --device cuda), ferry's Python package with its libferry.so, and the
    ferry executable the `ferry serve` children run (args.ferry); calls unavailable(reason),
    which exits, for the first one missing. Returns (torch, ferry)."""
    try:
        import torch
    except Exception as e:
        unavailable("torch is not importable by %s: %s" % (sys.executable, e))
    if args.device == "cuda" and not torch.cuda.is_available():
        unavailable("torch %s sees no CUDA device" % torch.__version__)
    try:
        import ferry
        ferry.library_path()
    except Exception as e:
        unavailable("the ferry package or libferry.so is not found by %s: %s" % (sys.executable, e))
    try:
        subprocess.run([args.ferry, "--version"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=True, timeout=60)
    except Exception as e:
        unavailable("the ferry executable %r does not run: %s (--ferry or $FERRY_EXE)"
                    % (args.ferry, e))
    return torch, ferry


def run_and_emit(name, run, print_table, args):
    """Runs the bench (run() returns its result), prints its table unless --no-table, and emits
    the result: exit 0 when verified, 1 otherwise or when it failed (named on stderr)."""
    try:
        result = run()
    except Exception as e:
        sys.stderr.write("%s: error: %s: %s\n" % (name, type(e).__name__, e))
        common.emit({"ok": False, "error": "%s: %s" % (type(e).__name__, e)}, 1)
    if not args.no_table:
        print_table(result)
    common.emit(result, 0 if result["verified"] else 1)


def main():
    parser = argparse.ArgumentParser(description="ferry bench sharded: S sender ranks vs one")
    parser.add_argument("--role", choices=["bench", "sender"], default="bench",
                        help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--to", default="", help=argparse.SUPPRESS)
    parser.add_argument("--senders", default="1,2,4", help="sender counts, comma-separated")
    parser.add_argument("--receivers", type=int, default=2, help="ferry serve receivers (2)")
    parser.add_argument("--tp", action="store_true",
                        help="the receivers are the tensor-parallel ranks of one engine (dense "
                             "engine layout, tp_size = --receivers): each takes only what its "
                             "plan reads")
    parser.add_argument("--layers", type=int, default=36, help="decoder layers (36: Qwen3-8B)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per sender count (3)")
    parser.add_argument("--transport", default="auto", help="the Senders' transport (auto)")
    parser.add_argument("--ferry", default=os.environ.get("FERRY_EXE", "ferry"),
                        help="the ferry executable the receivers run ($FERRY_EXE or ferry)")
    parser.add_argument("--bucket-mib", type=int, default=0,
                        help="the sender ranks' bucket size in MiB (0: ferry's default, 256 MiB "
                             "or the largest block)")
    parser.add_argument("--delivery", choices=["auto", "direct", "staged"], default="auto",
                        help="the sender ranks' update.delivery (auto and direct: their pieces "
                             "straight into the receivers' parameters where the transport "
                             "writes device memory; staged: through the receivers' slots)")
    parser.add_argument("--receiver-family", default="",
                        help="the receivers' model family (default: dense with --tp, else "
                             "identity; lowbit: FP8 block quantisation on arrival)")
    parser.add_argument("--whole-delivery", choices=["auto", "direct", "staged"], default="auto",
                        help="the one sender's update.delivery (auto: straight into the "
                             "receivers' parameters where every plan is a copy, else read in "
                             "place by the receivers where the transport maps the sender's "
                             "memory, else staged)")
    parser.add_argument("--staged-ranks", default="", help=argparse.SUPPRESS)
    parser.add_argument("--no-keep", action="store_true",
                        help="the sender ranks open new sessions for every push (update."
                             "keep_sessions = false) instead of keeping them")
    parser.add_argument("--lend", action="store_true",
                        help="before each round every receiver releases and resumes its memory "
                             "(kept sessions suspended, then rejoined by the round's pushes)")
    parser.add_argument("--log-dir", default=None,
                        help="keep each receiver's log here, at debug level (where time goes)")
    parser.add_argument("--answer-timeout", type=float, default=300,
                        help="seconds to wait for a sender at any point (300)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (cuda:0); cpu: host tensors of a tiny model")
    parser.add_argument("--no-table", action="store_true",
                        help="no table on stderr (ferry bench sharded prints its own)")
    args = parser.parse_args()
    try:
        args.senders = [int(s) for s in str(args.senders).split(",") if s]
        args.staged_ranks = {int(s) for s in str(args.staged_ranks).split(",") if s}
    except ValueError:
        parser.error("--senders (and --staged-ranks) take numbers separated by commas, e.g. 1,2,4")
    if (not args.senders or min(args.senders) < 1 or args.receivers < 1 or args.layers < 1
            or args.rounds < 1):
        parser.error("need --senders >= 1, --receivers >= 1, --layers >= 1 and --rounds >= 1")

    if args.role == "sender":
        try:
            return sender_main(args)
        except Exception as e:
            print(json.dumps({"failure": "%s: %s" % (type(e).__name__, e)}), flush=True)
            return 1

    torch, ferry = what_a_run_needs(args, unavailable)
    run_and_emit("sharded_push", lambda: bench_main(args, torch, ferry), print_table, args)


if __name__ == "__main__":
    main()

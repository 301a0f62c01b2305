#!/usr/bin/env python3
"""bench/host_cost.py: a probe run by hand: what the host spends on one push of many small
tensors, a MoE trainer's shape of push (docs/benchmarks.md, "The host side of a push of 4719
tensors"). No GPU: host tensors of 4x8 float32 (bytes are not the point), named as a MoE's
per-expert weights, pushed --pushes times by one ferry.Sender (kept session) into an embedded
ferry.Receiver of the same process over the inline transport.

Per push, from the ferry.sender debug line (Python) and the sender's C++ debug line:
  export    Python's description of the tensors (the cached views' check)
  C API     ferry_sender_push's time less the C++ push's total: reading the descriptions
  checks    the C++ push's "checks and buckets"
  C++ push  the C++ push's total (sessions included)
The first two pushes (session set-up, first descriptions) are left out; min and median of the
rest. Prints a table; --json FILE writes the numbers. Exits 1 when a push did not commit, 0
without torch (saying so).

Usage: host_cost.py [--tensors 4719] [--pushes 30] [--json FILE]
(FERRY_LIBRARY names libferry.so; the measuring runs in a child process with FERRY_LOG_LEVEL=debug.)
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def child(tensors, pushes):
    import logging

    try:
        import torch
    except ImportError as e:
        print("UNAVAILABLE PyTorch is not installed (%s)" % e)
        return 0

    import ferry

    parts = ("gate_proj", "up_proj", "down_proj")
    names = ["model.layers.%d.mlp.experts.%d.%s.weight" % (i // 384, (i // 3) % 128, parts[i % 3])
             for i in range(tensors)]
    source = {n: torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False) for n in names}
    target = {n: torch.zeros(4, 8) for n in names}
    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("ferry.sender")
    log.setLevel(logging.DEBUG)
    log.addHandler(Keep())
    with ferry.Receiver() as receiver:
        receiver.register_params(target)
        receiver.serve(port=0)
        with ferry.Sender([receiver.address], transport="inline") as sender:
            for version in range(1, pushes + 1):
                report = sender.push(source, version=version, check=False)
                if not report.all_committed:
                    print(json.dumps({"error": "push %d did not commit: %s" % (version, report)}))
                    return 1
    for line in lines:
        m = re.search(r"push of version (\d+): .*exported in ([\d.]+) ms .*ferry_sender_push "
                      r"([\d.]+) ms", line)
        if m:
            print("PY %s %s %s" % m.groups())
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=4719)
    parser.add_argument("--pushes", type=int, default=30)
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tensors < 1 or args.pushes < 3:
        parser.error("need --tensors >= 1 and --pushes >= 3")
    if args.child:
        return child(args.tensors, args.pushes)
    env = dict(os.environ, FERRY_LOG_LEVEL="debug")
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--tensors",
                          str(args.tensors), "--pushes", str(args.pushes)],
                         capture_output=True, text=True, env=env, timeout=600)
    if run.returncode != 0:
        sys.stderr.write(run.stdout[-2000:] + run.stderr[-4000:])
        return 1
    python = {}
    for line in run.stdout.splitlines():
        if line.startswith("UNAVAILABLE "):
            print("host_cost: unavailable: %s" % line[len("UNAVAILABLE "):])
            return 0
        if line.startswith("PY "):
            _, version, exported, called = line.split()
            python[int(version)] = (float(exported), float(called))
    cpp = {}
    for line in run.stderr.splitlines():
        m = re.search(r"push of version (\d+): \d+ tensors, .*checks and buckets ([\d.]+) ms.*"
                      r"total ([\d.]+) ms", line)
        if m:
            cpp[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    versions = [v for v in sorted(python) if v > 2 and v in cpp]
    if not versions:
        sys.stderr.write("host_cost: no timed push in the child's logs\n" + run.stderr[-4000:])
        return 1
    rows = {
        "export": [python[v][0] for v in versions],
        "C API": [python[v][1] - cpp[v][1] for v in versions],
        "checks": [cpp[v][0] for v in versions],
        "C++ push": [cpp[v][1] for v in versions],
    }
    print("host cost of a push of %d tensors (pushes 3..%d), ms" % (args.tensors, args.pushes))
    print("%-10s %9s %9s" % ("", "min", "median"))
    result = {"tensors": args.tensors, "pushes": args.pushes, "ms": {}}
    for name, values in rows.items():
        low, mid = min(values), statistics.median(values)
        print("%-10s %9.3f %9.3f" % (name, low, mid))
        result["ms"][name] = {"min": low, "median": mid}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

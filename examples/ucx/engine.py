#!/usr/bin/env python3
"""examples/ucx/engine.py: the engine node of the cross-node form: runs `ferry serve` listening
on every interface (--host 0.0.0.0), identity model (the trainer's state_dict names are the
parameter names), weights on --device. It takes its layout from the first push and serves the
control API on --port; trainers push to NODE_ADDRESS:PORT over UCX. Ctrl-C stops it.

    python3 examples/ucx/engine.py --port 30000 [--device cuda:0] [--token T]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_serve_arguments(parser, host="0.0.0.0")
    parser.add_argument("--device", default="cpu", help="where the weights live (cpu, cuda:N)")
    args = parser.parse_args()
    ex.exec_serve(args, ["--device", args.device])


if __name__ == "__main__":
    ex.run_main(main)

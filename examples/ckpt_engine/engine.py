#!/usr/bin/env python3
"""examples/ckpt_engine/engine.py: the engine of the checkpoint-engine form: runs `ferry serve`
on --device (the GPU the ParameterServer of this node shares its buffer on), identity model,
loading --model-path first (checkpoint-engine names no tensors in advance: the receiver's layout
comes from that checkpoint). The trainer's ParameterServer (examples/ckpt_engine/trainer.py)
updates it through POST /update_weights_from_ipc. Ctrl-C stops it.

    python3 examples/ckpt_engine/engine.py --device cuda:0 --model-path ckpt/initial
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_serve_arguments(parser)
    parser.add_argument("--device", default="cuda:0", help="the engine's GPU (cuda:0)")
    parser.add_argument("--model-path", required=True,
                        help="safetensors file or folder to load first (trainer.py "
                             "--write-initial writes one)")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        raise ex.ExampleError(f"--device {args.device}: checkpoint-engine shares its buffer by "
                              "CUDA IPC; the engine's weights must be on a GPU (cuda:N)")
    if not os.path.exists(args.model_path):
        raise ex.ExampleError(f"--model-path {args.model_path}: no such file or folder")
    ex.exec_serve(args, ["--device", args.device, "--model-path", args.model_path])


if __name__ == "__main__":
    ex.run_main(main)

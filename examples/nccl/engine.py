#!/usr/bin/env python3
"""examples/nccl/engine.py: one engine of the disaggregated form: runs `ferry serve` with its
weights on --device (a GPU of its own), identity model, NCCL_NVLS_ENABLE=0. The trainer
(examples/nccl/trainer.py, NCCL rank 0) makes it join a weight-update group
(/init_weights_update_group) and broadcasts every update to it
(/update_weights_from_distributed). Ctrl-C stops it.

    python3 examples/nccl/engine.py --device cuda:1 --port 30000
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_serve_arguments(parser, host="0.0.0.0")
    parser.add_argument("--device", default="cuda:0", help="this engine's GPU (cuda:N)")
    args = parser.parse_args()
    if not args.device.startswith("cuda"):
        raise ex.ExampleError(f"--device {args.device}: an NCCL weight-update group needs the "
                              "engine's weights on a GPU (cuda:N)")
    if os.environ.get("NCCL_NVLS_ENABLE", "0") != "0":
        print("engine: NCCL_NVLS_ENABLE overridden: ferry serve runs with NCCL_NVLS_ENABLE=0",
              file=sys.stderr)
    ex.exec_serve(args, ["--device", args.device], env={"NCCL_NVLS_ENABLE": "0"})


if __name__ == "__main__":
    ex.run_main(main)

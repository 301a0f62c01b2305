#!/usr/bin/env python3
"""examples/ucx/trainer.py: the trainer node of the cross-node form: trains a small model
and, right after every optimizer step, pushes its state_dict with ferry.Sender to every engine
(`ferry serve` on other nodes, examples/ucx/engine.py) over UCX; then checks that each engine
committed the step and holds the trainer's values. Exits 1 naming the engine and the reason when
a push does not commit.

    python3 examples/ucx/trainer.py --engines 10.0.0.5:30000,10.0.0.6:30000 --steps 5
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402


def main():
    parser = ex.argument_parser(__doc__)
    ex.add_engines_argument(parser)
    parser.add_argument("--transport", choices=["ucx", "inline", "auto"], default="ucx",
                        help="ucx (default); inline: bytes on the session socket, no UCX; "
                             "auto: ucx when its plugin loads, else inline")
    parser.add_argument("--connect-timeout", type=float, default=30,
                        help="seconds to reach each engine (30)")
    ex.add_trainer_arguments(parser, device="cpu")
    args = parser.parse_args()
    engines = ex.engines_of(parser, args)

    torch = ex.import_torch()
    ferry = ex.import_ferry()
    device = ex.torch_device(torch, args.device)
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    urls = {e: ex.base_url(e) for e in engines}
    base = ex.first_version(urls.values(), args.token) - 1

    with ferry.Sender(engines, transport=args.transport, token=args.token,
                      connect_timeout=args.connect_timeout) as sender:
        for step in range(1, args.steps + 1):
            loss = ex.train_step(torch, model, optimizer, step)
            label = f"step-{step}"
            t0 = time.perf_counter()
            # Right after optimizer.step(): ferry waits for the queued kernels itself.
            report = sender.push(model.state_dict(), version=base + step, label=label,
                                 check=False)
            wall = time.perf_counter() - t0
            print(f"step {step}: loss {loss:.4f}, pushed {report.bytes / 1e6:.2f} MB to "
                  f"{len(engines)} engine(s) in {wall:.3f} s", flush=True)
            failed = [r for r in report.receivers if not r.committed]
            for r in report.receivers:
                state = (f"committed via {r.transport}" if r.committed
                         else f"did NOT commit: {r.error}")
                print(f"  {r.address}: {state}", flush=True)
            if failed:
                raise ex.ExampleError(f"step {step}: {len(failed)} of {len(engines)} engine(s) "
                                      "did not commit (they keep their previous version)")
            for engine, url in urls.items():
                ex.require_serves(engine, url, model.state_dict(), label, step, args.token)
            print(f"  every engine serves {label}; values read back match", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)

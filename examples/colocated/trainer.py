#!/usr/bin/env python3
"""examples/colocated/trainer.py: the trainer of the colocated form (one GPU, two processes):
for every step it asks the engine (examples/colocated/engine.py) to release its KV cache,
trains, pushes model.state_dict() with ferry.Sender right after optimizer.step() (CUDA IPC:
the engine's parameters are on this host's GPU), asks the engine to resume, and checks that the
engine committed the step, holds the trainer's values and generates what the trainer's own
model generates. --model llama (the engine's too) trains a transformers LlamaForCausalLM with
AdamW and pushes its state_dict() the same way.

    python3 examples/colocated/trainer.py --engine 127.0.0.1:30000 \\
        --engine-control 127.0.0.1:30001 --device cuda:0 --steps 5
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402

PROMPT = [1, 7, 42, 99, 3, 250, 18, 5]


def main():
    parser = ex.argument_parser(__doc__)
    parser.add_argument("--engine", required=True,
                        help="HOST:PORT of the engine's embedded receiver (its --port)")
    parser.add_argument("--engine-control", required=True,
                        help="HOST:PORT of the engine's own control server (its --control-port)")
    parser.add_argument("--transport", default="auto",
                        help="auto (default: cuda_ipc for GPU tensors and an engine on this "
                             "host), cuda_ipc, ucx or inline")
    ex.add_trainer_arguments(parser, device="cuda:0", token=False, models=ex.MODELS)
    args = parser.parse_args()

    torch = ex.import_torch()
    ferry = ex.import_ferry()
    device = ex.torch_device(torch, args.device)
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    receiver_url = ex.base_url(args.engine)
    control_url = ex.base_url(args.engine_control)
    prompt = [t % args.vocab for t in PROMPT]
    base = ex.first_version([receiver_url]) - 1

    with ferry.Sender([args.engine], transport=args.transport) as sender:
        for step in range(1, args.steps + 1):
            released = ex.post(control_url, "/release_memory_occupation")
            if step == 1 and "freed_bytes" in released:  # GPU memory the trainer can now use
                print(f"the engine gave back {released['freed_bytes'] / 2**20:.0f} MiB of GPU "
                      "memory for training", flush=True)
            loss = ex.train_step(torch, model, optimizer, step)
            label = f"step-{step}"
            t0 = time.perf_counter()
            # Right after optimizer.step(), no torch.cuda.synchronize(): ferry reads each tensor
            # only after the work queued on torch's current stream.
            report = sender.push(model.state_dict(), version=base + step, label=label,
                                 check=False)
            wall = time.perf_counter() - t0
            ex.post(control_url, "/resume_memory_occupation")
            r = report.receivers[0]
            if not r.committed:
                raise ex.ExampleError(f"step {step}: the engine did not commit: {r.error}")
            how = "direct into its parameters" if r.direct else "through staging slots"
            print(f"step {step}: loss {loss:.4f}, {report.bytes / 1e6:.2f} MB committed via "
                  f"{r.transport} ({how}) in {wall:.3f} s", flush=True)
            if device.type == "cuda" and r.transport != "cuda_ipc":
                print(f"  warning: GPU tensors went through {r.transport}, not cuda_ipc: is the "
                      "engine on another host, or its parameters not on a GPU?", flush=True)
            ex.require_arrived(args.engine, receiver_url, model.state_dict(), step)
            ex.require_same_tokens(torch, control_url, model, prompt, label, step)
            print(f"  the engine serves {label}: values read back and its greedy tokens match "
                  "the trainer's", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)

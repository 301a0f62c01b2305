#!/usr/bin/env python3
"""examples/ckpt_engine/trainer.py: the trainer of the checkpoint-engine form: after every
optimizer step it registers model.state_dict() with an unmodified checkpoint-engine
ParameterServer (0.4.2, world size 1, on the engine's GPU) and runs ps.update(), whose req_func
posts /update_weights_from_ipc to the engine (examples/ckpt_engine/engine.py); then checks that
the engine committed the step and holds the trainer's values.

    python3 examples/ckpt_engine/trainer.py --write-initial ckpt/initial   # once, for the engine
    python3 examples/ckpt_engine/trainer.py --engine 127.0.0.1:30000 --device cuda:0 --steps 5
"""

import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import example_common as ex  # noqa: E402


def write_initial(torch, args, folder):
    """The model's initial weights as a safetensors checkpoint (what the engine loads first)."""
    try:
        from safetensors.torch import save_file
    except ImportError as e:
        raise ex.ExampleError(f"safetensors is not importable ({e}): pip install safetensors") \
            from None
    model = ex.build_model(torch, args, torch.device("cpu"))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    print(f"wrote {path}: {len(model.state_dict())} tensors; start the engine with "
          f"--model-path {folder}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = ex.argument_parser(__doc__)
    parser.add_argument("--write-initial", metavar="FOLDER",
                        help="write the initial weights (step 0) there for the engine, and exit")
    parser.add_argument("--engine", help="HOST:PORT of the engine's control API (this node)")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds the engine waits for any one message (120)")
    ex.add_trainer_arguments(parser, device="cuda:0")  # the ParameterServer's GPU: the engine's
    args = parser.parse_args()
    torch = ex.import_torch()
    if args.write_initial:
        write_initial(torch, args, args.write_initial)
        return 0
    if not args.engine:
        parser.error("--engine is required (or --write-initial FOLDER)")

    device = ex.torch_device(torch, args.device)
    if device.type != "cuda":
        raise ex.ExampleError(f"--device {args.device}: the ParameterServer shares its buffer "
                              "by CUDA IPC: it needs the engine's GPU (cuda:N)")
    torch.cuda.set_device(device)
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):
        os.environ.setdefault(key, value)  # world size 1 unless launched by torchrun
    try:
        from checkpoint_engine.ps import ParameterServer
    except ImportError as e:
        raise ex.ExampleError(f"checkpoint-engine is not importable ({e}): pip install "
                              "checkpoint-engine==0.4.2") from None
    url = ex.base_url(args.engine)
    status, info = ex.http_json(f"{url}/get_model_info", token=args.token)
    if status != 200 or not info.get("num_parameters"):
        raise ex.ExampleError(f"{url} has no model loaded ({status} {info}): start the engine "
                              "with --model-path (the checkpoint-engine form needs one)")
    model = ex.build_model(torch, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ps = ParameterServer(auto_pg=True)
    previous = None
    for step in range(1, args.steps + 1):
        loss = ex.train_step(torch, model, optimizer, step)
        name = f"step-{step}"
        ps.register_checkpoint(name, named_tensors={k: v.detach().cpu()
                                                    for k, v in model.state_dict().items()})
        ps.gather_metas(name)
        answer = {}

        def req_func(socket_paths, name=name, answer=answer):
            # Blocks until the engine committed (or refused) the update ps.update streams.
            answer["reply"] = ex.http_json(
                f"{url}/update_weights_from_ipc",
                {"zmq_handles": dict(socket_paths), "weight_version": name,
                 "timeout_s": args.timeout}, token=args.token, timeout=args.timeout + 60)

        ps.update(name, req_func)
        status, reply = answer.get("reply", (None, {"message": "req_func was not called"}))
        if status != 200:
            raise ex.ExampleError(f"step {step}: the engine refused the update ({status}): "
                                  f"{reply.get('message')}")
        if previous:
            ps.unregister_checkpoint(previous)
        previous = name
        ex.require_arrived(args.engine, url, model.state_dict(), step, args.token)
        print(f"step {step}: loss {loss:.4f}, the engine committed {name} "
              f"({reply.get('bytes', 0) / 1e6:.2f} MB in {reply.get('seconds', 0):.3f} s); "
              "values read back match", flush=True)
    ex.save_state(torch, args.save, model)
    return 0


if __name__ == "__main__":
    ex.run_main(main)
